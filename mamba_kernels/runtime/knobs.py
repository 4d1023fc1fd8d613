"""Environment knobs (``MAMBA_KERNELS_*``) and how their values are parsed.

Booleans accept 1/0, true/false, yes/no, on/off in any case; anything else is an
error naming the variable, so a typo never silently turns a feature off.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional, Tuple

from ..facts import variant

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

BACKEND_VAR = "MAMBA_KERNELS_BACKEND"
BACKENDS = ("auto", "cuda", "reference")
BINDING_VAR = "MAMBA_KERNELS_BINDING"
BINDINGS = ("auto", variant.STABLE, variant.CLASSIC)
MAMBA2_CUDA_VAR = "MAMBA_KERNELS_MAMBA2_CUDA"
SCAN_STATES_VAR = "MAMBA_KERNELS_SCAN_STATES"
KEEP, RECOMPUTE = "keep", "recompute"
SCAN_STATES = (KEEP, RECOMPUTE)  # what a scan does; the knob also takes "auto", each API's own default
SCAN_STATES_CHOICES = ("auto",) + SCAN_STATES


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


def mamba2_cuda(environ: Optional[Mapping[str, str]] = None) -> bool:
    """``MAMBA_KERNELS_MAMBA2_CUDA`` (default off): whether the Mamba-2 ops (the SSD scan of
    ``selective_scan.ssd_combined``, the gated norm of ``selective_scan.layernorm_gated``) may
    run their compiled kernels on CUDA tensors. Off until those kernels have passed their GPU
    tests on a GPU (docs/KERNELS.md); their PyTorch path runs on CUDA tensors meanwhile."""
    return env_bool(MAMBA2_CUDA_VAR, False, environ)
