"""The runtime guard: read a compiled extension's build metadata and compare it with the
running torch before dispatch trusts the binary: the metadata travels inside the binary, so
a wheel paired with the wrong torch is refused with a reason instead of failing at a symbol
(the rules: docs/COMPAT.md §9).

Each extension exposes ``BUILD_INFO``: the JSON string mamba_kernels/build/build_info.py compiled in.

Two rules, by the binary's ``binding`` (docs/STABLE_ABI.md): a classic binary needs the torch
minor it was built against; a stable-ABI binary runs on every torch from its ``stable_target``
on, but not with another CUDA major (the stable ABI does not cover the CUDA runtime it links)
and not on a free-threaded CPython (it is an abi3 module).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import sys
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import unquote, urlparse

from ..facts import release_index, support, variant, versions
from ..facts.archs import Arch
from ..facts.version import __version__
from . import knobs


@dataclass(frozen=True)
class BuildInfo:
    torch_version: str
    torch_cuda: str
    nvcc_version: str
    cxx11_abi: Optional[bool]
    package_version: str
    sass: Tuple[str, ...]
    ptx: Tuple[str, ...]
    raw: Dict[str, Any]
    binding: str = variant.CLASSIC  # variant.STABLE: PyTorch's stable ABI (absent in older metadata: classic)
    stable_target: Optional[str] = None  # stable: the oldest torch it runs on, "2.10"

    @property
    def stable(self) -> bool:
        return self.binding == variant.STABLE

    @property
    def variant(self) -> variant.Variant:
        if self.stable:
            assert self.stable_target is not None
            return variant.Variant(self.stable_target, self.torch_cuda, None, stable=True)
        return variant.Variant(
            versions.minor(self.torch_version), self.torch_cuda, self.cxx11_abi
        )

    def describe(self) -> str:
        archs = " ".join(self.sass + self.ptx) or "no architectures recorded"
        if self.stable:
            return (
                f"the stable ABI from torch {self.stable_target} (built against torch {self.torch_version}), "
                f"CUDA {self.torch_cuda} (nvcc {self.nvcc_version}), {archs}, "
                f"mamba-kernels {self.package_version}"
            )
        return (
            f"torch {self.torch_version}, CUDA {self.torch_cuda} (nvcc {self.nvcc_version}), "
            f"{variant.abi_name(self.cxx11_abi)} ABI, {archs}, mamba-kernels {self.package_version}"
        )


_VERSION = re.compile(r"^\d+\.\d+")  # torch_version, package_version: start with M.m
_CUDA = re.compile(r"^\d+\.\d+$")  # torch_cuda: "13.0"
_NVCC = re.compile(r"^\d+(\.\d+)*$")  # nvcc_version: "13.0" or "12.4.131"
_SASS = re.compile(r"^sm_\d{2,}[af]?$")
_PTX = re.compile(r"^compute_\d{2,}[af]?$")


@dataclass(frozen=True)
class Field:
    """One BUILD_INFO key: whether every binary has it (older ones may lack the others), and
    for a checked one the shape of its value (a pattern, with an example for the message)."""

    key: str
    required: bool = False
    pattern: Optional[re.Pattern[str]] = None
    example: str = ""


# The BUILD_INFO schema, in the order the build writes it (build/build_info.py build_info through
# record); parse reads it and ci/build_cell.py checks a release wheel's by these keys.
SCHEMA: Tuple[Field, ...] = (
    Field("format"),
    Field("package_version", pattern=_VERSION, example="0.1.0+cu130torch2.14"),  # or "unknown"
    Field("torch_version", True, _VERSION, "2.14.1+cu130"),
    Field("torch_cuda", True, _CUDA, "13.0"),
    Field("nvcc_version", True, _NVCC, "13.0"),
    Field("cxx11_abi", True),  # true, false, or null where torch has one ABI (Windows)
    Field("host_compiler"),
    Field("cxx_standard"),
    Field("sass", pattern=_SASS, example="sm_90"),
    Field("ptx", pattern=_PTX, example="compute_90"),
    Field("platform"),
    Field("source_revision"),
    Field("release"),
    Field("binding"),  # classic or stable (absent in older metadata: classic)
    Field("stable_target", pattern=_CUDA, example="2.10"),  # stable: the oldest torch it runs on, M.m
    Field("cuda_major"),  # the CUDA runtime major the binary links, which the stable ABI does not cover
)
FIELDS: Dict[str, Field] = {f.key: f for f in SCHEMA}
FORMAT = 1
# What a stable binary's record adds to the classic judgement: its binding, target and CUDA major.
STABLE_KEYS = ("binding", "stable_target", "cuda_major")


def record(**values: Any) -> Dict[str, Any]:
    """A BUILD_INFO object with exactly the schema's keys, in its order: the writer's one way
    to make it, so that what is written is what :func:`parse` reads."""
    missing = [f.key for f in SCHEMA if f.key not in values]
    unknown = sorted(set(values) - set(FIELDS))
    if missing or unknown:
        raise ValueError(f"a BUILD_INFO record needs exactly the schema's keys: missing {missing}, "
                         f"unknown {unknown}")
    return {f.key: values[f.key] for f in SCHEMA}


def _field(data: Dict[str, Any], key: str) -> str:
    value, f = data[key], FIELDS[key]
    assert f.pattern is not None
    if not isinstance(value, str) or not f.pattern.match(value):
        raise ValueError(f"BUILD_INFO {key} must be a string like {f.example!r}, got {value!r}")
    return value


def _arch_list(data: Dict[str, Any], key: str) -> Tuple[str, ...]:
    value, f = data.get(key, []), FIELDS[key]
    assert f.pattern is not None
    if not isinstance(value, list) or not all(isinstance(v, str) and f.pattern.match(v) for v in value):
        raise ValueError(f"BUILD_INFO {key} must be a list of names like {f.example!r}, got {value!r}")
    return tuple(value)


def parse(text: str) -> BuildInfo:
    """Parse a BUILD_INFO string against its schema; ValueError naming what is wrong (a
    wrongly typed or shaped field included, so nothing downstream meets a bad value)."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as e:
        raise ValueError(f"BUILD_INFO is not JSON ({e}): {str(text)[:120]!r}") from None
    if not isinstance(data, dict):
        raise ValueError(f"BUILD_INFO must be a JSON object, got {type(data).__name__}")
    missing = [f.key for f in SCHEMA if f.required and f.key not in data]
    if missing:
        raise ValueError(f"BUILD_INFO lacks {', '.join(missing)}")
    abi = data["cxx11_abi"]
    if abi is not None and not isinstance(abi, bool):
        raise ValueError(f"BUILD_INFO cxx11_abi must be true, false or null, got {abi!r}")
    package_version = data.get("package_version", "unknown")
    if package_version != "unknown":
        package_version = _field(data, "package_version")
    binding = data.get("binding", variant.CLASSIC)
    if binding not in variant.BINDINGS:
        names = " or ".join(map(repr, variant.BINDINGS))
        raise ValueError(f"BUILD_INFO binding must be {names}, got {binding!r}")
    stable_target = None
    if binding == variant.STABLE:
        stable_target = _field(data, "stable_target")
    return BuildInfo(
        torch_version=_field(data, "torch_version"),
        torch_cuda=_field(data, "torch_cuda"),
        nvcc_version=_field(data, "nvcc_version"),
        cxx11_abi=abi,
        package_version=package_version,
        sass=_arch_list(data, "sass"),
        ptx=_arch_list(data, "ptx"),
        raw=data,
        binding=binding,
        stable_target=stable_target,
    )


