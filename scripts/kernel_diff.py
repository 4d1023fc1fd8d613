"""Whether a change to a kernel source changed the code it compiles to: each .cu file compiled at a
git revision and in the working tree with the same flags, and every kernel's SASS compared.

    python3 scripts/kernel_diff.py REV FILE.cu [FILE.cu ...] [--arch 90] [--arch 80]

Per kernel (demangled) it prints one of
    identical          the same SASS, byte for byte (names of anonymous namespaces aside)
    renamed            the same instructions in the same order up to register numbers
    same-set           the same instructions up to register numbers and branch targets, placed
                       differently (a block moved)
    differs            anything else, with the instruction counts
and ptxas's registers and spill bytes before -> after. A refactor that claims to leave a kernel
as it was (a kernel split into phases, say) shows `identical` and needs no new timing.

Needs nvcc (CUDA_HOME, default /usr/local/cuda) and cuobjdump: CUDA_HOME/bin, PATH, or the
nvidia-cuda-cuobjdump wheel (pip install nvidia-cuda-cuobjdump). The flags are the kernels' own
defines (the half/bfloat16 operator switches torch adds, relaxed constexpr, C++20, -O3), not a
whole build's; both sides get the same ones.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFINES = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
           "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr",
           "-std=c++20", "-O3"]
_INSN = re.compile(r"/\*[0-9a-f]{4}\*/\s+(.*?);")


def find_tool(name: str, cuda_home: str) -> Optional[str]:
    """CUDA_HOME/bin/name, then PATH, then an nvidia-cuda-* wheel's copy on sys.path."""
    for cand in [os.path.join(cuda_home, "bin", name), shutil.which(name)]:
        if cand and os.path.isfile(cand):
            return cand
    for base in sys.path:
        hits = sorted(glob.glob(os.path.join(base, "nvidia", "cu*", "bin", name)))
        if hits:
            return hits[-1]
    return None


def parse_sass(text: str) -> Dict[str, List[str]]:
    """{'sm_XX mangled-name': its instructions}, one entry per kernel and architecture."""
    out: Dict[str, List[str]] = {}
    arch = "sm_?"
    for block in re.split(r"\n\s*(?=Fatbin elf code:|Function : )", text):
        m = re.search(r"arch = (sm_\d+)", block)
        if m:
            arch = m.group(1)
        if block.lstrip().startswith("Function : "):
            name = block.lstrip()[len("Function : "):].split("\n", 1)[0].strip()
            out[f"{arch} {name}"] = [" ".join(i.split()) for i in _INSN.findall(block)]
    return out


def classify(before: Sequence[str], after: Sequence[str]) -> str:
    if list(before) == list(after):
        return "identical"
    regs = lambda ins: [re.sub(r"\bU?R\d+\b", "R", i) for i in ins]  # noqa: E731
    if regs(before) == regs(after):
        return "renamed"
    targets = lambda ins: [re.sub(r"0x[0-9a-f]+", "X", i) for i in regs(ins)]  # noqa: E731
    if collections.Counter(targets(before)) == collections.Counter(targets(after)):
        return "same-set"
    return f"differs ({len(before)} -> {len(after)} instructions)"


def parse_ptxas(text: str) -> Dict[str, Tuple[int, str]]:
    """{'sm_XX mangled name': (registers, 'stores/loads' spill bytes)} from ptxas -v."""
    out: Dict[str, Tuple[int, str]] = {}
    cur, arch, spill = None, "sm_?", "0/0"
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\S+)' for '(sm_\d+)'", line)
        if m:
            cur, arch, spill = m.group(1), m.group(2), "0/0"
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            spill = f"{m.group(1)}/{m.group(2)}"
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            out[f"{arch} {cur}"] = (int(m.group(1)), spill)
            cur = None
    return out


