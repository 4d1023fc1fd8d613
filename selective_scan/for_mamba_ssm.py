"""mamba_ssm on our kernels with no Triton: an explicit opt-in that serves mamba_ssm's Triton
modules from ours.

mamba_ssm imports its Triton modules when the package is imported (``import mamba_ssm`` pulls in
every model), so without Triton, or to run Mamba-2 without Triton's compile and autotune in every
new process, its ``mamba_ssm.ops.triton.*`` modules must come from somewhere else. Call
``install()`` once, before mamba_ssm (or a transformers Mamba-2 model, which looks the functions
up in mamba_ssm when its module is imported) is imported::

    from selective_scan import for_mamba_ssm
    for_mamba_ssm.install()
    import mamba_ssm                      # its Mamba-1 and Mamba-2 layers now run on our kernels

Nothing runs for anyone who does not call it: no ``.pth`` file, no import hook at package import.
It adds one finder in front of ``sys.meta_path`` that answers these names with our modules (the
same module objects; ``uninstall()`` removes the finder, modules already imported stay):

- ``mamba_ssm.ops.triton.ssd_combined``          -> ``selective_scan.ssd_combined``
- ``mamba_ssm.ops.triton.layernorm_gated``       -> ``selective_scan.layernorm_gated``
- ``mamba_ssm.ops.triton.layer_norm``            -> ``selective_scan.layer_norm``
- ``mamba_ssm.ops.triton.selective_state_update`` -> ``selective_scan.selective_state_update``

and, only when Triton cannot be imported, the modules of mamba_ssm's Mamba-3 (which has no
counterpart here) with functions that raise an error saying so when called, so that ``import
mamba_ssm`` works and Mamba-1/Mamba-2 run. Every other module (the package itself, its models,
``selective_scan_interface``) is mamba_ssm's own; ``selective_scan_cuda`` and ``causal_conv1d``
are ours already (docs/CLIENTS.md). The contracts served are mamba_ssm 2.3.2's.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Dict, List, Optional, Sequence

TRITON = "mamba_ssm.ops.triton."
# mamba_ssm's module -> ours
SERVED: Dict[str, str] = {
    TRITON + "ssd_combined": "selective_scan.ssd_combined",
    TRITON + "layernorm_gated": "selective_scan.layernorm_gated",
    TRITON + "layer_norm": "selective_scan.layer_norm",
    TRITON + "selective_state_update": "selective_scan.selective_state_update",
}
# mamba_ssm's modules that ``import mamba_ssm`` reaches but that only Triton can run (Mamba-3):
# served, when Triton is missing, by a module whose every function raises.
TRITON_ONLY = (
    TRITON + "mamba3.mamba3_siso_combined",
    TRITON + "mamba3.mamba3_mimo_rotary_step",
)

_lock = threading.Lock()


def _triton_importable() -> bool:
    if "triton" in sys.modules:
        return sys.modules["triton"] is not None
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


class _Alias(importlib.abc.Loader):
    """Loads a mamba_ssm name as one of our modules (the same object, so both names see one
    module and its state)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        pass  # executed when it was imported under our name


class _Unavailable(importlib.abc.Loader):
    """A module of mamba_ssm's Mamba-3, which runs only on Triton: any function taken from it
    raises, when called, an error saying why and what to do."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return None

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__

        def __getattr__(attr: str):  # noqa: N807  (module-level __getattr__, PEP 562)
            if attr.startswith("__"):
                raise AttributeError(attr)

            def unavailable(*_args, **_kwargs):
                raise RuntimeError(
                    f"{name}.{attr} needs Triton, which cannot be imported here; mamba-kernels serves "
                    "mamba_ssm's Mamba-1 and Mamba-2 only (selective_scan.for_mamba_ssm). Install Triton "
                    "to run Mamba-3"
                )

            unavailable.__name__ = attr
            return unavailable

        module.__getattr__ = __getattr__  # type: ignore[attr-defined]


class Finder(importlib.abc.MetaPathFinder):
    """The finder ``install`` puts first in ``sys.meta_path``."""

    def __init__(self, stand_ins: Sequence[str]) -> None:
        self.stand_ins = tuple(stand_ins)

    def find_spec(self, fullname: str, path=None, target=None) -> Optional[importlib.machinery.ModuleSpec]:
        if not fullname.startswith(TRITON):
            return None
        if fullname in SERVED:
            return importlib.util.spec_from_loader(fullname, _Alias(SERVED[fullname]))
        if fullname in self.stand_ins:
            return importlib.util.spec_from_loader(fullname, _Unavailable())
        return None


def _finder() -> Optional[Finder]:
    return next((f for f in sys.meta_path if isinstance(f, Finder)), None)


def installed() -> bool:
    """Whether ``install()`` is in effect."""
    return _finder() is not None


def _already_imported() -> List[str]:
    """mamba_ssm modules we would serve that are already imported as mamba_ssm's own."""
    out = []
    for name, ours in SERVED.items():
        module = sys.modules.get(name)
        if module is not None and module is not sys.modules.get(ours):
            out.append(f"{name} (from {getattr(module, '__file__', None) or 'unknown'})")
    return out


def install() -> None:
    """Serve mamba_ssm's Triton modules from ours in this process (see the module's doc). Call
    it before mamba_ssm, or a transformers Mamba-2 model, is imported; calling it again does
    nothing. Raises RuntimeError when mamba_ssm's own modules are already imported, naming them
    (the objects that hold them cannot be switched afterwards)."""
    with _lock:
        if _finder() is not None:
            return
        early = _already_imported()
        if early:
            raise RuntimeError(
                "selective_scan.for_mamba_ssm.install() must run before mamba_ssm is imported; already "
                f"imported: {', '.join(early)}. Call it first thing in the program (before importing "
                "mamba_ssm or a transformers Mamba-2 model)"
            )
        stand_ins = () if _triton_importable() else TRITON_ONLY
        sys.meta_path.insert(0, Finder(stand_ins))


def uninstall() -> None:
    """Stop serving (modules already imported keep what they imported)."""
    with _lock:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, Finder)]
