"""A snapshot of the environment the kernels run in: Python, torch, CUDA, GPUs."""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import site
import sys
import sysconfig
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..build import toolchain as build_toolchain
from ..facts import support, variant, versions
from ..facts.version import __version__
from ..runtime import knobs
from ..runtime.dispatch import backends


def _torch_facts() -> Dict[str, Any]:
    try:
        # optional: the report works without torch
        import torch
    except ImportError as e:
        return {"installed": False, "error": str(e)}
    facts: Dict[str, Any] = {
        "installed": True,
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "cuda_available": torch.cuda.is_available(),
    }
    gpus: List[Dict[str, Any]] = []
    if facts["cuda_available"]:
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            gpus.append({"index": i, "name": torch.cuda.get_device_name(i), "capability": f"{major}.{minor}"})
    facts["gpus"] = gpus
    return facts


def snapshot() -> Dict[str, Any]:
    torch_facts = _torch_facts()
    info: Dict[str, Any] = {
        "mamba_kernels": __version__,
        "python": sys.version.split()[0],
        "platform": f"{platform.system()} {platform.machine()}",
        "torch": torch_facts,
        "backend_mode": knobs.backend_mode(),
        "scan_states": knobs.scan_states(),
    }
    if torch_facts.get("installed"):
        info["backends"] = backends(gpus_visible=bool(torch_facts["gpus"]))
    return info


# ----------------------------------------------------------------------------- the target
#
# What the resolver matches wheels against: the Python and platform tags, the torch build
# (version, CUDA, C++ ABI), the GPUs and driver, nvcc and CUDA_HOME. Each field is detected
# from this machine unless given (to ask about another machine). Detection never initialises
# CUDA: GPUs are read through torch only when torch has already initialised CUDA in this
# process, else through ``nvidia-smi`` (NVML) with a timeout, else not at all.

NVIDIA_SMI_TIMEOUT = 10.0
NVCC_TIMEOUT = 20.0
_CUDA_LOCAL_RE = re.compile(r"^cu(\d{2,3})$")
# The architectures of the platforms whose wheels carry manylinux tags (x86_64, aarch64).
_MANYLINUX_ARCHS = tuple(p.tag_arch for p in support.PLATFORM_RECORDS if p.manylinux)
_MANYLINUX_RE = re.compile(r"^manylinux_(\d+)_(\d+)_(" + "|".join(map(re.escape, _MANYLINUX_ARCHS)) + ")$")
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


@dataclass(frozen=True)
class Gpu:
    index: int
    capability: str  # "9.0"
    name: str = ""


@dataclass(frozen=True)
class Target:
    """The environment a wheel is chosen for. ``sources`` says, per field, where it came from
    ("detected", "given", or how it was derived)."""

    python: str  # "3.11"
    platform: Optional[str]  # "linux_x86_64", "linux_aarch64", "win_amd64"; None: one we do not build
    platform_tags: Tuple[str, ...]  # wheel platform tags that install here, most specific first
    torch: Optional[str]  # the full version as given or as torch.__version__ says, None: no torch
    torch_cuda: Optional[str]  # "12.4"; None: a CPU build (or unknown, see sources)
    cxx11_abi: Optional[bool]  # None: unknown or meaningless (Windows)
    gpus: Tuple[Gpu, ...]
    driver: Optional[str] = None  # "575.57.08"
    cuda_home: Optional[str] = None
    cuda_home_how: Optional[str] = None
    nvcc: Optional[str] = None  # CUDA version of nvcc, "13.0"
    sources: Mapping[str, str] = field(default_factory=dict)
    free_threaded: bool = False  # a free-threaded CPython ("3.13t"): no abi3 or cpXY-cpXY wheel loads

    @property
    def gpu_archs(self) -> Tuple[str, ...]:
        """The distinct compute capabilities, in GPU order."""
        return tuple(dict.fromkeys(g.capability for g in self.gpus))

    @property
    def ngc(self) -> bool:
        """An NVIDIA NGC container build of torch (``2.8.0a0+5228986c39.nv25.06``)."""
        return bool(self.torch and re.search(r"\.nv\d+\.\d+", self.torch.split("+", 1)[-1]))

    def as_dict(self) -> Dict[str, Any]:
        return {
            "python": self.python, "platform": self.platform, "platform_tags": list(self.platform_tags),
            "torch": self.torch, "torch_cuda": self.torch_cuda, "cxx11_abi": self.cxx11_abi,
            "gpus": [{"index": g.index, "capability": g.capability, "name": g.name} for g in self.gpus],
            "driver": self.driver, "cuda_home": self.cuda_home, "cuda_home_how": self.cuda_home_how,
            "nvcc": self.nvcc, "ngc": self.ngc, "sources": dict(self.sources),
            "free_threaded": self.free_threaded,
        }


