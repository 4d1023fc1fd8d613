"""Environment knobs (``MAMBA_KERNELS_*``): the registry and how their values are parsed.

The records (name, kind, default, one-line doc, audience) are ``facts/knob_table.py``'s, which
says why they sit a floor below; this module re-exports them (``KNOBS``, ``BY_NAME``, ``Knob``)
with a ``*_VAR`` name for each, and every module above ``facts`` takes a knob's name and its
parsing from here.

Booleans accept 1/0, true/false, yes/no, on/off in any case; anything else is an
error naming the variable, so a typo never silently turns a feature off.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional, Tuple

from ..facts import knob_table
from ..facts.knob_table import BY_NAME, KNOBS, Knob  # noqa: F401  (re-exported: the registry)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

# runtime
BACKEND_VAR = knob_table.BACKEND.name
BACKENDS = knob_table.BACKEND.values
SCAN_STATES_VAR = knob_table.SCAN_STATES.name
MAMBA2_CUDA_VAR = knob_table.MAMBA2_CUDA.name
# read by the extensions themselves (csrc/common/device_info.h), set by GPU tests
SM_COUNT_VAR = knob_table.SM_COUNT.name
SCAN_STATES_CHOICES = knob_table.SCAN_STATES.values
SCAN_STATES = SCAN_STATES_CHOICES[1:]  # what a scan does; the knob also takes "auto", each API's own default
KEEP, RECOMPUTE = SCAN_STATES
# install
INDEX_VAR = knob_table.INDEX.name
INDEX_TIMEOUT_VAR = knob_table.INDEX_TIMEOUT.name
TARGET_PYTHON_VAR = knob_table.TARGET_PYTHON.name
# build
FORCE_BUILD_VAR = knob_table.FORCE_BUILD.name
SKIP_BUILD_VAR = knob_table.SKIP_CUDA_BUILD.name
FORCE_CXX11_ABI_VAR = knob_table.FORCE_CXX11_ABI.name
RELEASE_VAR = knob_table.RELEASE.name
BINDING_VAR = knob_table.BINDING.name
BINDINGS = knob_table.BINDING.values
FROM_SDIST_VAR = knob_table.BUILD_FROM_SDIST.name
ARCH_LIST_VAR = knob_table.TORCH_CUDA_ARCH_LIST.name
MAX_JOBS_VAR = knob_table.MAX_JOBS.name
NVCC_THREADS_VAR = knob_table.NVCC_THREADS.name
BUILD_INFO_MACRO = knob_table.BUILD_INFO_MACRO  # no knob: the C macro of the build's header
# CI
CI_CELL_VAR = knob_table.CI_CELL.name
CI_MSVC_TOOLSET_VAR = knob_table.CI_MSVC_TOOLSET.name
TORCH_DIR_VAR = knob_table.TORCH_DIR.name


# os.environ.get raises and catches a KeyError inside Mapping.get when the variable is unset (the
# usual case for these knobs): about a microsecond a read, and the kernels' entry points read a
# knob or two on every call. os._Environ keeps the variables in a dict, keyed by encodekey(name),
# that every write through os.environ updates; one lookup there is the same read, without the
# exception. Where os.environ is not that class (or was replaced), .get is used.
_ENVIRON = os.environ
_STORE = getattr(_ENVIRON, "_data", None)
_ENCODE_KEY = getattr(_ENVIRON, "encodekey", None)
_DECODE_VALUE = getattr(_ENVIRON, "decodevalue", None)
_FAST = isinstance(_STORE, dict) and callable(_ENCODE_KEY) and callable(_DECODE_VALUE)
_KEYS: dict = {}  # knob name -> its key in _STORE


def getenv(name: str) -> Optional[str]:
    """``os.environ.get(name)``, cheaper when the variable is unset."""
    if not _FAST or os.environ is not _ENVIRON:
        return os.environ.get(name)
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = _ENCODE_KEY(name)
    raw = _STORE.get(key)
    return None if raw is None else _DECODE_VALUE(raw)


def _raw(name: str, environ: Optional[Mapping[str, str]]) -> str:
    value = getenv(name) if environ is None else environ.get(name)
    return "" if value is None else value


def parse_bool(name: str, value: str) -> bool:
    """Parse a boolean knob value; raise ValueError naming the knob for anything unknown."""
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(
        f"{name}={value!r} is not a boolean: use one of 1/0, true/false, yes/no, on/off"
    )


def env_bool(name: str, default: bool = False, environ: Optional[Mapping[str, str]] = None) -> bool:
    """Read a boolean knob; unset or empty means ``default``."""
    raw = _raw(name, environ)
    if raw.strip() == "":
        return default
    return parse_bool(name, raw)


def env_positive_int(name: str, environ: Mapping[str, str]) -> Optional[int]:
    """A number knob that counts something: unset or empty is None; anything but a positive integer
    is an error naming the variable."""
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name}={environ[name]!r} must be a positive integer")
    return int(raw)


def env_choice(name: str, choices: Tuple[str, ...], what: str, hint: str = "",
               environ: Optional[Mapping[str, str]] = None) -> str:
    """A knob with a fixed set of values (the first is the default when unset or empty); anything
    else is an error naming the variable, the value and the choices (plus ``hint``)."""
    given = _raw(name, environ)
    raw = given.strip().lower()
    if raw == "":
        return choices[0]
    if raw not in choices:
        raise ValueError(f"{name}={given!r} is not {what}: use one of {', '.join(choices)}{hint}")
    return raw


def backend_mode(environ: Optional[Mapping[str, str]] = None) -> str:
    """``MAMBA_KERNELS_BACKEND``: auto (default), cuda or reference."""
    return env_choice(BACKEND_VAR, BACKENDS, "a backend", environ=environ)


def binding_choice(environ: Optional[Mapping[str, str]] = None) -> str:
    """``MAMBA_KERNELS_BINDING`` (a build knob): auto (default: the stable-ABI binding when the
    build torch has it, else the classic one), stable or classic."""
    hint = " (auto: stable when the build torch is at least the stable ABI's target, else classic)"
    return env_choice(BINDING_VAR, BINDINGS, "a binding", hint, environ)


def scan_states(environ: Optional[Mapping[str, str]] = None) -> str:
    """``MAMBA_KERNELS_SCAN_STATES`` as set: what a selective scan keeps between its forward and
    its backward. keep: its states every 64 steps (and the ungated output with z), so the
    backward starts from them; recompute: the original's share, a state every 1024 steps (and
    y where needed) from which the backward kernel recomputes the rest, or, for complex A or
    dstate > 16, nothing, and the backward runs the forward scan again;
    auto (default): each API's own choice (``scan_states_for``)."""
    what = "a way to hold the scan's states"
    return env_choice(SCAN_STATES_VAR, SCAN_STATES_CHOICES, what, environ=environ)


def scan_states_for(auto: str, environ: Optional[Mapping[str, str]] = None) -> str:
    """What one API does (keep or recompute): the knob's value, or ``auto`` when it is auto.
    selective_scan_fn keeps (its states are half the size of u in bf16, and they save the
    backward a forward scan); mamba_inner_fn and the compatibility module recompute, so a layer
    holds no more than under the original kernels."""
    form = scan_states(environ)
    return auto if form == "auto" else form


_MAMBA2_CUDA_DEFAULT = parse_bool(MAMBA2_CUDA_VAR, knob_table.MAMBA2_CUDA.default or "1")


def mamba2_cuda(environ: Optional[Mapping[str, str]] = None) -> bool:
    """``MAMBA_KERNELS_MAMBA2_CUDA`` (default on): whether the Mamba-2 ops (the SSD scan of
    ``selective_scan.ssd_combined``, the gated norm of ``selective_scan.layernorm_gated``) may
    run their compiled kernels on CUDA tensors; off, CUDA tensors take the PyTorch path (the
    way back while the kernels are new: docs/KERNELS.md)."""
    return env_bool(MAMBA2_CUDA_VAR, _MAMBA2_CUDA_DEFAULT, environ)
