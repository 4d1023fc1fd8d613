"""Version keys: the one way this project orders and compares torch, CUDA and Python versions.

A version is written as dotted numbers ("2.14", "12.8", "3.10"); :func:`key` turns it into a
tuple that compares as the numbers do ("2.9" < "2.10"). A release line is its major.minor
(:func:`minor`), read from any version torch or nvcc prints ("2.8.0a0+5228986c.nv25.06").
Standard library only.
"""

from __future__ import annotations

from typing import Tuple


def key(version: str) -> Tuple[int, ...]:
    """The numeric key of a dotted version (``"12.8.1"`` -> (12, 8, 1))."""
    return tuple(int(x) for x in version.split("."))


def minor(version: str, what: str = "torch") -> str:
    """The release line "M.m" of a version ("2.14.1+cu130", "2.8.0a0+5228986c.nv25.06", "13.0")."""
    parts = version.split("+")[0].split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ValueError(f"{what} must look like 'M.m' or 'M.m.p', got {version!r}")
    return f"{int(parts[0])}.{int(parts[1])}"


def minor_key(version: str, what: str = "torch") -> Tuple[int, int]:
    """The (major, minor) key of a version's release line (``"2.14.1+cu130"`` -> (2, 14))."""
    major, mi = minor(version, what).split(".")
    return int(major), int(mi)
