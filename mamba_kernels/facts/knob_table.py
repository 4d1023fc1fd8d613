"""The knob registry: every ``MAMBA_KERNELS_*`` environment variable (and the three build variables
of other names the build plan parses and docs/BUILDING.md lists with them: TORCH_CUDA_ARCH_LIST,
MAX_JOBS, NVCC_THREADS), one ``Knob`` record each, the one place its name, type, default,
one-line doc and audience are written.

Why here, at the ``facts`` floor, and not in ``runtime/knobs.py``: the registry is data, and a
fact-level module reads a knob too (``facts/release_index.py`` reads ``MAMBA_KERNELS_INDEX``),
while ``facts`` may import nothing of ours above it. Holding the records here lets every floor,
``facts`` included, take a knob's name from one table; ``runtime/knobs.py`` re-exports the table
with the parsers (booleans, choices, numbers), so every other module reads a knob's name and its
parsing from ``runtime.knobs`` as docs/ARCHITECTURE.md says. Standard library only: setup.py
imports the build plan, which imports this, without torch.

Audiences: ``runtime`` (what ``import causal_conv1d`` / ``selective_scan`` reads), ``install``
(the installer, the resolver and the sdist), ``build`` (setup.py and the source build), ``ci``
(the release workflow's scripts in ``ci/``). A knob marked ``internal`` is set by our own code
for a process it starts and is not for users (the docs need not list it).

Kinds: ``bool`` (1/0, true/false, yes/no, on/off in any case), ``choice`` (one of ``values``, the
first the default), ``number``, ``text``, ``paths`` (URLs or directories).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from . import variant

PREFIX = "MAMBA_KERNELS_"
KINDS = ("bool", "choice", "number", "text", "paths")
AUDIENCES = ("runtime", "install", "build", "ci")

# Names of ours with the prefix that are no environment variable: the C macro the build's header
# defines (build/build_info.py writes it, csrc reads it).
BUILD_INFO_MACRO = PREFIX + "BUILD_INFO"


@dataclass(frozen=True)
class Knob:
    name: str
    kind: str  # one of KINDS
    audience: str  # one of AUDIENCES
    doc: str  # one line
    default: Optional[str] = None  # as the user would write it; None: unset means "not given"
    values: Tuple[str, ...] = ()  # a choice's values, the default first
    internal: bool = False  # set by our own code for a process it starts, not by users

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.audience not in AUDIENCES:
            raise ValueError(f"{self.name}: kind {self.kind!r} or audience {self.audience!r} unknown")
        if (self.kind == "choice") != bool(self.values):
            raise ValueError(f"{self.name}: a choice has values, nothing else has")
        if self.kind == "choice" and self.default != self.values[0]:
            raise ValueError(f"{self.name}: a choice's default is its first value")


BINDING_AUTO = "auto"

# ----------------------------------------------------------------------------- runtime
BACKEND = Knob(
    PREFIX + "BACKEND", "choice", "runtime",
    "auto: the CUDA kernel when usable, else PyTorch with one warning; cuda: an unusable kernel is "
    "an error; reference: always PyTorch", "auto", ("auto", "cuda", "reference"))
SCAN_STATES = Knob(
    PREFIX + "SCAN_STATES", "choice", "runtime",
    "what a selective scan keeps for its backward: keep (states every 64 steps), recompute (the "
    "original's share), auto (each API's own choice)", "auto", ("auto", "keep", "recompute"))
MAMBA2_CUDA = Knob(
    PREFIX + "MAMBA2_CUDA", "bool", "runtime",
    "the Mamba-2 ops' CUDA kernels (SSD scan, gated norm) on CUDA tensors; 0 sends CUDA tensors "
    "to the PyTorch path", "1")
SM_COUNT = Knob(
    PREFIX + "SM_COUNT", "number", "runtime",
    "the multiprocessor count the kernels' launch choices assume instead of each device's own "
    "(csrc/common/device_info.h; set by GPU tests to size launches as for another GPU; speed "
    "only, never results; ignored unless a positive integer)", internal=True)

# ----------------------------------------------------------------------------- install
INDEX = Knob(
    PREFIX + "INDEX", "paths", "install",
    "the indexes install, download, resolve, info and the sdist read, whitespace-separated URLs or "
    "folders (default: the release index)")
INDEX_TIMEOUT = Knob(
    PREFIX + "INDEX_TIMEOUT", "number", "install",
    "seconds (above 0, at most 86400) the sdist gives each read of the release index", "20")
TARGET_PYTHON = Knob(
    PREFIX + "TARGET_PYTHON", "text", "install",
    "the interpreter (or environment folder) the sdist installs for, instead of the one it finds")

# ----------------------------------------------------------------------------- build
FORCE_BUILD = Knob(
    PREFIX + "FORCE_BUILD", "bool", "build",
    "build the CUDA extensions or stop with one plain error saying why", "0")
SKIP_CUDA_BUILD = Knob(
    PREFIX + "SKIP_CUDA_BUILD", "bool", "build", "never build the extensions (pure-Python install)", "0")
FORCE_CXX11_ABI = Knob(
    PREFIX + "FORCE_CXX11_ABI", "bool", "build",
    "compile with _GLIBCXX_USE_CXX11_ABI=1 whatever torch reports", "0")
RELEASE = Knob(
    PREFIX + "RELEASE", "bool", "build",
    "a release wheel: version label, torch pin, the support table's architectures, stripped "
    "binaries; implies FORCE_BUILD", "0")
BINDING = Knob(
    PREFIX + "BINDING", "choice", "build",
    "which torch binding a build compiles (auto: stable when the build torch has the stable ABI)",
    BINDING_AUTO, (BINDING_AUTO, variant.STABLE, variant.CLASSIC))
BUILD_FROM_SDIST = Knob(
    PREFIX + "BUILD_FROM_SDIST", "bool", "build",
    "set by the sdist backend around its build: the build's own line goes to stderr only", "0",
    internal=True)
TORCH_CUDA_ARCH_LIST = Knob(
    "TORCH_CUDA_ARCH_LIST", "text", "build", "the architectures to compile, e.g. 8.0;9.0+PTX (always wins)")
MAX_JOBS = Knob("MAX_JOBS", "number", "build", "parallel compile jobs (default: from cores and memory)")
NVCC_THREADS = Knob("NVCC_THREADS", "number", "build", "nvcc threads per job (default: from cores, memory)")

# ----------------------------------------------------------------------------- CI
CI_CELL = Knob(
    PREFIX + "CI_CELL", "text", "ci", "the cell id ci/build_cell.py builds inside cibuildwheel",
    internal=True)
CI_MSVC_TOOLSET = Knob(
    PREFIX + "CI_MSVC_TOOLSET", "text", "ci", "the MSVC toolset version a Windows cell builds with",
    internal=True)
TORCH_DIR = Knob(
    PREFIX + "TORCH_DIR", "paths", "ci",
    "where ci/build_cell.py provision installed the cell's torch, seen by the build and test "
    "environments", internal=True)

KNOBS: Tuple[Knob, ...] = (
    BACKEND, SCAN_STATES, MAMBA2_CUDA, SM_COUNT,
    INDEX, INDEX_TIMEOUT, TARGET_PYTHON,
    FORCE_BUILD, SKIP_CUDA_BUILD, FORCE_CXX11_ABI, RELEASE, BINDING, BUILD_FROM_SDIST,
    TORCH_CUDA_ARCH_LIST, MAX_JOBS, NVCC_THREADS,
    CI_CELL, CI_MSVC_TOOLSET, TORCH_DIR,
)
BY_NAME: Dict[str, Knob] = {k.name: k for k in KNOBS}
if len(BY_NAME) != len(KNOBS):
    raise ValueError("a knob is listed twice")


def of(audience: str, internal: bool = False) -> Tuple[Knob, ...]:
    """The knobs of one audience, in table order; the internal ones only when asked."""
    return tuple(k for k in KNOBS if k.audience == audience and (internal or not k.internal))
