"""GPU architectures as one type, :class:`Arch`, whichever way they are written.

torch and TORCH_CUDA_ARCH_LIST write "8.6", "9.0a" (arch-specific) and "10.0f" (family, nvcc
>= 12.9); a GPU reports its compute capability as "9.0"; nvcc and cuobjdump name targets
"sm_90a" (SASS) and "compute_90" (PTX). The minor is one digit, so "sm_120" is 12.0.
Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Tuple

# One TORCH_CUDA_ARCH_LIST entry: M.m, an optional a/f suffix, an optional +PTX.
ENTRY_RE = re.compile(r"^(?P<major>\d{1,2})\.(?P<minor>\d)(?P<suffix>[af]?)(?P<ptx>\+PTX)?$", re.IGNORECASE)
_TARGET_RE = re.compile(r"^(?:sm|compute)_(?P<number>\d{2,3})(?P<suffix>[af]?)$")


@dataclass(frozen=True)
class Arch:
    major: int
    minor: int
    suffix: str = ""  # "", "a" (arch-specific) or "f" (family)

    @classmethod
    def parse(cls, text: str) -> Arch:
        """An architecture as torch writes it ("9.0", "9.0a", "10.0f")."""
        m = ENTRY_RE.match(text.strip())
        if not m or m.group("ptx"):
            raise ValueError(f"architecture must look like '9.0', '9.0a' or '10.0f', got {text!r}")
        return cls(int(m.group("major")), int(m.group("minor")), m.group("suffix").lower())

    @classmethod
    def capability(cls, text: str) -> Arch:
        """A GPU's compute capability, "9.0" or "90"."""
        digits = text.replace(".", "")
        if not digits.isdigit() or len(digits) < 2:
            raise ValueError(f"compute capability must look like '9.0' or '90', got {digits!r}")
        return cls(int(digits[:-1]), int(digits[-1]))

    @classmethod
    def target(cls, name: str) -> Arch:
        """A compiled target as nvcc names it: SASS "sm_90a" or PTX "compute_90"."""
        m = _TARGET_RE.match(name)
        if not m:
            raise ValueError(f"a CUDA target must look like 'sm_90', 'sm_90a' or 'compute_90', got {name!r}")
        number = m.group("number")
        return cls(int(number[:-1]), int(number[-1]), m.group("suffix"))

    @property
    def number(self) -> str:  # "90a"
        return f"{self.major}{self.minor}{self.suffix}"

    @property
    def sass_name(self) -> str:  # "sm_90a"
        return f"sm_{self.number}"

    @property
    def ptx_name(self) -> str:  # "compute_90"
        return f"compute_{self.number}"

    @property
    def key(self) -> Tuple[int, int, str]:
        return (self.major, self.minor, self.suffix)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"
