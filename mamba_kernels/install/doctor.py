"""``python -m mamba_kernels doctor [--json]``: what runs, why, and the one command per fix.

It reports the environment (``environment.detect``: no CUDA initialisation), each kernel's
backend with the reason, then the problems, each as ``{what, why, fix, broken}``.

Exit policy: 1 when something is broken, else 0. Broken means something that should work
does not: an extension that is present but cannot load or does not match the running torch;
an extension file the installed distribution lists but that is gone; another distribution
shadowing ours; a GPU the binary has no code for; a driver too old for the binary's CUDA;
or, with a CUDA torch and a visible GPU, no compiled extension at all. Not broken (exit 0,
with a note saying why the fast path is unavailable): the pure-Python install on a machine
without a CUDA torch or without a GPU, ``MAMBA_KERNELS_BACKEND=reference``, and nvcc on another
CUDA major than torch while the extensions load (that only breaks a source build).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any, Dict, List, Optional

from ..build import plan
from ..facts import support
from ..runtime import buildinfo, dispatch, install_record, installed, knobs
from . import environment

DIST = "mamba-kernels"
# Top-level names we install: our packages, and the compatibility modules named like the originals'
# compiled extensions (another file of that name found first, e.g. mamba_ssm's own build, shadows ours).
OUR_PACKAGES = ("causal_conv1d", "selective_scan")
COMPAT_MODULES = ("causal_conv1d_cuda", "selective_scan_cuda")
# torch's C++ namespaces, by the prefix of a demangled name: the API a missing symbol is from.
TORCH_APIS = (
    ("c10::cuda::", "c10::cuda (libc10_cuda, torch's CUDA core)"),
    ("c10::", "c10 (libc10, torch's core tensor library)"),
    ("at::", "ATen (at::, torch's tensor operators)"),
    ("torch::", "torch:: (torch's C++ frontend and extension API)"),
    ("pybind11::", "pybind11 (the Python binding layer)"),
)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _problem(what: str, why: str, fix: str, broken: bool = True) -> Dict[str, Any]:
    return {"what": what, "why": why, "fix": fix, "broken": broken}


def _split_fix(reason: str) -> tuple:
    why, sep, fix = reason.partition(". Fix: ")
    return (why, fix) if sep else (reason, dispatch._running_fix())


def demangle(symbol: str) -> str:
    """``symbol`` demangled by ``c++filt`` when it is there, else as it is."""
    exe = shutil.which("c++filt")
    if not exe or not symbol.startswith("_Z"):
        return symbol
    try:
        out = subprocess.run([exe, symbol], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return symbol
    return out.stdout.strip() or symbol


def torch_api(demangled: str) -> Optional[str]:
    """The torch C++ API a demangled name belongs to, None when it is not torch's."""
    for prefix, api in TORCH_APIS:
        if demangled.startswith(prefix) or f" {prefix}" in demangled or f"({prefix}" in demangled:
            return api
    return None


def _undefined_symbol(reason: str) -> Optional[str]:
    m = re.search(r"undefined symbol: ([A-Za-z0-9_$.@]+)", reason)
    return m.group(1) if m else None


def _recorded_missing(name: str) -> Optional[str]:
    """The extension file of ``name`` that an installed distribution lists but is gone."""
    pkg, _, mod = name.rpartition(".")
    for dist_name in importlib.metadata.packages_distributions().get(pkg.split(".")[0], []):
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or ():
            parts = f.parts
            if (len(parts) >= 2 and "/".join(parts[:-1]) == pkg.replace(".", "/")
                    and parts[-1].startswith(mod + ".") and parts[-1].endswith((".so", ".pyd"))):
                path = str(f.locate())
                if not os.path.exists(path):
                    return path
    return None


def _refused_title(info: Optional[buildinfo.BuildInfo], why: str) -> str:
    """The heading for a binary the guard refused (``why``: its reasons). A stable-ABI binary
    serves every torch from its target on, so "another torch" would mislead: name the cause."""
    if info is None or not info.stable:
        return "built for another torch"
    if buildinfo.FREE_THREADED_REASON in why:
        return "a stable-ABI module on a free-threaded Python"
    if "has no CUDA" in why:
        return "needs a CUDA build of torch"
    if "CUDA" in why and ("another major" in why or "another CUDA major" in why):
        return "built for another CUDA major"
    if "needs torch >=" in why:
        return "needs a newer torch"
    return "cannot run here"


