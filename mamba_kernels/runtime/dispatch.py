"""Backend dispatch: the one place that decides between the compiled kernel and PyTorch.

Each kernel family (``causal_conv1d``, ``selective_scan``) has one optional compiled
extension module. It is used when it imported, its build metadata matches the running
torch and this package's version, the tensors are on CUDA, and the GPU is one the binary
holds code for (checked once, at the first use with CUDA tensors); otherwise the
pure-PyTorch path runs. In ``auto`` mode tensors off CUDA never import the extension.
Whatever the import raises is caught and explained: a binary the loader refuses (a missing
``libc10_cuda.so``, an ``undefined symbol``) is described by the BUILD_INFO read from its
file's bytes, with the one command that fixes it.
``MAMBA_KERNELS_BACKEND`` chooses: ``auto`` (default) falls back and warns once per
kernel for CUDA tensors; ``cuda`` makes a missing or mismatched extension an error;
``reference`` always runs PyTorch.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import threading
import warnings
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Callable, Dict, Optional, Tuple

from ..facts.version import __version__
from . import buildinfo, install_record, knobs

# kernel family -> import name of its compiled extension
EXTENSIONS: Dict[str, str] = {
    "causal_conv1d": "causal_conv1d._cuda",
    "selective_scan": "selective_scan._cuda",
}

FIX_HINT = (
    "install the wheel built for your torch and CUDA (see `python -m mamba_kernels info`), "
    f"or build it from source with `{knobs.FORCE_BUILD_VAR}=1 pip install --no-build-isolation "
    "--no-deps --force-reinstall mamba-kernels`"
)


@dataclass(frozen=True)
class ExtensionStatus:
    module: Optional[ModuleType]
    reason: str  # why the module is usable, or why not
    # Set at the first use with CUDA tensors, after every visible GPU was checked against the
    # binary's architectures: ``cuda_ready`` (all of them run it) is all the hot path reads;
    # ``bad_gpus`` holds (device index, why not) for the GPUs that cannot run it.
    gpus_checked: bool = False
    cuda_ready: bool = False
    bad_gpus: Tuple[Tuple[int, str], ...] = ()


# A hook the build-metadata guard registers: given the imported module, return None when
# it matches the running torch, else a sentence saying what it was built for and what runs.
# buildinfo.check_module compares the compiled-in BUILD_INFO with the running torch.
_metadata_checks: list = [buildinfo.check_module]
_status: Dict[str, ExtensionStatus] = {}
_warned: set = set()
_lock = threading.Lock()


def _running_fix() -> str:
    """The one command that gets a binary for the running torch (the generic hint when even
    that cannot be worked out)."""
    try:
        return buildinfo.fix_command(*buildinfo.running(), __version__)
    except Exception:
        return FIX_HINT


def _with_fix(reason: str) -> str:
    """The reason plus the fix for the running torch, unless the reason already names one."""
    return reason if "Fix:" in reason else f"{reason}. Fix: {_running_fix()}"


def register_metadata_check(check: Callable[[ModuleType], Optional[str]]) -> None:
    _metadata_checks.append(check)
    _status.clear()


def _extension_file(name: str) -> Optional[str]:
    """The compiled file the import system would load for ``name``, found without loading it."""
    try:
        spec = importlib.util.find_spec(name)
    except (Exception, SystemExit):  # its package fails to import as well
        return None
    if spec is None or not spec.has_location or not spec.origin:
        return None
    return spec.origin if spec.origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)) else None


def _package_dir(name: str) -> Optional[str]:
    """The directory of the package holding the extension ``name``, found without importing it."""
    try:
        spec = importlib.util.find_spec(name.rsplit(".", 1)[0])
    except (Exception, SystemExit):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return locations[0] if locations else None


def _explain(name: str, error: BaseException) -> str:
    try:
        return buildinfo.explain_load_failure(name, error, _extension_file(name))
    except Exception as e:  # the explanation must never be what breaks
        return f"{name} failed to load ({type(error).__name__}: {error}; explaining it failed: {e!r})"


def _load(kernel: str) -> ExtensionStatus:
    """Import the extension and check its metadata. Never raises: whatever the import does
    (undefined symbol, missing library, a RuntimeError from its init, SystemExit) becomes the
    reason it is unavailable; only KeyboardInterrupt passes."""
    name = EXTENSIONS[kernel]
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            return ExtensionStatus(None, _explain(name, e))
        refusal = buildinfo.abi3_refusal(name, _package_dir(name))  # free-threaded: abi3 is skipped
        if refusal:
            return ExtensionStatus(None, refusal)
        return ExtensionStatus(None, f"the compiled extension {name} is not part of this install")
    except (Exception, SystemExit) as e:  # undefined symbol, missing libc10_cuda.so, ...
        return ExtensionStatus(None, _explain(name, e))
    for check in _metadata_checks:
        try:
            problem = check(module)
        except Exception as e:
            problem = f"checking the build metadata of {name} failed ({type(e).__name__}: {e})"
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


def _check_gpus(kernel: str, status: ExtensionStatus) -> ExtensionStatus:
    """``status`` after checking every visible GPU against the binary's SASS/PTX (run once,
    at the first use with CUDA tensors, so CUDA is initialised already). No GPU can run it:
    the extension is unavailable, with the reason. Some cannot: they are listed."""
    text = getattr(status.module, "BUILD_INFO", None)
    try:
        info = buildinfo.parse(text) if isinstance(text, str) else None
    except ValueError:
        info = None  # the metadata check judged it; nothing to compare the GPUs with
    if info is None or not (info.sass or info.ptx):
        return replace(status, gpus_checked=True, cuda_ready=True)
    # optional: importing the package never imports torch
    import torch

    name = EXTENSIONS[kernel]
    bad: Dict[int, str] = {}
    try:
        count = torch.cuda.device_count()
        for d in range(count):
            cap = "{}.{}".format(*torch.cuda.get_device_capability(d))
            problem = buildinfo.arch_problem(name, info, f"GPU cuda:{d} ({_gpu_name(d)})", cap)
            if problem:
                bad[d] = problem
    except Exception:  # the GPUs cannot be asked: trust the binary, as without this check
        return replace(status, gpus_checked=True, cuda_ready=True)
    if bad and len(bad) == count:
        return ExtensionStatus(None, bad[min(bad)], gpus_checked=True)
    return replace(status, gpus_checked=True, cuda_ready=not bad, bad_gpus=tuple(sorted(bad.items())))


def ready_module(kernel: str) -> Optional[ModuleType]:
    """The loaded extension of ``kernel`` once its first CUDA use has checked it and every
    visible GPU runs it, else None (not used yet on CUDA, unavailable, or some GPU cannot run it)."""
    status = _status.get(kernel)
    return status.module if status is not None and status.cuda_ready else None


def _gpu_name(device: int) -> str:
    # optional: importing the package never imports torch
    import torch

    try:
        return torch.cuda.get_device_name(device)
    except Exception:
        return "name unknown"


def _gpu_problem(kernel: str, status: ExtensionStatus) -> Optional[str]:
    """None when the loaded extension runs on the current GPU, else why not."""
    if not status.gpus_checked:
        with _lock:
            current = _status.get(kernel, status)
            if not current.gpus_checked:
                current = _status[kernel] = _check_gpus(kernel, current)
            status = current
    if status.module is None:
        return status.reason
    if status.cuda_ready:
        return None
    import torch  # some GPUs cannot run it: ask which one is current (only on such machines)

    return dict(status.bad_gpus).get(torch.cuda.current_device())


def _decide(kernel: str, device_type: str) -> bool:
    """Whether to run ``kernel`` compiled for tensors on ``device_type``.

    Raises RuntimeError in ``cuda`` mode when the compiled path cannot run.
    """
    mode = knobs.backend_mode()
    if mode == "reference":
        return False
    if device_type == "cuda":
        status = _status.get(kernel)  # the hot path: one dict read once the checks passed
        if status is not None and status.cuda_ready:
            return True
    elif mode != "cuda":
        return False  # auto mode and no CUDA tensors: the extension is not even imported
    return _decide_first(kernel, device_type, mode)


def _decide_first(kernel: str, device_type: str, mode: str) -> bool:
    """The rest of ``_decide``: the first CUDA use (import, metadata and GPU checks), the
    fallback and its one warning, and the ``cuda`` mode errors."""
    status = extension_status(kernel)
    why = None if status.module is not None else _with_fix(status.reason)
    if why is None and device_type == "cuda":
        why = _gpu_problem(kernel, status)
    if mode == "cuda":
        if why is not None:
            raise RuntimeError(
                f"{knobs.BACKEND_VAR}=cuda but the {kernel} CUDA kernel is unavailable: "
                f"{why}; or unset {knobs.BACKEND_VAR} to allow the PyTorch fallback."
            )
        if device_type != "cuda":
            raise RuntimeError(
                f"{knobs.BACKEND_VAR}=cuda but the tensors are on {device_type!r}: the {kernel} "
                "CUDA kernel needs CUDA tensors. Move them with .cuda(), or unset "
                f"{knobs.BACKEND_VAR}."
            )
        return True
    if why is None:
        return True
    if kernel not in _warned:
        _warned.add(kernel)
        warnings.warn(
            f"mamba_kernels: running {kernel} on CUDA tensors with the slower PyTorch "
            f"implementation because {why}. "
            f"Set {knobs.BACKEND_VAR}=reference to silence this or =cuda to make it an error."
            f"{install_record.install_note()}",
            RuntimeWarning,
            stacklevel=4,
        )
    return False


def _opaque_to_torch_compile(fn: Callable[[str, str], bool]) -> Callable[[str, str], bool]:
    """torch.compile must not trace the decision (a lock, an import, a warning would each
    break the graph): it runs eagerly at trace time and enters the graph as a constant."""
    try:
        # optional: torch is imported at the first decision, not when this module is
        from torch._dynamo import assume_constant_result
    except ImportError:  # no torch, or a torch without dynamo: nothing traces us
        return fn
    return assume_constant_result(fn)


def __getattr__(name: str) -> Callable[[str, str], bool]:
    """``use_cuda(kernel, device_type)``: :func:`_decide` made opaque to torch.compile, built at
    its first use, so that importing this module (the package, the CLI, setup.py) never imports
    torch. torch.compile reads a missing module attribute through getattr, so a first use
    inside a traced function gets the same opaque function."""
    if name == "use_cuda":
        fn = globals()["use_cuda"] = _opaque_to_torch_compile(_decide)
        return fn
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


NO_GPU_REASON = "no GPU is visible"  # how a report's reason starts when only the GPU is missing


def backends(gpus_visible: Optional[bool] = None) -> Dict[str, Dict[str, str]]:
    """Per kernel: the backend a call gets now, and why. With ``gpus_visible`` False (the caller
    read the GPUs, e.g. through nvidia-smi, without initialising CUDA) no tensor can be on CUDA,
    so a loaded extension is reported as what it is here: ready, while the PyTorch path runs.
    None: not known; the report is for CUDA tensors."""
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
        if status.module is not None and gpus_visible is False:
            ready = f"the compiled kernel would run on a GPU ({status.reason})"
            if mode == "cuda":
                report[kernel] = {"backend": "error", "reason": (
                    f"{knobs.BACKEND_VAR}=cuda and no GPU is visible: every call raises, since its "
                    f"tensors cannot be on CUDA; {ready}")}
            else:
                report[kernel] = {"backend": "reference", "reason": (
                    f"{NO_GPU_REASON}, so tensors are on the CPU and the PyTorch implementation runs; "
                    f"{ready}")}
        elif status.module is not None:
            report[kernel] = {"backend": "cuda", "reason": status.reason}
        elif mode == "cuda":
            report[kernel] = {"backend": "error", "reason": f"{status.reason} ({knobs.BACKEND_VAR}=cuda)"}
        else:
            report[kernel] = {"backend": "reference", "reason": status.reason}
    return report