def platform_name(sys_platform: str, machine: str) -> Optional[str]:
    """Our platform name for ``sys.platform`` and ``platform.machine()``; None for any other."""
    return support.platform_of(sys_platform, machine)


def _manylinux_version(tag: str) -> Optional[Tuple[Tuple[int, int], str]]:
    """((glibc major, minor), arch) of a manylinux tag, legacy aliases included; else None."""
    m = _MANYLINUX_RE.match(tag)
    if m:
        return (int(m.group(1)), int(m.group(2))), m.group(3)
    for legacy, glibc in _LEGACY_MANYLINUX.items():
        for arch in _MANYLINUX_ARCHS:
            if tag == f"{legacy}_{arch}":
                return glibc, arch
    return None


def _platform_aliases() -> Dict[str, str]:
    """The other names ``--platform`` takes for our platforms: the OS (``linux``, ``windows``:
    its first platform), the name's first part (``win``), and for a manylinux platform its tag
    architecture (``aarch64``) and ``linux_<machine>`` for each of its machine names."""
    out: Dict[str, str] = {}
    for p in support.PLATFORM_RECORDS:
        names = [p.os, p.name.split("_", 1)[0]]
        if p.manylinux:
            names += [p.tag_arch] + [f"{p.markers['sys_platform']}_{m}" for m in p.machines]
        for n in names:
            out.setdefault(n, p.name)
    return out


_ALIASES = _platform_aliases()


def platform_tags_for(tag: str) -> Tuple[Optional[str], Tuple[str, ...]]:
    """(our platform name, the wheel platform tags that install there) for a platform given on
    the command line: one of our names (any glibc), a wheel platform tag such as
    ``manylinux_2_28_x86_64`` (glibc 2.28: that tag and every older one), or ``win_amd64``."""
    text = tag.strip().lower().replace("-", "_")
    text = _ALIASES.get(text, text)
    record = support.PLATFORM_BY_NAME.get(text)
    if record is not None and not record.manylinux:
        return text, (text,)
    if record is not None:
        return text, (f"manylinux_2_*_{record.tag_arch}", record.name)  # any glibc
    found = _manylinux_version(text)
    if found is None:
        raise ValueError(
            f"--platform must be one of {', '.join(support.PLATFORMS)} or a wheel platform tag such "
            f"as manylinux_2_28_x86_64, got {tag!r}"
        )
    (gmaj, gmin), arch = found
    tags = [f"manylinux_{gmaj}_{m}_{arch}" for m in range(gmin, -1, -1)]
    tags += [f"{legacy}_{arch}" for legacy, g in _LEGACY_MANYLINUX.items() if g <= (gmaj, gmin)]
    name = next(p.name for p in support.PLATFORM_RECORDS if p.manylinux and p.tag_arch == arch)
    return name, tuple(tags + [name])