def _kernel(kernel: str, target: environment.Target) -> Dict[str, Any]:
    """One kernel: its backend, why, and its problems."""
    name = dispatch.EXTENSIONS[kernel]
    report = dict(dispatch.backends(gpus_visible=bool(target.gpus))[kernel])
    found: List[Dict[str, Any]] = []
    report["problems"] = found
    if knobs.backend_mode() == "reference":
        return report
    status = dispatch.extension_status(kernel)
    path = dispatch._extension_file(name)
    info = buildinfo.find_in_file(path) if path else None
    running = buildinfo.running()
    gpu_here = bool(target.gpus) and bool(running[1])
    if status.module is None:
        why, fix = _split_fix(status.reason)
        if why.startswith("the compiled extension") and why.endswith("not part of this install"):
            gone = _recorded_missing(name)
            if gone:
                found.append(_problem(
                    f"{kernel}: the extension is missing",
                    f"{gone} is listed by the installed distribution but the file is gone", fix))
            else:
                found.append(_problem(
                    f"{kernel}: the extension is missing",
                    f"{why}; the PyTorch implementation runs"
                    + ("" if gpu_here else " (no CUDA torch or no GPU here: nothing faster could run)"),
                    fix, broken=gpu_here))
            return report
        symbol = _undefined_symbol(why)
        if symbol:
            plain = demangle(symbol)
            api = torch_api(plain)
            owner = f", from torch's {api} API" if api else ""
            found.append(_problem(
                f"{kernel}: built for another torch",
                f"the binary calls {plain}{owner}, which the running torch does not export: {why}",
                fix))
        elif info is not None and info.cxx11_abi is not None and running[2] is not None \
                and info.cxx11_abi != running[2] and not [
                    p for p in buildinfo.problems(info, *running) if "ABI" not in p]:
            found.append(_problem(f"{kernel}: C++ ABI mismatch", why, fix))
        elif "was built for" in why or "built for" in why:
            found.append(_problem(f"{kernel}: {_refused_title(info, why)}", why, fix))
        else:
            found.append(_problem(f"{kernel}: the extension cannot be used", why, fix))
        return report
    if info is not None and (info.sass or info.ptx):
        for g in target.gpus:
            gpu = f"GPU {g.index} ({g.name or 'name unknown'})"
            bad = buildinfo.arch_problem(name, info, gpu, g.capability)
            if bad:
                why, fix = _split_fix(bad)
                found.append(_problem(f"{kernel}: the GPU architecture is not in the binary", why, fix))
    cuda = info.torch_cuda if info is not None else running[1]
    if target.driver and cuda and target.gpus and support.driver_runs(
            target.driver, cuda, sys.platform == "win32") is False:
        need = support.min_driver(cuda, sys.platform == "win32")
        found.append(_problem(
            f"{kernel}: the driver is too old for the wheel's CUDA",
            f"{name} was built with CUDA {cuda}, which needs NVIDIA driver {need} or newer; "
            f"this machine has {target.driver}",
            f"upgrade the NVIDIA driver to {need} or newer (or install the wheel for an older CUDA "
            "together with the torch built for it)"))
    return report


def _our_compat_file(mod: str) -> Optional[str]:
    """Where our compatibility module ``mod`` lives: next to our selective_scan package."""
    try:
        spec = importlib.util.find_spec("selective_scan")
    except (Exception, SystemExit):
        return None
    if spec is None or not spec.origin:
        return None
    return os.path.join(os.path.dirname(os.path.dirname(spec.origin)), f"{mod}.py")


def _file_owners(path: str) -> List[str]:
    """Distributions whose RECORD lists ``path`` as a top-level file (packages_distributions()
    infers top-level names from .py files only on older Pythons, so an extension module is missed)."""
    name = os.path.basename(path)
    found = []
    for dist in importlib.metadata.distributions():
        files = dist.files or []
        if any(len(f.parts) == 1 and f.name == name for f in files):
            found.append(dist.metadata["Name"])
    return [d for d in found if d and _norm(d) != DIST]


def _shadowing() -> List[Dict[str, Any]]:
    found: List[Dict[str, Any]] = []
    owners = importlib.metadata.packages_distributions()
    clashes: Dict[str, List[str]] = {}
    for name in OUR_PACKAGES + COMPAT_MODULES:
        for other in sorted({d for d in owners.get(name, []) if _norm(d) != DIST}):
            clashes.setdefault(other, []).append(name)
    for other, names in clashes.items():
        try:
            ver = importlib.metadata.version(other)
        except importlib.metadata.PackageNotFoundError:
            ver = "?"
        found.append(_problem(
            f"another distribution shadows ours: {other}",
            f"the distribution {other} {ver} also installs the top-level {', '.join(names)}, so whichever "
            f"was installed last owns those files",
            f"pip uninstall -y {other} && pip install --no-deps --force-reinstall {DIST}"))
    for mod in COMPAT_MODULES:
        try:  # the file a fresh process would import (sys.path order), whatever this one imported;
            # then the finders after sys.path's (an editable install maps its modules there)
            spec = importlib.machinery.PathFinder.find_spec(mod) or importlib.util.find_spec(mod)
        except (Exception, SystemExit):
            spec = None
        ours = _our_compat_file(mod)
        if spec is None:
            found.append(_problem(
                f"the compatibility module {mod} is missing",
                f"no {mod} is importable, so code that imports it (mamba_ssm, older forks) fails at import",
                f"pip install --no-deps --force-reinstall {DIST}", broken=False))
            continue
        origin = spec.origin or mod
        if ours is not None and os.path.realpath(origin) == os.path.realpath(ours):
            continue
        dists = sorted({d for d in owners.get(mod, []) if _norm(d) != DIST} or _file_owners(origin))
        owner = f" (installed by {', '.join(dists)})" if dists else ""
        fix = f"pip uninstall -y {' '.join(dists)}" if dists else f"rm {origin}"
        mamba = any(_norm(d) == "mamba-ssm" for d in dists)
        if mamba:
            fix = ("MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE pip install --no-build-isolation "
                   "--no-deps --force-reinstall mamba-ssm (its Python only; our kernels then serve it)")
        found.append(_problem(
            "mamba_ssm's own extension shadows ours" if mamba else f"a stray {mod} module shadows ours",
            f"{mod} at {origin}{owner} is found before ours ({ours or 'not installed'}): code that imports "
            f"it (mamba_ssm) runs that binary instead of mamba-kernels' kernels",
            fix, broken=not mamba))
    return found


