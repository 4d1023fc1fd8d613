"""The source build of the CUDA extensions: knobs and the decision to build (the torch it reads
is build/torch_env.py's, the binding it compiles build/binding.py's, its jobs and flags
build/flags.py's, its sources build/sources.py's, BUILD_INFO build/build_info.py's).

setup.py calls build/setup_glue.py's setup_kwargs, which follows :func:`make_plan`; everything
here is a pure function over plain facts so it can be tested without torch, nvcc or a GPU.
Importing this module does not import torch; gathering the facts of the running environment
does.

Knobs (booleans as mamba_kernels.runtime.knobs parses them):
  MAMBA_KERNELS_FORCE_BUILD      build or fail with a plain error (no silent pure-Python install)
  MAMBA_KERNELS_SKIP_CUDA_BUILD  never build the extensions
  MAMBA_KERNELS_FORCE_CXX11_ABI  compile with _GLIBCXX_USE_CXX11_ABI=1 whatever torch reports
  MAMBA_KERNELS_BINDING          auto | stable | classic: which torch binding the extensions use
                                 (docs/STABLE_ABI.md); auto: stable when the build torch is at
                                 least the stable ABI target (support.STABLE_ABI_MIN_TORCH)
  MAMBA_KERNELS_RELEASE          a release wheel: version label + torch pin, the support table's
                                 architectures, stripped binaries; implies FORCE_BUILD
  TORCH_CUDA_ARCH_LIST           architectures, e.g. "8.0;9.0+PTX" (see build_archs)
  MAX_JOBS, NVCC_THREADS         parallel compile jobs, nvcc threads per job

With a CUDA torch but no GPU visible, the extensions are built only when asked
(TORCH_CUDA_ARCH_LIST, MAMBA_KERNELS_FORCE_BUILD or MAMBA_KERNELS_RELEASE): :func:`arch_decision`,
the sdist backend's rule too. One line says what is built or why nothing is (:func:`show`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..facts import support, variant
from ..facts.variant import CLASSIC, STABLE
from ..facts.version import __version__
from ..runtime import knobs, terminal
from . import archs as build_archs
from . import binding as build_binding
from . import build_info as binfo
from . import flags as build_flags
from . import sources as build_sources
from . import toolchain as build_toolchain
from . import torch_env

# The build's knobs, named in the registry (runtime/knobs.py).
FORCE_BUILD_VAR = knobs.FORCE_BUILD_VAR
SKIP_BUILD_VAR = knobs.SKIP_BUILD_VAR
FORCE_CXX11_ABI_VAR = knobs.FORCE_CXX11_ABI_VAR
RELEASE_VAR = knobs.RELEASE_VAR
MAX_JOBS_VAR = knobs.MAX_JOBS_VAR
# Set by the sdist backend around the source build it runs: the backend shows its own line, so
# the build's line goes to stderr only (the installer shows it with -v).
FROM_SDIST_VAR = knobs.FROM_SDIST_VAR
NVCC_THREADS_VAR = knobs.NVCC_THREADS_VAR

class BuildError(RuntimeError):
    """A source build was required (FORCE_BUILD or RELEASE) and cannot happen."""


# ----------------------------------------------------------------------------- knobs


@dataclass(frozen=True)
class BuildKnobs:
    force: bool = False
    skip: bool = False
    force_cxx11_abi: bool = False
    release: bool = False
    arch_list: Optional[str] = None
    max_jobs: Optional[int] = None
    nvcc_threads: Optional[int] = None
    binding: str = "auto"

    @property
    def must_build(self) -> bool:
        return self.force or self.release


def read_knobs(environ: Mapping[str, str]) -> BuildKnobs:
    """Parse the build knobs; contradictory or malformed values are a ValueError."""
    k = BuildKnobs(
        force=knobs.env_bool(FORCE_BUILD_VAR, environ=environ),
        skip=knobs.env_bool(SKIP_BUILD_VAR, environ=environ),
        force_cxx11_abi=knobs.env_bool(FORCE_CXX11_ABI_VAR, environ=environ),
        release=knobs.env_bool(RELEASE_VAR, environ=environ),
        arch_list=environ.get(build_archs.ARCH_LIST_VAR) or None,
        max_jobs=knobs.env_positive_int(MAX_JOBS_VAR, environ),
        nvcc_threads=knobs.env_positive_int(NVCC_THREADS_VAR, environ),
        binding=knobs.binding_choice(environ),
    )
    if k.skip and k.must_build:
        other = RELEASE_VAR if k.release else FORCE_BUILD_VAR
        raise ValueError(f"{SKIP_BUILD_VAR} and {other} are both on: set only one of them")
    if k.arch_list is not None:
        build_archs.parse_arch_list(k.arch_list)  # fail early on a typo
    return k


# ----------------------------------------------------------------------------- the plan


@dataclass
class Plan:
    """What setup.py does: the version, the torch requirement, and the extensions (if any)."""

    version: str
    install_requires: List[str]
    build: bool
    notice: str = ""  # why nothing is built (pure-Python install)
    progress: str = ""  # the one line describing the build
    sources: Dict[str, List[str]] = field(default_factory=dict)
    flags: Dict[str, List[str]] = field(default_factory=dict)
    include_dirs: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)  # environment for torch's build_ext
    force_cxx11_abi: bool = False
    info: Dict[str, Any] = field(default_factory=dict)
    binding: str = CLASSIC


def install_requires(release_torch: Optional[str] = None, binding: str = CLASSIC) -> List[str]:
    """The wheel's Requires-Dist: torch only. A classic release wheel pins the torch release it
    was built against (``torch==2.14.*``), a stable one needs its target or newer
    (``torch>=2.10``), any other build needs torch >= torch_env.MIN_TORCH.

    Nothing else belongs here: at run time the packages import only torch and the standard
    library, and the install commands in README.md resolve our wheel from a variant index that
    serves this project alone, torch from torch's own index or the user's environment. Any other
    requirement would make those commands fail (tests/test_install_commands.py installs from a
    served index and checks the imports against this list)."""
    if release_torch is not None:
        if binding == STABLE:
            return [variant.stable_torch_requirement(build_binding.STABLE_TARGET)]
        return [variant.torch_requirement(release_torch)]
    return [f"torch>={torch_env.MIN_TORCH[0]}.{torch_env.MIN_TORCH[1]}"]


def arch_decision(k: BuildKnobs, gpus: Sequence[str]) -> Tuple[bool, str]:
    """(anything to build for?, why) given the knobs and the visible GPUs' capabilities ("9.0"):
    TORCH_CUDA_ARCH_LIST, the visible GPUs, a release build (the support table's list) or
    MAMBA_KERNELS_FORCE_BUILD (the default list); with none of them, no build: compiling every
    architecture for a machine without a GPU takes many minutes nobody asked for."""
    if k.arch_list:
        return True, f"for {build_archs.ARCH_LIST_VAR}={k.arch_list}"
    if gpus:
        return True, "for the visible GPUs (sm " + ", ".join(gpus) + ")"
    if k.release:
        return True, f"{RELEASE_VAR} is on (the support table's architectures)"
    if k.force:
        return True, f"{FORCE_BUILD_VAR} is on (no GPU visible: the default architectures)"
    return False, (f"no GPU is visible to build for (set {build_archs.ARCH_LIST_VAR}, e.g. '9.0', "
                   f"or {FORCE_BUILD_VAR}=1 to build without one)")


def show(line: str, environ: Mapping[str, str]) -> None:
    """The build's one line, on stderr (the build's log) and, when stderr is not the terminal
    (pip and uv capture it and hide a successful build's output), on the terminal too; inside
    the sdist backend's build, which shows its own line, on stderr only."""
    if not knobs.env_bool(FROM_SDIST_VAR, environ=environ) and not _isatty(sys.stderr):
        terminal.to_terminal(line, environ)
    print(line, file=sys.stderr, flush=True)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _pure(k: BuildKnobs, why: str, force_makes_it_an_error: bool = True) -> Plan:
    if k.must_build:
        knob = RELEASE_VAR if k.release else FORCE_BUILD_VAR
        raise BuildError(f"{knob} is on but the CUDA extensions cannot be built: {why}")
    hint = f" Set {FORCE_BUILD_VAR}=1 to make this an error." if force_makes_it_an_error else ""
    return Plan(
        __version__,
        install_requires(),
        build=False,
        notice=f"mamba-kernels: installing without the CUDA extensions (the PyTorch path runs): {why}.{hint}",
    )


def make_plan(root: str, environ: Mapping[str, str]) -> Plan:
    """Decide whether and how to build; raises BuildError when a build is required and blocked.
    Each step gives the next what it needs, or the plan for the pure-Python package and why."""
    k = read_knobs(environ)
    torch = _buildable_torch(root, k)
    if isinstance(torch, Plan):
        return torch
    binding = build_binding.choose_binding(k.binding, torch.version)
    sources = build_sources.kernel_sources(root, binding)
    assert torch.cuda is not None
    platform = torch_env.current_platform()
    tools = _usable_toolchain(k, torch, environ, platform)
    if isinstance(tools, Plan):
        return tools
    arch_plan = build_archs.choose_archs(
        arch_list=k.arch_list,
        release=k.release,
        gpu_capabilities=torch.gpu_capabilities,
        cuda=torch.cuda,
        platform=platform,
    )
    problem = build_archs.unsupported(arch_plan, tools.nvcc_archs, tools.nvcc_version)
    if problem:
        return _pure(k, problem)
    return _build_plan(root, k, torch, binding, sources, platform, tools, arch_plan)


def _buildable_torch(root: str, k: BuildKnobs) -> Union[torch_env.TorchFacts, Plan]:
    """The torch to build against, or the pure plan: the knobs, the sources, torch itself and
    the architecture decision may each say there is nothing to build."""
    if k.skip:
        return _pure(k, f"{SKIP_BUILD_VAR} is on")
    if not build_sources.kernel_sources(root):
        return _pure(k, f"no kernel sources in {os.path.join(root, 'csrc')}")
    torch, why = torch_env.gather_torch_facts()
    if torch is None:
        return _pure(k, why or "torch is not importable")
    problem = torch_env.torch_problem(torch)
    if problem:
        return _pure(k, problem)
    wanted, why = arch_decision(k, [f"{a}.{b}" for a, b in torch.gpu_capabilities])
    if not wanted:  # FORCE_BUILD would build (the default architectures), not fail
        return _pure(k, why, force_makes_it_an_error=False)
    return torch


@dataclass(frozen=True)
class _Toolchain:
    """What the build compiles with: the toolkit, its nvcc, the host compiler, the C++ standard."""

    home: build_toolchain.CudaHome
    nvcc_version: str
    nvcc_archs: List[str]
    cxx_std: int
    cxx: str
    compiler: Optional[Tuple[str, str]]  # (family, version)


def _usable_toolchain(k: BuildKnobs, torch: torch_env.TorchFacts, environ: Mapping[str, str],
                      platform: str) -> Union[_Toolchain, Plan]:
    """The CUDA toolkit and host compiler, each probed, or the pure plan saying which is unusable."""
    assert torch.cuda is not None
    site = [p for p in sys.path if p.endswith("site-packages")]
    home = build_toolchain.find_cuda_home(environ, search_paths=site)
    if home is None:
        return _pure(k, "no CUDA toolkit found (set CUDA_HOME, or put nvcc on PATH)")
    problem = build_toolchain.toolkit_problem(home.path, platform)
    if problem:
        return _pure(k, f"the CUDA toolkit at {home.path} (from {home.how}) is unusable: {problem}")
    nvcc_version, nvcc_archs = build_toolchain.nvcc_facts(home.path)
    if nvcc_version is None:
        return _pure(k, f"cannot read the version of {home.path}/bin/nvcc")
    problem = torch_env.cuda_major_problem(nvcc_version, torch.cuda, home.path)
    if problem:
        return _pure(k, problem)
    cxx_std = torch_env.required_cxx_std(torch.version)
    problem = build_toolchain.probe_nvcc(home.path, cxx_std, environ, nvcc_version)
    cxx, compiler = build_toolchain.host_compiler(environ)
    problem = problem or build_toolchain.probe_torch_headers(cxx, cxx_std, torch.include_dir)
    if problem:
        return _pure(k, problem)
    return _Toolchain(home, nvcc_version, nvcc_archs, cxx_std, cxx, compiler)


def _release_version(k: BuildKnobs, torch: torch_env.TorchFacts, binding: str, cxx11_abi: bool
                     ) -> Tuple[str, List[str]]:
    """(the version, the requirements): a release build's carry its label and its torch pin."""
    assert torch.cuda is not None
    if k.release and binding == STABLE:
        return (variant.stable_release_version(__version__, torch.cuda, build_binding.STABLE_TARGET),
                install_requires(release_torch=torch.version, binding=binding))
    if k.release:
        return (variant.release_version(__version__, torch.version, torch.cuda, cxx11_abi),
                install_requires(release_torch=torch.version))
    return __version__, install_requires()


def _build_plan(root: str, k: BuildKnobs, torch: torch_env.TorchFacts, binding: str,
                sources: Dict[str, List[str]], platform: str, tools: _Toolchain,
                arch_plan: build_archs.ArchPlan) -> Plan:
    """The plan of a build: jobs, flags, version, BUILD_INFO, the progress line, the environment."""
    home, nvcc_version, cxx_std = tools.home, tools.nvcc_version, tools.cxx_std
    cxx11_abi = True if k.force_cxx11_abi else torch.cxx11_abi
    n_targets = len(arch_plan.sass) + len(arch_plan.ptx)
    jobs, threads = build_flags.choose_parallelism(
        os.cpu_count() or 1, build_flags.available_memory(), n_targets, k.max_jobs, k.nvcc_threads
    )
    flags = build_flags.compile_flags(
        platform=platform, cxx_std=cxx_std, nvcc_version=nvcc_version, arch_plan=arch_plan,
        nvcc_threads=threads, release=k.release, cxx11_abi=cxx11_abi, binding=binding,
    )
    compiler_text = " ".join(tools.compiler) if tools.compiler else tools.cxx
    version, requires = _release_version(k, torch, binding, cxx11_abi)
    info = binfo.build_info(
        torch=torch, nvcc_version=nvcc_version, cxx11_abi=cxx11_abi, host_compiler=compiler_text,
        cxx_std=cxx_std, arch_plan=arch_plan, platform=platform, revision=binfo.source_revision(root),
        release=k.release, version=version, binding=binding,
    )
    progress = (
        f"mamba-kernels: building {', '.join(k_ + '._cuda' for k_ in sources)} for {arch_plan.describe()}; "
        f"nvcc {nvcc_version} ({home.path}, {home.how}), {compiler_text}, c++{cxx_std}, "
        f"torch {torch.version} ({variant.abi_name(cxx11_abi)} ABI); {build_binding.binding_text(binding)}; "
        f"{jobs} jobs x {threads} nvcc threads; "
        f"{'release' if k.release else 'development'} flags: nvcc {' '.join(flags['nvcc'])}; "
        f"cxx {' '.join(flags['cxx'])}; link {' '.join(flags['link']) or '-'}"
    )
    env = {
        "CUDA_HOME": home.path,  # before torch.utils.cpp_extension reads it (wrapper-script trap)
        MAX_JOBS_VAR: str(jobs),
        # Our -gencode flags make torch skip its own arch guessing; keep its knob consistent.
        build_archs.ARCH_LIST_VAR: ";".join(str(a) for a in arch_plan.sass),
    }
    gen = os.path.join(root, binfo.GENERATED_DIR)
    return Plan(
        version, requires, build=True, progress=progress, sources=sources, flags=flags,
        include_dirs=[os.path.join(root, "csrc", "common"), gen], env=env,
        force_cxx11_abi=k.force_cxx11_abi, info=info, binding=binding,
    )


# ----------------------------------------------------------------------------- binding-only compile


def compile_binding(root: str, binding: str, environ: Mapping[str, str]) -> int:
    """Compile (every check of a compile, no code generated: ``-fsyntax-only``) the translation
    units of ``binding`` alone with the flags and include paths a build of it would use: the
    compile check's way to keep the binding it does not build compilable. Linux host compilers
    only; returns the number of files that failed."""
    if support.PLATFORM_BY_NAME[torch_env.current_platform()].os == "windows":
        raise BuildError("the binding-only compile runs with GCC or Clang (Linux)")
    env = dict(environ)
    env[knobs.BINDING_VAR] = binding
    env[FORCE_BUILD_VAR] = "1"
    env.pop(RELEASE_VAR, None)
    try:
        plan = make_plan(root, env)
    except ValueError as e:
        raise BuildError(str(e)) from None
    os.environ.update(plan.env)
    # optional: setup.py imports this module before torch may be installed
    from torch.utils import cpp_extension

    cpp_extension.CUDA_HOME = plan.env["CUDA_HOME"]
    cxx, _ = build_toolchain.host_compiler(environ)
    includes = plan.include_dirs + cpp_extension.include_paths(device_type="cuda")
    includes.append(sysconfig.get_paths()["include"])
    flags = list(plan.flags["cxx"]) + ["-fPIC", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    flags.append("-DTORCH_EXTENSION_NAME=_cuda")  # the stable binding's Py_LIMITED_API is in plan.flags
    failed = 0
    for src in build_sources.binding_only_sources(root, binding):
        cmd = [cxx, "-fsyntax-only", *flags, *(f"-I{d}" for d in includes), src]
        if subprocess.run(cmd).returncode != 0:
            where = os.path.relpath(src, root)
            print(f"mamba-kernels: {where} does not compile ({binding} binding)", file=sys.stderr)
            failed += 1
    return failed


def checkout_root() -> str:
    """The source tree this module sits in (mamba_kernels/build/plan.py -> the checkout), whose
    csrc/ --compile-binding compiles."""
    return str(Path(__file__).resolve().parents[2])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mamba_kernels.build.plan")
    parser.add_argument("--compile-binding", choices=(STABLE, CLASSIC), required=True,
                        help="compile that binding's own translation units (no kernels, no link)")
    args = parser.parse_args(argv)
    root = checkout_root()
    try:
        return 1 if compile_binding(root, args.compile_binding, os.environ) else 0
    except BuildError as e:
        print(f"mamba-kernels: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