def glibc_version() -> Optional[Tuple[int, int]]:
    """The C library's glibc version on Linux, None for another C library (or OS)."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        text = ""
    m = re.match(r"glibc (\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def local_platform_tags(plat: Optional[str]) -> Tuple[str, ...]:
    """The wheel platform tags that install on this machine (of the platforms we build for)."""
    if plat is None:
        return (f"{sys.platform}_{platform.machine().lower()}",)
    record = support.PLATFORM_BY_NAME[plat]
    if not record.manylinux:
        return (plat,)
    glibc = glibc_version()
    if glibc is None:  # musl or unknown: no manylinux wheel installs
        return (plat,)
    return platform_tags_for(f"manylinux_{glibc[0]}_{glibc[1]}_{record.tag_arch}")[1]


def tag_installs(wheel_tag: str, platform_tags: Sequence[str]) -> bool:
    """Whether a wheel platform tag (dotted compressed tags allowed) is among ``platform_tags``
    (where ``manylinux_2_*_<arch>`` stands for every manylinux tag of that arch)."""
    for t in wheel_tag.split("."):
        found = _manylinux_version(t)
        for p in platform_tags:
            if t == p or (p.startswith("manylinux_2_*_") and found and found[1] == p[len("manylinux_2_*_"):]):
                return True
    return False


def cuda_of_torch_version(version: str) -> Optional[str]:
    """The CUDA version in a torch version's local label: ``2.4.1+cu121`` -> ``12.1``;
    None when the label does not say (``+cpu`` is reported as "cpu")."""
    local = version.split("+", 1)[1] if "+" in version else ""
    if local == "cpu" or local.startswith("cpu."):
        return "cpu"
    m = _CUDA_LOCAL_RE.match(local.split(".")[0])
    if not m:
        return None
    digits = m.group(1)
    return f"{int(digits[:-1])}.{int(digits[-1])}"


def parse_gpu_archs(text: str) -> Tuple[str, ...]:
    """``8.0,9.0`` (or ``80 90``, ``sm_90``) -> ("8.0", "9.0")."""
    out = []
    for item in re.split(r"[,;\s]+", text.strip()):
        if not item:
            continue
        raw = item.lower()
        for prefix in ("sm_", "compute_"):
            raw = raw[len(prefix):] if raw.startswith(prefix) else raw
        if re.fullmatch(r"\d+\.\d", raw):
            out.append(f"{int(raw.split('.')[0])}.{raw.split('.')[1]}")
        elif re.fullmatch(r"\d{2,3}", raw):
            out.append(f"{int(raw[:-1])}.{raw[-1]}")
        else:
            raise ValueError(f"--gpu-arch must be compute capabilities like '8.0,9.0', got {item!r}")
    return tuple(dict.fromkeys(out))


def parse_nvidia_smi(text: str) -> Tuple[Tuple[Gpu, ...], Optional[str]]:
    """GPUs and driver version from ``nvidia-smi --query-gpu=compute_cap,driver_version,name
    --format=csv,noheader`` output."""
    gpus, driver = [], None
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not re.fullmatch(r"\d+\.\d+", parts[0]):
            continue
        gpus.append(Gpu(len(gpus), parts[0], parts[2] if len(parts) > 2 else ""))
        driver = driver or parts[1]
    return tuple(gpus), driver


Runner = Callable[[Sequence[str], float], Tuple[int, str]]


def _nvidia_smi(runner: Runner) -> Tuple[Tuple[Gpu, ...], Optional[str]]:
    rc, out = runner(["nvidia-smi", "--query-gpu=compute_cap,driver_version,name",
                      "--format=csv,noheader"], NVIDIA_SMI_TIMEOUT)
    return parse_nvidia_smi(out) if rc == 0 else ((), None)


def _torch_build() -> Optional[Tuple[str, Optional[str], Optional[bool], Any]]:
    """(version, CUDA, C++ ABI, module) of the importable torch, None without one."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return None
    try:
        # optional: the report works without torch
        import torch
    except Exception:  # a broken torch is no torch to match against
        return None
    abi = getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", None)
    return torch.__version__, torch.version.cuda, None if abi is None else bool(abi), torch


def _gpus_from_torch(torch: Any) -> Optional[Tuple[Gpu, ...]]:
    """GPUs through torch, only when torch has already initialised CUDA in this process."""
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        out = []
        for i in range(torch.cuda.device_count()):
            major, mi = torch.cuda.get_device_capability(i)
            out.append(Gpu(i, f"{major}.{mi}", torch.cuda.get_device_name(i)))
        return tuple(out)
    except Exception:
        return None


