"""Backend dispatch: the one place that decides between the compiled kernel and PyTorch.

Each kernel family (``causal_conv1d``, ``selective_scan``) has one optional compiled
extension module. It is used when it imported, its build metadata matches the running
torch, and the tensors are on CUDA; otherwise the pure-PyTorch path runs.
``MAMBA_KERNELS_BACKEND`` chooses: ``auto`` (default) falls back and warns once per
kernel for CUDA tensors; ``cuda`` makes a missing or mismatched extension an error;
``reference`` always runs PyTorch.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Dict, Optional

from . import buildinfo, knobs

# kernel family -> import name of its compiled extension
EXTENSIONS: Dict[str, str] = {
    "causal_conv1d": "causal_conv1d._cuda",
    "selective_scan": "selective_scan._cuda",
}

FIX_HINT = (
    "install the wheel built for your torch and CUDA (see `python -m mamba_kernels info`), "
    "or build it from source with `MAMBA_KERNELS_FORCE_BUILD=1 pip install --no-build-isolation "
    "--no-deps --force-reinstall mamba-kernels`"
)


@dataclass(frozen=True)
class ExtensionStatus:
    module: Optional[ModuleType]
    reason: str  # why the module is usable, or why not


# A hook the build-metadata guard registers: given the imported module, return None when
# it matches the running torch, else a sentence saying what it was built for and what runs.
# buildinfo.check_module compares the compiled-in BUILD_INFO with the running torch.
_metadata_checks: list = [buildinfo.check_module]
_status: Dict[str, ExtensionStatus] = {}
_warned: set = set()
_lock = threading.Lock()


def _with_fix(reason: str) -> str:
    """The reason plus the generic fix, unless the reason already names a specific one."""
    return reason if "Fix:" in reason else f"{reason}. Fix: {FIX_HINT}"


def register_metadata_check(check: Callable[[ModuleType], Optional[str]]) -> None:
    _metadata_checks.append(check)
    _status.clear()


def _load(kernel: str) -> ExtensionStatus:
    name = EXTENSIONS[kernel]
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            return ExtensionStatus(None, f"{name} failed to import: {e}")
        return ExtensionStatus(None, f"the compiled extension {name} is not part of this install")
    except (ImportError, OSError) as e:  # undefined symbol, missing libcudart, ...
        return ExtensionStatus(None, f"{name} failed to load: {e}")
    for check in _metadata_checks:
        problem = check(module)
        if problem:
            return ExtensionStatus(None, problem)
    return ExtensionStatus(module, f"{name} loaded and matches the running torch")


def extension_status(kernel: str) -> ExtensionStatus:
    """Import the kernel's extension once and remember the outcome."""
    status = _status.get(kernel)  # every call but the first: no lock (a dict read is atomic)
    if status is not None:
        return status
    if kernel not in EXTENSIONS:
        raise ValueError(f"kernel must be one of {sorted(EXTENSIONS)}, got {kernel!r}")
    with _lock:
        if kernel not in _status:
            _status[kernel] = _load(kernel)
        return _status[kernel]


def _decide(kernel: str, device_type: str) -> bool:
    """Whether to run ``kernel`` compiled for tensors on ``device_type``.

    Raises RuntimeError in ``cuda`` mode when the compiled path cannot run.
    """
    mode = knobs.backend_mode()
    if mode == "reference":
        return False
    status = extension_status(kernel)
    if mode == "cuda":
        if status.module is None:
            raise RuntimeError(
                f"{knobs.BACKEND_VAR}=cuda but the {kernel} CUDA kernel is unavailable: "
                f"{_with_fix(status.reason)}; or unset {knobs.BACKEND_VAR} to allow "
                "the PyTorch fallback."
            )
        if device_type != "cuda":
            raise RuntimeError(
                f"{knobs.BACKEND_VAR}=cuda but the tensors are on {device_type!r}: the {kernel} "
                "CUDA kernel needs CUDA tensors. Move them with .cuda(), or unset "
                f"{knobs.BACKEND_VAR}."
            )
        return True
    if device_type != "cuda":
        return False
    if status.module is not None:
        return True
    if kernel not in _warned:
        _warned.add(kernel)
        warnings.warn(
            f"mamba_kernels: running {kernel} on CUDA tensors with the slower PyTorch "
            f"implementation because {_with_fix(status.reason)}. "
            f"Set {knobs.BACKEND_VAR}=reference to silence this or =cuda to make it an error.",
            RuntimeWarning,
            stacklevel=3,
        )
    return False


def _opaque_to_torch_compile(fn: Callable[[str, str], bool]) -> Callable[[str, str], bool]:
    """torch.compile must not trace the decision (a lock, an import, a warning would each
    break the graph): it runs eagerly at trace time and enters the graph as a constant."""
    try:
        from torch._dynamo import assume_constant_result
    except ImportError:  # no torch, or a torch without dynamo: nothing traces us
        return fn
    return assume_constant_result(fn)


use_cuda = _opaque_to_torch_compile(_decide)


def backends() -> Dict[str, Dict[str, str]]:
    """Per kernel: the backend CUDA tensors would get now, and why."""
    mode = knobs.backend_mode()
    report: Dict[str, Dict[str, str]] = {}
    for kernel in EXTENSIONS:
        if mode == "reference":
            report[kernel] = {
                "backend": "reference",
                "reason": f"{knobs.BACKEND_VAR}=reference forces the PyTorch implementation",
            }
            continue
        status = extension_status(kernel)
        if status.module is not None:
            report[kernel] = {"backend": "cuda", "reason": status.reason}
        elif mode == "cuda":
            report[kernel] = {"backend": "error", "reason": f"{status.reason} ({knobs.BACKEND_VAR}=cuda)"}
        else:
            report[kernel] = {"backend": "reference", "reason": status.reason}
    return report
