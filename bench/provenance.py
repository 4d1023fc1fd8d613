"""Which kernels a side-by-side run loaded, checked before anything is timed.

Every bench script that puts our kernels next to the original's (mamba_ssm's compiled
``selective_scan_cuda``, causal-conv1d's ``causal_conv1d_cuda``) goes through here, so that
each side is proven to be what its column says:

* the original: its interface module is the one in its own install directory (``pip install
  --no-deps --target DIR``) and the extension that module *binds* is the compiled file of that
  same directory. ``load_original_scan`` loads that file itself and puts it in
  ``sys.modules["selective_scan_cuda"]`` before the interface is imported, so the order of
  ``sys.path`` cannot hand the interface our compatibility module ``selective_scan_cuda.py``
  (the mistake that made both columns time our kernel).
* ours: ``selective_scan._cuda`` / ``causal_conv1d._cuda`` are compiled files of our package,
  under the expected root (this checkout, or the build a script was pointed at), and clients
  such as mamba_ssm's own Python bind our compatibility modules.

A check that fails raises ``ProvenanceError`` (the scripts exit non-zero before timing); the
lines every check returns name each module's file, for the run's report. The command line
(``python3 bench/provenance.py check ...``) runs the same checks for the shell scripts, in the
environment (``PYTHONPATH``, working directory) of the run they guard.

This module imports neither torch nor our packages at import time.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import importlib.machinery
import importlib.util
import os
import sys
from typing import List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORIG_SCAN_EXT = "selective_scan_cuda"
ORIG_CONV_EXT = "causal_conv1d_cuda"
ORIG_INTERFACE = "mamba_ssm.ops.selective_scan_interface"
OURS_EXTENSIONS = ("selective_scan._cuda", "causal_conv1d._cuda")


class ProvenanceError(RuntimeError):
    """A side of a comparison is not what it claims to be."""


def is_compiled(path: Optional[str]) -> bool:
    """Whether ``path`` names a compiled extension module (by the interpreter's suffixes)."""
    return bool(path) and path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def is_under(path: str, root: str) -> bool:
    p, r = _real(path), _real(root)
    return p == r or p.startswith(r.rstrip(os.sep) + os.sep)


def module_file(module) -> Optional[str]:
    return getattr(module, "__file__", None)


def require_compiled(what: str, module, root: Optional[str] = None) -> str:
    """The real path of ``module``'s file, which must be a compiled extension (under ``root``
    when given); else ProvenanceError naming ``what``, the file and the rule."""
    path = module_file(module)
    if not is_compiled(path):
        raise ProvenanceError(
            f"{what}: {getattr(module, '__name__', module)!r} comes from {path!r}, which is not a "
            f"compiled extension ({', '.join(importlib.machinery.EXTENSION_SUFFIXES)})"
        )
    if root is not None and not is_under(path, root):
        raise ProvenanceError(f"{what}: {path} is not under {_real(root)}")
    return _real(path)


def require_file(what: str, module, expected: str) -> str:
    path = module_file(module)
    if not path or _real(path) != _real(expected):
        raise ProvenanceError(f"{what}: {getattr(module, '__name__', module)!r} comes from {path!r}, "
                              f"expected {_real(expected)}")
    return _real(path)


def compiled_files(directory: str, name: str) -> List[str]:
    """The compiled extension files named ``name`` directly in ``directory``."""
    found = []
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        found += glob.glob(os.path.join(glob.escape(directory), name + suffix))
    return sorted(set(found))


def _load_extension_file(name: str, path: str):
    """Import the compiled file ``path`` as module ``name`` (whatever sys.path says)."""
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def original_extension_file(orig_dir: str, name: str) -> str:
    """The one compiled file of ``name`` directly in ``orig_dir`` (its real path); else
    ProvenanceError saying what is there."""
    orig_dir = _real(orig_dir)
    files = compiled_files(orig_dir, name)
    if len(files) != 1:
        near = glob.glob(os.path.join(glob.escape(orig_dir), name + "*"))
        others = sorted(os.path.basename(p) for p in near)
        raise ProvenanceError(
            f"original: expected one compiled {name} in {orig_dir}, found {len(files)}"
            + (f" (there: {', '.join(others)})" if others else "")
        )
    return _real(files[0])


def load_original_extension(orig_dir: str, name: str) -> Tuple[object, str]:
    """The original's compiled ``name`` from ``orig_dir`` as a module object of its own, left out
    of ``sys.modules`` (so ``import name`` still finds whatever it found before): for a run that
    holds both sides in one process and hands a client one or the other."""
    so = original_extension_file(orig_dir, name)
    before = sys.modules.get(name)
    try:
        module = _load_extension_file(name, so)
    finally:  # CPython enters a single-phase extension module into sys.modules itself
        if before is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = before
    require_compiled(f"original: {name}", module, orig_dir)
    return module, so


def bind_original_extension(orig_dir: str, name: str) -> Tuple[object, str]:
    """The original's compiled ``name`` from ``orig_dir``, made what ``import name`` returns in
    this process. Refused when ``orig_dir`` has no compiled file of that name, or when another
    module of that name was imported already (an interface bound to it would not be rebound)."""
    so = original_extension_file(orig_dir, name)
    existing = sys.modules.get(name)
    if existing is not None:
        if is_compiled(module_file(existing)) and _real(module_file(existing)) == so:
            return existing, so
        raise ProvenanceError(f"original: {name} was already imported from {module_file(existing)!r} "
                              f"before the original's {so} could be bound")
    module = _load_extension_file(name, so)
    sys.modules[name] = module
    return module, so


def _read_version(pkg_dir: str) -> str:
    import re

    try:
        with open(os.path.join(pkg_dir, "__init__.py")) as f:
            m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.MULTILINE)
        return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"