def detect(
    *,
    torch: Optional[str] = None,
    cuda: Optional[str] = None,
    python: Optional[str] = None,
    platform_tag: Optional[str] = None,
    cxx11_abi: Optional[bool] = None,
    gpu_archs: Optional[Sequence[str]] = None,
    toolchain: bool = True,
    environ: Optional[Mapping[str, str]] = None,
    runner: Optional[Runner] = None,
) -> Target:
    """The target environment: every argument given overrides what this machine says.

    ``torch`` is a full version (``2.4.1``, ``2.4.1+cu121``, ``2.8.0a0+5228986c39.nv25.06``).
    Without ``cuda`` the CUDA version comes from the ``+cuXYZ`` of ``torch``, else from the
    installed torch when it is that release, else from the support table when torch shipped
    one CUDA variant only. Without ``cxx11_abi``: the installed torch's when it is that build,
    cxx11 for an NGC build, else the support table's ABI of that torch/CUDA/platform.
    """

    environ = os.environ if environ is None else environ
    runner = runner or build_toolchain.run
    src: Dict[str, str] = {}  # where each field came from, in the order they are decided
    py, free_threaded = _python(python, src)
    plat, ptags = _platform(platform_tag, src)
    installed, tv, same_build = _torch(torch, src)
    torch_module = installed[3] if installed else sys.modules.get("torch")
    tcuda = _torch_cuda(cuda, tv, same_build, installed, plat, src)
    abi = _cxx11_abi(cxx11_abi, tv, tcuda, same_build, installed, plat, src)
    gpus, driver = _gpus(gpu_archs, torch_module, runner, src)
    home, how, nvcc = _toolkit(environ, runner) if toolchain else (None, None, None)
    return Target(python=py, platform=plat, platform_tags=tuple(ptags), torch=tv, torch_cuda=tcuda,
                  cxx11_abi=abi, gpus=tuple(gpus), driver=driver, cuda_home=home, cuda_home_how=how,
                  nvcc=nvcc, sources=src, free_threaded=free_threaded)


_Installed = Optional[Tuple[str, Optional[str], Optional[bool], Any]]  # what _torch_build returns


def _python(python: Optional[str], src: Dict[str, str]) -> Tuple[str, bool]:
    """(major.minor, free-threaded) of the target's Python."""
    if python is not None:
        free_threaded = python.strip().endswith("t")  # "3.13t", as the wheel tag cp313t writes it
        src["python"] = "given"
        return versions.minor(python.strip()[:-1] if free_threaded else python, "--python"), free_threaded
    src["python"] = "detected"
    return f"{sys.version_info[0]}.{sys.version_info[1]}", bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def _platform(platform_tag: Optional[str], src: Dict[str, str]) -> Tuple[Optional[str], Sequence[str]]:
    """(our platform name, the wheel platform tags that install there)."""
    if platform_tag is not None:
        src["platform"] = "given"
        return platform_tags_for(platform_tag)
    plat = platform_name(sys.platform, platform.machine())
    src["platform"] = "detected"
    return plat, local_platform_tags(plat)


def _torch(torch: Optional[str], src: Dict[str, str]) -> Tuple[_Installed, Optional[str], bool]:
    """(the installed torch build, the target's torch version, whether the two are one build).
    A given version describes the target as it is; the installed torch is then not imported
    (it may not be the target's, and importing it takes seconds)."""
    installed = _torch_build() if torch is None else None
    if torch is not None:
        src["torch"] = "given"
        return installed, variant.check_torch_version(torch, "--torch"), False
    if installed is not None:
        src["torch"] = "detected"
        return installed, installed[0], True
    src["torch"] = "not installed"
    return installed, None, False


def _torch_cuda(cuda: Optional[str], tv: Optional[str], same_build: bool, installed: _Installed,
                plat: Optional[str], src: Dict[str, str]) -> Optional[str]:
    """torch's CUDA: given, from the version's +cuXYZ, the installed build's, or the table's."""
    tcuda: Optional[str] = None
    if cuda is not None:
        text = cuda.strip().lower()
        tcuda = None if text in ("none", "cpu") else support.cuda_major_minor(text)
        src["torch_cuda"] = "given"
    elif tv is not None:
        from_label = cuda_of_torch_version(tv)
        if from_label == "cpu":
            src["torch_cuda"] = "from the torch version (+cpu)"
        elif from_label is not None:
            tcuda, src["torch_cuda"] = from_label, "from the torch version"
        elif same_build and installed is not None:
            tcuda = support.cuda_major_minor(installed[1]) if installed[1] else None
            src["torch_cuda"] = "detected"
        else:
            tcuda, src["torch_cuda"] = _table_cuda(tv, plat)
    return tcuda


