"""Side-by-side timing of Mamba-2's gated RMSNorm: ours against mamba_ssm's Triton kernels.

    python3 bench/bench_layernorm_gated.py [--orig-dir DIR] [--shapes SPEC,...] [--reps N] [--device cuda|cpu]
                                           [--json PATH]

SPEC is batch x seqlen x dim / group_size : dtype [: options], e.g. ``16x2048x5120/640:bf16``
(group_size ``-`` for one group; options ``nbg`` = norm_before_gate, ``noz`` = no gate,
``layer`` = LayerNorm with a bias, ``w32`` = float32 weight). The default list starts with the
benchmark shape of issue 43 (Mamba-2's 2.7B layer: groups of 640, gate first, bf16).

Rows, each a Markdown line: forward (``rmsnorm_fn`` / ``layernorm_fn`` under no_grad) and
forward + backward (``torch.autograd.grad`` of the output w.r.t. x, z, weight and bias), the
median over repetitions of CUDA-event-timed loops of back-to-back calls, with input sets rotated
so that L2 does not hold the next call's inputs; GB/s counts the bytes each side must move at
least (x, z and out; backward: x, z, dy read, dx, dz written). Before any time, ours is
compared with the original on the same inputs (max abs difference over the original's max abs
value, output and every gradient); a shape where they disagree beyond the dtype's tolerance
is reported "wrong" and not timed.

DIR holds mamba_ssm installed with ``pip install --no-deps --target DIR`` (its sdist with
MAMBA_SKIP_CUDA_BUILD=TRUE is enough: the norm is Triton). Only
mamba_ssm.ops.triton.layernorm_gated is imported (the package's __init__ is not run); triton
must be importable, einops too (a stand-in is put in place when it is not: only the
original's reference function uses it). Without DIR only ours is timed.

Provenance (bench/provenance.py), before anything is timed: the original's module must be the
file under DIR; ours must be this checkout's selective_scan with its compiled extension (on
CUDA). The header names every module's file; a side that is not what it claims exits 2.
``--json PATH`` also writes the timed rows as bench/results records (``python3 bench/results.py
update PATH``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import types
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(1, ROOT)

import _timing  # noqa: E402
import provenance  # noqa: E402
import results  # noqa: E402  (bench/results.py: the results page's records)
import torch  # noqa: E402

DEFAULT_SHAPES = [
    "16x2048x5120/640:bf16",  # issue 43's benchmark shape (Mamba-2 2.7B: d_ssm 5120, 8 groups)
    "16x2048x5120/640:bf16:nbg",
    "16x2048x5120/640:bf16:w32",
    "8x2048x5120/-:bf16",  # one group of 5120 (ngroups = 1 models)
    "8x2048x4096/1024:fp16:layer:noz",
    "4x2048x8192/8192:bf16",  # 16 KiB groups: the kernels' largest
]
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_TOL = {torch.bfloat16: 3e-2, torch.float16: 4e-3, torch.float32: 1e-4}


class Spec:
    def __init__(self, text: str):
        self.text = text
        parts = text.split(":")
        dims, self.dtype = parts[0], _DTYPES[parts[1]]
        opts = set(parts[2:])
        size, group = dims.split("/")
        self.batch, self.seqlen, self.dim = (int(v) for v in size.split("x"))
        self.group_size = None if group == "-" else int(group)
        self.norm_before_gate = "nbg" in opts
        self.has_z = "noz" not in opts
        self.rms = "layer" not in opts
        self.wtype = torch.float32 if "w32" in opts else self.dtype

    def inputs(self, device: str, seed: int, grad: bool):
        gen = torch.Generator(device=device).manual_seed(seed)
        shape = (self.batch, self.seqlen, self.dim)
        x = torch.randn(shape, generator=gen, device=device).to(self.dtype)
        z = torch.randn(shape, generator=gen, device=device).to(self.dtype) if self.has_z else None
        w = (1 + 0.2 * torch.randn(self.dim, generator=gen, device=device)).to(self.wtype)
        b = None if self.rms else (0.2 * torch.randn(self.dim, generator=gen, device=device)).to(self.wtype)
        if grad:
            for t in (x, z, w, b):
                if t is not None:
                    t.requires_grad_()
        return x, z, w, b

    def bytes(self, backward: bool) -> int:
        n = self.batch * self.seqlen * self.dim * torch.finfo(self.dtype).bits // 8
        per = 3 if self.has_z else 2  # x (z) read, out written
        if backward:
            per += (3 if self.has_z else 2) + (2 if self.has_z else 1)  # x, z, dy read; dx, dz written
        return per * n


def _einops_stand_in() -> Optional[str]:
    try:
        importlib.import_module("einops")
        return None
    except ImportError:
        mod = types.ModuleType("einops")

        def rearrange(*a, **k):
            raise RuntimeError("einops stand-in: only the original's reference function uses it")

        mod.rearrange = rearrange
        sys.modules["einops"] = mod
        return "einops: not installed, a stand-in (the original's kernels do not use it)"


def load_original(orig_dir: str):
    orig_dir = os.path.realpath(orig_dir)
    pkg_dir = os.path.join(orig_dir, "mamba_ssm")
    if not os.path.isfile(os.path.join(pkg_dir, "ops", "triton", "layernorm_gated.py")):
        raise provenance.ProvenanceError(
            f"original: no mamba_ssm/ops/triton/layernorm_gated.py in {orig_dir}"
        )
    note = _einops_stand_in()
    version = provenance._read_version(pkg_dir)
    provenance._namespace_package("mamba_ssm", pkg_dir, version)
    mod = importlib.import_module("mamba_ssm.ops.triton.layernorm_gated")
    where = provenance.require_file_under("original: mamba_ssm.ops.triton.layernorm_gated", mod, orig_dir)
    triton = importlib.import_module("triton")
    lines = [
        f"mamba_ssm {version} from {orig_dir}",
        f"mamba_ssm.ops.triton.layernorm_gated: {where}",
        f"triton {triton.__version__}: {provenance.module_file(triton)}",
    ]
    return mod, lines + ([note] if note else [])


def load_ours(device: str):
    # our kernel, not the PyTorch path that MAMBA_KERNELS_MAMBA2_CUDA=0 would time on CUDA
    os.environ["MAMBA_KERNELS_MAMBA2_CUDA"] = "1"
    mod = importlib.import_module("selective_scan.layernorm_gated")
    where = provenance.require_file_under("ours: selective_scan.layernorm_gated", mod, ROOT)
    lines = [f"selective_scan.layernorm_gated: {where}"]
    lines += provenance.ours_extension_lines(ROOT, require=device == "cuda")
    return mod, lines


def _call(mod, spec: Spec, x, z, w, b):
    if spec.rms:
        return mod.rmsnorm_fn(
            x, w, b, z=z, eps=1e-5, group_size=spec.group_size, norm_before_gate=spec.norm_before_gate
        )
    return mod.layernorm_fn(
        x,
        w,
        b,
        z=z,
        eps=1e-5,
        group_size=spec.group_size,
        norm_before_gate=spec.norm_before_gate,
        is_rms_norm=False,
    )


def _grads(mod, spec: Spec, x, z, w, b, dy):
    y = _call(mod, spec, x, z, w, b)
    leaves = [t for t in (x, z, w, b) if t is not None]
    return [y] + list(torch.autograd.grad(y, leaves, dy))


def compare(ours, orig, spec: Spec, device: str) -> str:
    x, z, w, b = spec.inputs(device, 1, grad=True)
    dy = torch.randn_like(x)
    a = _grads(ours, spec, x, z, w, b, dy)
    o = _grads(orig, spec, x, z, w, b, dy)
    worst = 0.0
    for u, v in zip(a, o):
        scale = max(v.float().abs().max().item(), 1e-30)
        worst = max(worst, (u.float() - v.float()).abs().max().item() / scale)
    return f"{worst:.2e}" if worst <= _TOL[spec.dtype] * 4 else f"wrong ({worst:.2e})"


def timers(mod, spec: Spec, device: str, reps: int) -> Dict[str, Optional[float]]:
    set_bytes = spec.bytes(backward=True)
    n_sets = _timing.n_sets_for(set_bytes, most=3)
    sets = [spec.inputs(device, 10 + i, grad=True) for i in range(n_sets)]
    dys = [torch.randn_like(s[0]) for s in sets]

    def fwd(i: int) -> None:
        with torch.no_grad():
            _call(mod, spec, *sets[i])

    def fwd_bwd(i: int) -> None:
        _grads(mod, spec, *sets[i], dys[i])

    out = {}
    for name, fn in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
        out[name] = _timing.safe(lambda fn=fn: _timing.time_ms(fn, n_sets, reps=reps, inner=5, device=device))
    return out  # the input sets go with the closures


def json_records(measured, context: Dict[str, str]) -> List[dict]:
    """(SPEC, ours {"fwd", "fwd+bwd"} ms, original's) rows as bench/results records."""
    recs = []
    for text, t_ours, t_orig in measured:
        dtype = text.split(":")[1]
        for key, variant in (("fwd", "forward"), ("fwd+bwd", "forward + backward")):
            if t_ours[key] is not None:
                recs.append(results.speedup_record("layernorm_gated", text, dtype, t_ours[key], t_orig[key],
                                                   "ms", context, variant=variant))
    return recs


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orig-dir", default=os.environ.get("ORIG_MS"))
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", metavar="PATH", help="also write the timed rows as bench/results records")
    args = ap.parse_args(argv)
    device = args.device
    try:
        ours, lines = load_ours(device)
        orig = None
        if args.orig_dir:
            orig, more = load_original(args.orig_dir)
            lines += more
    except provenance.ProvenanceError as e:
        print(f"PROVENANCE FAILED: {e}", file=sys.stderr)
        return 2
    print(f"# gated RMSNorm / LayerNorm: ours vs mamba_ssm's Triton ({_timing.utc_now()})\n")
    print(f"- GPU: {_timing.gpu_description() if device == 'cuda' else 'cpu'}")
    print(f"- torch {torch.__version__}; revision {_timing.git_revision(ROOT)}")
    print(f"- command: {_timing.command_line(('MAMBA_KERNELS_BACKEND', 'MAMBA_KERNELS_BINDING'))}")
    for line in lines:
        print(f"- {line}")
    print("\nms: median of CUDA-event-timed loops; GB/s: the bytes each side must move at least\n")
    print(
        "| shape | agree | fwd ours | fwd orig | fwd orig/ours | fwd GB/s ours "
        "| fwd+bwd ours | fwd+bwd orig | fwd+bwd orig/ours | fwd+bwd GB/s ours |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    measured = []
    for text in args.shapes.split(","):
        spec = Spec(text)
        agree = compare(ours, orig, spec, device) if orig is not None else "-"
        if agree.startswith("wrong"):
            print(f"| {text} | {agree} |" + " |" * 8)
            continue
        t_ours = timers(ours, spec, device, args.reps)
        t_orig = timers(orig, spec, device, args.reps) if orig is not None else {"fwd": None, "fwd+bwd": None}

        def gbs(ms: Optional[float], backward: bool, spec: Spec = spec) -> str:
            return "-" if ms is None else f"{spec.bytes(backward) / ms / 1e6:.0f}"

        print(
            f"| {text} | {agree} | {_timing.fmt(t_ours['fwd'])} | {_timing.fmt(t_orig['fwd'])} "
            f"| {_timing.ratio(t_orig['fwd'], t_ours['fwd'])} | {gbs(t_ours['fwd'], False)} "
            f"| {_timing.fmt(t_ours['fwd+bwd'])} | {_timing.fmt(t_orig['fwd+bwd'])} "
            f"| {_timing.ratio(t_orig['fwd+bwd'], t_ours['fwd+bwd'])} | {gbs(t_ours['fwd+bwd'], True)} |",
            flush=True,
        )
        measured.append((text, t_ours, t_orig))
    if args.json:
        context = _timing.run_context(ROOT, ("MAMBA_KERNELS_BACKEND", "MAMBA_KERNELS_BINDING"))
        results.write_records(args.json, json_records(measured, context))
    return 0


if __name__ == "__main__":
    sys.exit(main())