def _namespace_package(name: str, pkg_dir: str, version: str) -> None:
    """Register ``name`` as the package at ``pkg_dir`` without running its __init__ (mamba_ssm's
    pulls in the model classes and their dependencies); an already imported one must be there."""
    existing = sys.modules.get(name)
    if existing is not None:
        paths = [_real(p) for p in getattr(existing, "__path__", [])]
        if _real(pkg_dir) not in paths:
            where = paths or module_file(existing)
            raise ProvenanceError(f"original: {name} was imported from {where}, not from {_real(pkg_dir)}")
        return
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(pkg_dir, "__init__.py"), submodule_search_locations=[pkg_dir]
    )
    pkg = importlib.util.module_from_spec(spec)
    pkg.__version__ = version
    sys.modules[name] = pkg


def load_original_scan(orig_dir: str):
    """(interface module, provenance lines): mamba_ssm's selective_scan_interface from its
    ``--target`` install in ``orig_dir``, bound to that install's compiled selective_scan_cuda,
    both checked after the import. Raises ProvenanceError (or the import's own error)."""
    orig_dir = _real(orig_dir)
    pkg_dir = os.path.join(orig_dir, "mamba_ssm")
    if not os.path.isdir(pkg_dir):
        raise ProvenanceError(f"original: no mamba_ssm/ in {orig_dir}")
    version = _read_version(pkg_dir)
    _, so = bind_original_extension(orig_dir, ORIG_SCAN_EXT)
    _namespace_package("mamba_ssm", pkg_dir, version)
    iface = importlib.import_module(ORIG_INTERFACE)
    lines = check_original_interface(iface, orig_dir)
    return iface, [f"mamba_ssm {version} from {orig_dir}"] + lines


def check_original_interface(iface, orig_dir: str) -> List[str]:
    """The interface module is the original's (under ``orig_dir``) and the selective_scan_cuda it
    binds is the compiled file of ``orig_dir``; the lines name both, and the conv it binds."""
    where = require_file_under("original: " + ORIG_INTERFACE, iface, orig_dir)
    ext = getattr(iface, ORIG_SCAN_EXT, None)
    if ext is None:
        raise ProvenanceError(f"original: {ORIG_INTERFACE} has no {ORIG_SCAN_EXT}")
    so = require_compiled(f"original: {ORIG_INTERFACE}.{ORIG_SCAN_EXT}", ext, orig_dir)
    lines = [f"{ORIG_INTERFACE}: {where}", f"{ORIG_INTERFACE}.{ORIG_SCAN_EXT}: {so}"]
    conv = sys.modules.get("causal_conv1d")
    if conv is not None:
        lines.append(f"causal_conv1d (the conv the original's interface imports): {module_file(conv)}")
    return lines


def require_file_under(what: str, module, root: str) -> str:
    path = module_file(module)
    if not path or not is_under(path, root):
        raise ProvenanceError(f"{what}: comes from {path!r}, not from under {_real(root)}")
    return _real(path)


def ours_extension_lines(root: Optional[str] = ROOT, require: bool = True) -> List[str]:
    """Our compiled extensions, imported (as the dispatch would), each a compiled file of our
    package under ``root`` (any place when None). ``require=False`` reports a missing one
    instead of refusing (a PyTorch-path smoke run)."""
    lines = []
    for name in OURS_EXTENSIONS:
        try:
            module = importlib.import_module(name)
        except Exception as e:
            if require:
                raise ProvenanceError(f"ours: {name} does not import ({type(e).__name__}: {e})") from e
            lines.append(f"{name}: not importable ({type(e).__name__})")
            continue
        path = require_compiled(f"ours: {name}", module, root)
        package_dir = os.path.dirname(path)
        if os.path.basename(package_dir) != name.split(".")[0]:
            raise ProvenanceError(f"ours: {name} comes from {path}, outside a {name.split('.')[0]}/ package")
        lines.append(f"{name}: {path}")
    return lines