def _cxx11_abi(cxx11_abi: Optional[bool], tv: Optional[str], tcuda: Optional[str], same_build: bool,
               installed: _Installed, plat: Optional[str], src: Dict[str, str]) -> Optional[bool]:
    """torch's C++ ABI: given, the installed build's, cxx11 for NGC, else the support table's."""
    abi: Optional[bool] = None
    if cxx11_abi is not None:
        abi, src["cxx11_abi"] = bool(cxx11_abi), "given"
    elif (plat is not None and support.PLATFORM_BY_NAME[plat].cxx11_abi is None) or tv is None:
        src["cxx11_abi"] = "n/a"
    elif same_build and installed is not None and installed[2] is not None and (
            tcuda == (support.cuda_major_minor(installed[1]) if installed[1] else None)):
        abi, src["cxx11_abi"] = installed[2], "detected"
    elif re.search(r"\.nv\d+\.\d+", tv.split("+", 1)[-1]):
        abi, src["cxx11_abi"] = True, "NGC builds use the cxx11 ABI"
    else:
        abi = _table_abi(tv, tcuda, plat)
        src["cxx11_abi"] = "from the support table" if abi is not None else "unknown (give --cxx11-abi)"
    return abi


def _gpus(gpu_archs: Optional[Sequence[str]], torch_module: Any, runner: Runner,
          src: Dict[str, str]) -> Tuple[Sequence[Gpu], Optional[str]]:
    """(the GPUs, the driver version): given, from torch when it initialised CUDA, else nvidia-smi."""
    driver = None
    if gpu_archs is not None:
        gpus: Sequence[Gpu] = tuple(Gpu(i, c) for i, c in enumerate(gpu_archs))
        src["gpus"] = "given"
    else:
        from_torch = _gpus_from_torch(torch_module)
        if from_torch is not None:
            gpus, src["gpus"] = from_torch, "detected (torch, CUDA already initialised)"
        else:
            gpus, driver = _nvidia_smi(runner)
            src["gpus"] = "detected (nvidia-smi)" if gpus else "none visible (nvidia-smi)"
    if driver is None and gpu_archs is None and gpus:
        driver = _nvidia_smi(runner)[1]
    return gpus, driver


def _toolkit(environ: Mapping[str, str], runner: Runner
             ) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """(CUDA_HOME, how it was found, its nvcc's version)."""
    home = how = nvcc = None
    paths = [p for p in (getattr(site, "getsitepackages", lambda: [])() or [])]
    found = build_toolchain.find_cuda_home(environ, search_paths=paths)
    if found is not None:
        home, how = found.path, found.how
        exe = os.path.join(home, "bin", "nvcc.exe" if sys.platform == "win32" else "nvcc")
        if os.path.isfile(exe):
            rc, out = runner([exe, "--version"], NVCC_TIMEOUT)
            nvcc = build_toolchain.parse_nvcc_version(out) if rc == 0 else None
    return home, how, nvcc


def _table_cuda(torch: str, platform: Optional[str]) -> Tuple[Optional[str], str]:
    """The CUDA of a torch version without a ``+cuXYZ`` label: on Linux x86_64 the plain PyPI
    wheel's CUDA; elsewhere the release's one CUDA variant, when it has one."""
    try:
        rel = support.torch_release(torch)
    except ValueError:
        return None, "unknown (give --cuda)"
    if platform is not None and support.PLATFORM_BY_NAME[platform].pypi_wheel:
        return rel.pypi_cuda, "from the support table (the CUDA of torch's PyPI wheel)"
    variants = rel.cuda.get(platform or "", ())
    if len(variants) == 1:
        return variants[0], "from the support table (the one CUDA variant of this torch)"
    return None, "unknown (give --cuda)"


def _table_abi(torch: str, cuda: Optional[str], platform: Optional[str]) -> Optional[bool]:
    if platform is None or cuda is None:
        return None
    try:
        rel = support.torch_release(torch)
        per_release = support.PLATFORM_BY_NAME[platform].cxx11_abi == "per release"
        return rel.cxx11_abi(cuda, platform) if not per_release or cuda in rel.linux_cxx11_abi else None
    except (ValueError, KeyError):
        return None