# A NUL-terminated string in a binary that holds a JSON object: candidates for BUILD_INFO.
_C_OBJECT = re.compile(rb"\{[^\x00]{0,8192}?\}(?=\x00)")


def find_in_binary(data: bytes) -> Optional[BuildInfo]:
    """BUILD_INFO read from a compiled extension's bytes, without loading it (a wheel's .so or
    .pyd for another platform): the first embedded JSON object that parses as BUILD_INFO."""
    for m in _C_OBJECT.finditer(data):
        try:
            info = parse(m.group(0).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            continue
        if "format" in info.raw:
            return info
    return None


_MARKER = b'"torch_version"'
_WINDOW = 8192  # as _C_OBJECT: BUILD_INFO is far shorter


def find_in_file(path: str) -> Optional[BuildInfo]:
    """BUILD_INFO read from a compiled extension file without loading it (for a binary the
    loader refuses): only the bytes around each ``"torch_version"`` are scanned, so a fat
    binary of hundreds of MB costs one read. None when the file holds none or cannot be read."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    start = data.find(_MARKER)
    while start != -1:
        found = find_in_binary(data[max(0, start - _WINDOW) : start + _WINDOW])
        if found is not None:
            return found
        start = data.find(_MARKER, start + 1)
    return None


def installed_source() -> Tuple[str, str]:
    """(pip's argument that reinstalls this distribution from its source, what it is): the
    checkout an editable or local-folder install came from (its direct_url.json), while that
    folder still holds the project; else the project name, i.e. the sdist from PyPI. A hint that
    names ``.`` would install whatever folder the reader stands in."""
    try:
        text = metadata.distribution(variant.PROJECT).read_text("direct_url.json") or ""
        direct = json.loads(text) if text else {}
        url = urlparse(direct.get("url", ""))
        folder = unquote(url.path) if url.scheme == "file" and "dir_info" in direct else ""
        if os.name == "nt" and re.match(r"^/[A-Za-z]:", folder):
            folder = folder[1:]
        editable = bool(direct.get("dir_info", {}).get("editable"))
    except Exception:  # no metadata, or unreadable: the published source is the answer
        folder, editable = "", False
    if not folder:  # nothing recorded: the checkout the running package lives in, if it is one
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        folder, editable = os.path.dirname(root), True
    if _is_our_project(folder):
        return (f"-e {shlex.quote(folder)}" if editable else shlex.quote(folder)), f"the checkout {folder}"
    return variant.PROJECT, "the sdist"


def _is_our_project(folder: str) -> bool:
    try:
        with open(os.path.join(folder, "pyproject.toml"), encoding="utf-8") as f:
            return re.search(r'(?m)^name\s*=\s*"mamba-kernels"', f.read()) is not None
    except OSError:
        return False


def rebuild_command(arch_list: Optional[str] = None) -> str:
    """The command that rebuilds the extensions against the running torch from this
    distribution's own source (:func:`installed_source`), for ``arch_list`` when given."""
    where, _ = installed_source()
    archs = f"TORCH_CUDA_ARCH_LIST={arch_list} " if arch_list else ""
    return (f"{archs}{knobs.FORCE_BUILD_VAR}=1 pip install --no-build-isolation --no-deps "
            f"--force-reinstall {where}")


def fix_command(
    torch_version: str,
    torch_cuda: Optional[str],
    cxx11_abi: Optional[bool],
    version: str,
    is_free_threaded: bool = False,
) -> str:
    """The commands that get a binary matching the running torch (on a free-threaded CPython,
    which loads no abi3 wheel: a classic build)."""
    rebuild = rebuild_command()
    if is_free_threaded:
        return (
            "use a CPython build with the GIL (the stable-ABI wheels are abi3), or build the classic "
            f"binding for this interpreter: {knobs.BINDING_VAR}=classic {rebuild}"
        )
    if not torch_cuda:
        # a wheel is never rebuilt against a CPU-only torch; with a CUDA torch in place, `install`
        # picks the wheel for it (this one, when it fits)
        return (
            "install a CUDA build of torch, then the wheel for it: python -m mamba_kernels install "
            f"(or keep this torch: the PyTorch path runs, and {knobs.BACKEND_VAR}=reference silences this)"
        )
    public = version.split("+")[0]
    try:
        if _at_least(versions.minor(torch_version), support.STABLE_ABI_MIN_TORCH):
            # torch >= the stable target is served by the stable wheel of its CUDA major
            wanted = variant.stable_release_version(public, torch_cuda, support.STABLE_ABI_MIN_TORCH)
        else:
            wanted = variant.release_version(public, torch_version, torch_cuda, cxx11_abi)
    except ValueError:
        return f"rebuild against the running torch: {rebuild}"
    url = release_index.variant_index(wanted.split("+", 1)[1])
    if url is None:  # MAMBA_KERNELS_INDEX names no site with per-variant pages: the resolver reads it
        return (f"python -m mamba_kernels install (it picks the wheel for the running torch, "
                f"mamba-kernels=={wanted}, from {release_index.ENV_VAR}), or rebuild against the running "
                f"torch: {rebuild}")
    return (
        f"pip install --no-deps --force-reinstall 'mamba-kernels=={wanted}' --index-url {shlex.quote(url)}"
        f", or rebuild against the running torch: {rebuild}"
    )


def _at_least(mm: str, floor: str) -> bool:
    return versions.key(mm) >= versions.key(floor)


def free_threaded() -> bool:
    """Whether this CPython is a free-threaded build (3.13t and later), which loads no abi3 module."""
    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


FREE_THREADED_REASON = "it is a stable-ABI (abi3) module, which a free-threaded CPython cannot load"


def problems(
    info: BuildInfo,
    torch_version: str,
    torch_cuda: Optional[str],
    cxx11_abi: Optional[bool],
    package_version: Optional[str] = None,
    is_free_threaded: bool = False,
) -> List[str]:
    """Why a binary with ``info`` cannot run under the given torch (empty: it can); with
    ``package_version``, also when it comes from another release of mamba-kernels (compared
    on the public part: the local label names the variant, checked above). A stable binary is
    refused on a torch older than its target, with another CUDA major, and on a free-threaded
    CPython (``is_free_threaded``); any newer torch minor is fine."""
    found = variant.mismatches(info.variant, torch_version, torch_cuda, cxx11_abi)
    if info.stable and is_free_threaded:
        found.append(FREE_THREADED_REASON)
    if torch_cuda and info.nvcc_version.split(".")[0] != torch_cuda.split(".")[0]:
        found.append(
            f"it was compiled by nvcc {info.nvcc_version}, another CUDA major than torch's {torch_cuda}"
        )
    if package_version is not None:
        built, installed = info.package_version.split("+")[0], package_version.split("+")[0]
        if info.package_version == "unknown":
            found.append(f"it records no mamba-kernels version, the installed package is {installed}")
        elif built != installed:
            found.append(f"it is from mamba-kernels {built}, the installed package is {installed}")
    return found


def running() -> Tuple[str, Optional[str], Optional[bool]]:
    """The running torch's version, CUDA version (None for a CPU build) and C++ ABI (None on
    Windows, where MSVC has no ABI flag)."""
    # optional: importing the package never imports torch
    import torch

    abi = None if sys.platform == "win32" else bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    return torch.__version__, torch.version.cuda, abi


def describe_running(torch_version: str, torch_cuda: Optional[str], cxx11_abi: Optional[bool]) -> str:
    return f"torch {torch_version}, CUDA {torch_cuda or 'none'}, {variant.abi_name(cxx11_abi)} ABI"


def check_text(
    name: str, text: Optional[str], torch_version: str, torch_cuda: Optional[str], cxx11_abi: Optional[bool]
) -> Optional[str]:
    """None when the extension ``name`` with BUILD_INFO ``text`` fits the running torch, else
    one message: what it was built for, what is running, and the fix."""
    running = describe_running(torch_version, torch_cuda, cxx11_abi)
    if text is None:
        return (
            f"{name} carries no build metadata (BUILD_INFO), so it cannot be checked against the "
            f"running {running}. Fix: {fix_command(torch_version, torch_cuda, cxx11_abi, __version__)}"
        )
    try:
        info = parse(text)
    except ValueError as e:
        return f"{name} has unreadable build metadata: {e}. Fix: " + fix_command(
            torch_version, torch_cuda, cxx11_abi, __version__
        )
    try:
        found = problems(info, torch_version, torch_cuda, cxx11_abi, __version__, free_threaded())
    except ValueError as e:  # a value the schema let through that the rules cannot read
        return f"{name} has unreadable build metadata: {e}. Fix: " + fix_command(
            torch_version, torch_cuda, cxx11_abi, __version__
        )
    if not found:
        return None
    fix = fix_command(torch_version, torch_cuda, cxx11_abi, __version__, info.stable and free_threaded())
    return (
        f"{name} was built for {info.describe()}, but the running environment has {running} "
        f"({'; '.join(found)}). Fix: {fix}"
    )


def check_module(module: ModuleType) -> Optional[str]:
    """The dispatch hook: compare an imported extension's BUILD_INFO with the running torch."""
    text = getattr(module, "BUILD_INFO", None)
    return check_text(module.__name__, text if isinstance(text, str) else None, *running())


def explain_load_failure(name: str, error: BaseException, path: Optional[str]) -> str:
    """Why the extension ``name`` (file ``path``) could not be imported, with what the binary
    was built for (its BUILD_INFO read from the file's bytes: the loader never got that far),
    what is running, and the one command that fixes it."""
    torch_version, torch_cuda, abi = running()
    now = describe_running(torch_version, torch_cuda, abi)
    fix = fix_command(torch_version, torch_cuda, abi, __version__)
    what = f"{name} failed to load ({type(error).__name__}: {error})"
    info = find_in_file(path) if path else None
    if info is None:
        where = f" from {path}" if path else ""
        return f"{what}; its build metadata could not be read{where}; running {now}. Fix: {fix}"
    try:
        found = problems(info, torch_version, torch_cuda, abi, __version__, free_threaded())
    except ValueError:
        found = []
    why = f" ({'; '.join(found)})" if found else ""
    return f"{what}: it was built for {info.describe()}; running {now}{why}. Fix: {fix}"


def abi3_refusal(name: str, package_dir: Optional[str]) -> Optional[str]:
    """On a free-threaded CPython, the import system skips abi3 files, so a stable-ABI binary
    looks absent: the sentence saying so (with its BUILD_INFO and the fix) when ``package_dir``
    holds one for ``name``, else None."""
    if not free_threaded() or not package_dir:
        return None
    stem = name.rsplit(".", 1)[-1]
    found = sorted(glob.glob(os.path.join(package_dir, f"{stem}.abi3.so")) +
                   glob.glob(os.path.join(package_dir, f"{stem}.pyd")))
    for path in found:
        info = find_in_file(path)
        if info is not None and info.stable:
            torch_version, torch_cuda, abi = running()
            fix = fix_command(torch_version, torch_cuda, abi, __version__, True)
            return (
                f"{name} ({path}) was built for {info.describe()}, but {FREE_THREADED_REASON}. Fix: {fix}"
            )
    return None


def arch_problem(name: str, info: BuildInfo, gpu: str, capability: str) -> Optional[str]:
    """None when the binary ``info`` holds code a GPU of compute ``capability`` ("8.6") runs
    (its SASS, or PTX the driver compiles), else a message naming the GPU, the binary's
    architectures and the fix: a build for this GPU."""
    if variant.arch_runs(info.sass, info.ptx, capability):
        return None
    sm = Arch.capability(capability).sass_name
    return (
        f"{name} holds no code for {gpu} (compute capability {capability}, {sm}): the binary has "
        f"SASS {' '.join(info.sass) or 'none'} and PTX {' '.join(info.ptx) or 'none'}, and none of them "
        f"runs on {sm}. Fix: build it for this GPU: {rebuild_command(capability)}"
    )


def matching_build_info() -> str:
    """A BUILD_INFO string that fits the running torch (what a fresh local build records);
    for tests and diagnostics that need a known-good reference."""
    # optional: importing the package never imports torch
    import torch

    abi = None if sys.platform == "win32" else bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    cuda = torch.version.cuda or "none"
    return json.dumps(
        {
            "format": 1,
            "package_version": __version__,
            "torch_version": torch.__version__,
            "torch_cuda": cuda,
            "nvcc_version": cuda,
            "cxx11_abi": abi,
            "sass": [],
            "ptx": [],
        }
    )