def _nvcc(target: environment.Target) -> List[Dict[str, Any]]:
    if not (target.nvcc and target.torch_cuda):
        return []
    if target.nvcc.split(".")[0] == target.torch_cuda.split(".")[0]:
        return []
    return [_problem(
        "nvcc and torch are on different CUDA majors",
        f"nvcc at {target.cuda_home} is CUDA {target.nvcc}, torch is built with CUDA {target.torch_cuda}: "
        "building the extensions from source would fail",
        f"point CUDA_HOME at a CUDA {target.torch_cuda.split('.')[0]}.x toolkit, e.g. "
        f"pip install 'nvidia-cuda-nvcc-cu{target.torch_cuda.split('.')[0]}' and set CUDA_HOME to it",
        broken=False)]


def build_knob_problem() -> Optional[str]:
    """Why the build knobs as set (MAMBA_KERNELS_BINDING, the booleans, TORCH_CUDA_ARCH_LIST,
    MAX_JOBS, ...) would stop a source build here, or None. The installed kernels do not read
    them, so a typo there shows up only at the next build, long after it was made."""
    try:
        plan.read_knobs(os.environ)
    except ValueError as e:
        return " ".join(str(e).split())
    return None


def _knob_problems() -> List[Dict[str, Any]]:
    why = build_knob_problem()
    if why is None:
        return []
    return [_problem("a build knob is not valid",
                     f"{why}; the installed kernels do not read it, but a source build (from a checkout "
                     "or the sdist) stops on it",
                     "unset the variable or give it one of the values named", broken=False)]


def diagnose(target: Optional[environment.Target] = None) -> Dict[str, Any]:
    """The doctor's report: environment, kernels (backend, reason, problems), problems, broken."""
    if target is None:
        target = environment.detect()
    kernels = {k: _kernel(k, target) for k in dispatch.EXTENSIONS}
    found = [p for k in kernels.values() for p in k.pop("problems")]
    found += _shadowing()
    nvcc = _nvcc(target)
    if nvcc and any(k["backend"] != "cuda" and not k["reason"].startswith(dispatch.NO_GPU_REASON)
                    for k in kernels.values()):
        nvcc[0]["broken"] = True  # the fix for the kernels is a build: it would fail
    found += nvcc
    found += _knob_problems()
    build = installed.describe()
    return {
        "mamba_kernels": build["version"],
        "build": {k: build[k] for k in ("label", "how")},
        "environment": {**target.as_dict(), "backend_mode": knobs.backend_mode(),
                        "scan_states": knobs.scan_states()},
        "kernels": kernels,
        "problems": found,
        "broken": any(p["broken"] for p in found),
        "install_record": install_record.read_record(),  # how the sdist installed it, or None
    }


def render(report: Dict[str, Any]) -> str:
    env = report["environment"]
    head = installed.lines({"version": report["mamba_kernels"], **report["build"]})
    lines = [head[0],
             f"python        {installed.python_text()}",
             f"torch         {installed.torch_text(env['torch'], env['torch_cuda'], env['cxx11_abi'])}",
             f"nvcc          {env['nvcc'] or 'not found'} (CUDA_HOME {env['cuda_home'] or 'not set'})",
             f"driver        {env['driver'] or 'none visible'}"]
    lines += [f"gpu {g['index']}         {g['name']} (sm {g['capability']})" for g in env["gpus"]] or [
        "gpu           none visible"]
    lines.append(head[1])
    lines.append(f"backend mode  {env['backend_mode']}")
    lines.append(f"scan states   {env['scan_states']}")
    if report.get("install_record"):
        lines.append(f"installed     from the sdist: {report['install_record']['line']}")
    for kernel, k in report["kernels"].items():
        lines.append(f"{kernel:<15}{k['backend']}: {k['reason']}")
    if not report["problems"]:
        lines.append("no problems found")
    for p in report["problems"]:
        lines.append(f"{'BROKEN' if p['broken'] else 'note'}: {p['what']}")
        lines.append(f"  why: {p['why']}")
        lines.append(f"  fix: {p['fix']}")
    return "\n".join(lines)


def main(as_json: bool = False, target: Optional[environment.Target] = None) -> int:
    report = diagnose(target)
    print(json.dumps(report, indent=2) if as_json else render(report))
    return 1 if report["broken"] else 0
