"""The nvcc command lines a cell's build runs, as nvcc itself sees them: torch's extension
builder's compile of our sources with our flags, build_toolchain's probe, and the environment's
NVCC_PREPEND_FLAGS / NVCC_APPEND_FLAGS; and the reading of their single-valued options and host
compiler, which the preflight's nvcc and compiler checks judge."""

from __future__ import annotations

import re
import shlex
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ci import platforms
from mamba_kernels.build import archs as build_archs
from mamba_kernels.build import flags as build_flags
from mamba_kernels.build import toolchain as build_toolchain
from mamba_kernels.facts import support, versions
from mamba_kernels.release import matrix

# nvcc's options that take one value (docs/COMPAT.md §7.3). Given twice, nvcc either stops
# ("redefinition of argument") or keeps the last value with a warning, depending on the release:
# neither is a build to ship, so the preflight refuses any of them twice.
NVCC_SINGLE_VALUED: Tuple[Tuple[str, ...], ...] = support.NVCC_SINGLE_VALUED
# Stand-ins for the paths of one compile (they only need to be words on the command line).
_SRC, _OBJ = "csrc/kernel.cu", "build/kernel.o"


def host_is_msvc(cell: support.Cell) -> bool:
    """Whether nvcc's host compiler for the cell is MSVC (else GCC): torch's flags, the probe's
    and the compiler rules follow from it."""
    return platforms.for_cell(cell).host_compiler == "msvc"


def torch_nvcc_command(cell: support.Cell, ours: Sequence[str], env: Mapping[str, str]) -> List[str]:
    """The arguments torch's extension builder (the cell's build torch) gives nvcc for one of our
    .cu files, as its ninja rule writes them: its common flags, ours, the standard and the host
    compiler where ours name none, the dependency file unless told not to, -c and -o."""
    msvc = host_is_msvc(cell)
    flags = ["-D__CUDA_NO_HALF_OPERATORS__", "--expt-relaxed-constexpr"]
    if msvc:
        flags = ["-Xcompiler", "/MD"] + flags + list(ours)
    else:
        flags += ["--compiler-options", "'-fPIC'"] + list(ours)
    if not any(f.startswith("-std=") for f in flags):
        flags.append(f"-std=c++{cell.cxx_std}")
    cc = env.get("CC")
    build_torch = cell.build_with[0]
    ccbin_since = versions.minor_key(support.TORCH_CCBIN_FROM_CC_SINCE)
    if (not msvc and cc and versions.minor_key(build_torch) >= ccbin_since
            and not any(f.startswith(("-ccbin", "--compiler-bindir")) for f in flags)):
        flags += ["-ccbin", cc]
    deps = [] if env.get("TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES") == "1" else [
        "--generate-dependencies-with-compile", "--dependency-output", _OBJ + ".d"]
    return deps + ["-c", _SRC, "-o", _OBJ] + flags


def our_nvcc_flags(cell: support.Cell) -> List[str]:
    """The nvcc flags our build passes for the cell (mamba_kernels/build/flags.py, release build)."""
    plan = build_archs.choose_archs(arch_list=None, release=True, gpu_capabilities=(), cuda=cell.cuda,
                                    platform=cell.platform)
    return build_flags.compile_flags(platform=cell.platform, cxx_std=cell.cxx_std, nvcc_version=cell.cuda,
                               arch_plan=plan, nvcc_threads=2, release=True, cxx11_abi=cell.cxx11_abi,
                               binding=matrix.binding(cell))["nvcc"]


def nvcc_command_lines(cell: support.Cell, env: Mapping[str, str]) -> Dict[str, List[str]]:
    """What nvcc itself sees, per command the build runs (``build``: torch's compile of our
    sources; ``probe``: build_toolchain's probe before it): NVCC_PREPEND_FLAGS, the command
    line, NVCC_APPEND_FLAGS, which nvcc reads from the environment and joins in that order."""
    pre = shlex.split(env.get("NVCC_PREPEND_FLAGS", ""))
    post = shlex.split(env.get("NVCC_APPEND_FLAGS", ""))
    msvc = host_is_msvc(cell)
    probe = build_toolchain.nvcc_probe_command("nvcc", "probe.cu", cell.cxx_std, env, windows=msvc)[1:]
    return {
        "build": pre + torch_nvcc_command(cell, our_nvcc_flags(cell), env) + post,
        "probe": pre + probe + post,
    }


def option_values(args: Sequence[str]) -> Dict[str, List[str]]:
    """nvcc's single-valued options in ``args``, each with the values given: long name -> values."""
    seen: Dict[str, List[str]] = {}
    i = 0
    while i < len(args):
        word, value, step = args[i], None, 1
        for names in NVCC_SINGLE_VALUED:
            for name in names:
                if word == name:
                    value = args[i + 1] if i + 1 < len(args) else ""
                    step = 2
                elif word.startswith(name + "="):
                    value = word[len(name) + 1:]
                elif name == "-O" and re.fullmatch(r"-O\d", word):
                    value = word[2:]
                if value is not None:
                    seen.setdefault(names[-1], []).append(value)
                    break
            if value is not None:
                break
        i += step
    return seen


def repeated_options(args: Sequence[str]) -> Dict[str, List[str]]:
    """The single-valued options ``args`` give more than once: long name -> values."""
    return {k: v for k, v in option_values(args).items() if len(v) > 1}


def host_compiler_of(args: Sequence[str]) -> Optional[str]:
    """The host compiler an nvcc command line names (its last -ccbin), or None (nvcc's default)."""
    found = None
    for i, w in enumerate(args):
        if w in ("-ccbin", "--compiler-bindir") and i + 1 < len(args):
            found = args[i + 1]
        elif w.startswith(("-ccbin=", "--compiler-bindir=")):
            found = w.split("=", 1)[1]
    return found