def arm_ours_entry(ours) -> str:
    """One small compiled call of our ``selective_scan_cuda.fwd`` (which makes its fwd and bwd
    the extension's C entry where there is one: selective_scan/cuda_compat.py), then a line
    saying which function each of them now is. Call it before taking ``ours.fwd`` for timing."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    u, delta, z = (torch.rand(1, 4, 8, device="cuda", generator=g) for _ in range(3))
    A = -torch.rand(4, 4, device="cuda", generator=g)
    B, C = (torch.randn(1, 1, 4, 8, device="cuda", generator=g) for _ in range(2))
    ours.fwd(u, delta, A, B, C, None, z, None, True)
    torch.cuda.synchronize()

    def what(fn) -> str:
        if getattr(fn, "__module__", None) == "selective_scan.cuda_compat":
            return "Python (selective_scan/cuda_compat.py)"
        return f"C entry of {getattr(fn, '__self__', None) and module_file(fn.__self__)}"

    return f"ours: selective_scan_cuda.fwd is the {what(ours.fwd)}; bwd the {what(ours.bwd)}"


def compat_scan_sides(orig_dir: str) -> Tuple[object, object, List[str]]:
    """(ours, original, lines) for a side-by-side of ``selective_scan_cuda`` calls: ours this
    checkout's compatibility module on its compiled extensions, the original the compiled file
    under ``orig_dir`` loaded by path, each proved (ProvenanceError otherwise), and the lines
    that name every file, for the report's header."""
    import selective_scan_cuda as ours

    compat = os.path.join(ROOT, "selective_scan_cuda.py")
    lines = ["ours: " + require_file("ours: selective_scan_cuda", ours, compat)]
    lines += ["ours: " + line for line in ours_extension_lines(ROOT)]
    orig, so = load_original_extension(orig_dir, ORIG_SCAN_EXT)
    lines.append(f"original: {so}")
    if module_file(orig) == module_file(ours):
        raise ProvenanceError("both sides are one module")
    return ours, orig, lines


def require_compat_scan_sides(orig_dir: str) -> Tuple[object, object]:
    """compat_scan_sides for a script about to time both: ours on the compiled kernels only
    (MAMBA_KERNELS_BACKEND=cuda unless set), the lines printed, and the script ended with
    "PROVENANCE FAILED: ..." when either side is not what it says."""
    os.environ.setdefault("MAMBA_KERNELS_BACKEND", "cuda")
    try:
        ours, orig, lines = compat_scan_sides(orig_dir)
    except ProvenanceError as e:
        raise SystemExit(f"PROVENANCE FAILED: {e}") from None
    print("\n".join(lines))
    return ours, orig


def check_ours_client(root: str = ROOT, compiled: bool = True) -> List[str]:
    """A client of the original's API (mamba_ssm's own Python, transformers) on ours: the
    interface it imports binds our compatibility module ``selective_scan_cuda`` from ``root``,
    and our extensions are compiled files under ``root`` (when ``compiled``)."""
    iface = importlib.import_module(ORIG_INTERFACE)
    ext = getattr(iface, ORIG_SCAN_EXT, None)
    if ext is None:
        raise ProvenanceError(f"ours: {ORIG_INTERFACE} has no {ORIG_SCAN_EXT}")
    expected = os.path.join(root, ORIG_SCAN_EXT + ".py")
    compat = require_file(f"ours: {ORIG_INTERFACE}.{ORIG_SCAN_EXT}", ext, expected)
    conv = importlib.import_module("causal_conv1d")
    conv_path = require_file_under("ours: causal_conv1d", conv, root)
    return ([f"{ORIG_INTERFACE}: {module_file(iface)}", f"{ORIG_INTERFACE}.{ORIG_SCAN_EXT}: {compat}",
             f"causal_conv1d: {conv_path}"] + ours_extension_lines(root, require=compiled))


def check_ours_package(root: str = ROOT, compiled: bool = True) -> List[str]:
    """Our packages themselves (what the shims and our bench call) come from ``root``."""
    lines = []
    for name in ("selective_scan", "causal_conv1d"):
        lines.append(f"{name}: {require_file_under('ours: ' + name, importlib.import_module(name), root)}")
    return lines + ours_extension_lines(root, require=compiled)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Check and print which kernels a run loads (exit 1 if wrong).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("side", choices=("orig", "ours", "ours-client"),
                   help="orig: the original's interface bound to its own .so under --orig-dir; ours: our "
                        "packages and compiled extensions under --root; ours-client: mamba_ssm's Python "
                        "importing our compatibility modules from --root")
    c.add_argument("--orig-dir", help="the original's --target install (side orig)")
    c.add_argument("--root", default=ROOT, help="where ours must come from (default: this checkout)")
    c.add_argument("--no-compiled", action="store_true", help="ours: do not require the compiled extensions")
    a = ap.parse_args(argv)
    try:
        if a.side == "orig":
            if not a.orig_dir:
                ap.error("check orig needs --orig-dir")
            # the original's extension links torch's libraries (libc10.so ...), which only
            # torch's own import puts in the process; a bench imports torch before this check
            importlib.import_module("torch")
            _, lines = load_original_scan(a.orig_dir)
        elif a.side == "ours":
            lines = check_ours_package(a.root, compiled=not a.no_compiled)
        else:
            lines = check_ours_client(a.root, compiled=not a.no_compiled)
    except Exception as e:  # ProvenanceError, or the import itself failing
        print(f"PROVENANCE FAILED ({a.side}): {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    for line in lines:
        print(f"provenance {a.side}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