def compile_sass(src_root: str, rel: str, archs: Sequence[str], tools: Tuple[str, str], work: str, tag: str):
    """(SASS by kernel, ptxas report by kernel) of src_root/rel; tools: (nvcc, cuobjdump)."""
    nvcc, cuobjdump = tools
    src = os.path.join(src_root, rel)
    inc = ["-I" + os.path.join(src_root, "csrc", "common"), "-I" + os.path.dirname(src),
           "-I" + os.path.join(ROOT, "build", "mamba_kernels_generated")]
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    obj = os.path.join(work, f"{tag}.o")
    res = subprocess.run([nvcc, *inc, *DEFINES, *gencode, "-Xptxas", "-v", "-c", src, "-o", obj],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"kernel_diff: nvcc failed on {rel} ({tag}):\n{res.stderr[-3000:]}")
    sass = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True, check=True).stdout
    return parse_sass(sass), parse_ptxas(res.stderr)


def plain_names(keys: Sequence[str]) -> Dict[str, str]:
    """{'sm_XX mangled': 'sm_XX demangled, no anonymous namespace, no parameter list'}: the key
    that matches a kernel across the two compiles (an anonymous namespace's mangled id depends on
    the file's path)."""
    filt = shutil.which("c++filt")
    if not filt:
        raise SystemExit("kernel_diff: needs c++filt (binutils) to match kernels across the two compiles")
    mangled = "\n".join(k.split(" ", 1)[1] for k in keys)
    res = subprocess.run([filt], input=mangled, capture_output=True, text=True, check=True)
    out = {}
    for k, d in zip(keys, res.stdout.splitlines()):
        d = d.replace("(anonymous namespace)::", "")
        out[k] = f"{k.split(' ', 1)[0]} {re.sub(r'[(].*$', '', d).replace('void ', '', 1)}"
    return out


def by_plain(table: Dict[str, object]) -> Dict[str, object]:
    names = plain_names(sorted(table))
    return {names[k]: v for k, v in table.items()}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the git revision to compare against (the working tree is the other side)")
    ap.add_argument("files", nargs="+", help=".cu files, relative to the repository root")
    ap.add_argument("--arch", action="append", help="compute capability digits, e.g. 90 (default 90)")
    args = ap.parse_args(argv)
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    cuobjdump = find_tool("cuobjdump", cuda_home)
    if not os.path.isfile(nvcc) or not cuobjdump:
        have = "found" if os.path.isfile(nvcc) else "missing"
        print(f"kernel_diff: needs nvcc ({nvcc}: {have}) and cuobjdump "
              f"({cuobjdump or 'missing: pip install nvidia-cuda-cuobjdump'})", file=sys.stderr)
        return 2
    if not os.path.isdir(os.path.join(ROOT, "build", "mamba_kernels_generated")):
        print("kernel_diff: build/mamba_kernels_generated is missing: build the extensions once first",
              file=sys.stderr)
        return 2
    archs = args.arch or ["90"]
    tools = (nvcc, cuobjdump)
    changed = 0
    with tempfile.TemporaryDirectory() as work:
        old_root = os.path.join(work, "old")
        os.makedirs(old_root)
        git = ["git", "-C", ROOT, "archive", args.rev, "csrc"]
        archive = subprocess.run(git, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", old_root], input=archive, check=True)
        for rel in args.files:
            before, regs_b = (by_plain(t) for t in compile_sass(old_root, rel, archs, tools, work, "old"))
            after, regs_a = (by_plain(t) for t in compile_sass(ROOT, rel, archs, tools, work, "new"))
            names = sorted(set(before) | set(after))
            print(f"== {rel}: {args.rev} -> working tree")
            for n in names:
                if n not in before or n not in after:
                    verdict = "added" if n not in before else "removed"
                else:
                    verdict = classify(before[n], after[n])
                changed += verdict != "identical"
                rb, ra = regs_b.get(n), regs_a.get(n)
                regs = (f"{rb[0] if rb else '-'} -> {ra[0] if ra else '-'} registers, "
                        f"spills {rb[1] if rb else '-'} -> {ra[1] if ra else '-'}")
                print(f"  {verdict:10s} {n}  ({regs})")
    print(f"{changed} kernel(s) not identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
