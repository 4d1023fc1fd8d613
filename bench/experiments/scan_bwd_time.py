"""GPU time and memory of one selective-scan backward, ours and the original, at MambaInnerFn's
layouts: each kernel's time per call (torch.profiler), the call's wall time (CUDA events) and the
memory the call allocates beyond its inputs.

    PYTHONPATH=<this checkout> python3 bench/experiments/scan_bwd_time.py [--orig-dir DIR] \
        [--shapes 4x1536x2048,2x1536x2048] [--dtype bf16] [--reps 30]

Why: the small block's backward is where the in-kernel dB/dC sums (docs/SCAN.md) win or lose,
and its kernels are what they change; the end-to-end rows (bench/e2e_ab.py) are host-bound and
move between runs by more than a kernel's difference. Ours is our op called directly with the
arguments our compatibility module passes it under the recompute form (states 1024 steps apart,
in pairs), so the time is the kernels' and our op's; the original is its compiled
``selective_scan_cuda.bwd`` from ``--orig-dir`` (bench/provenance.py loads it by path and checks
it), with the same inputs.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
import provenance  # noqa: E402
from compat_host_ab import inputs  # noqa: E402


def ours_bwd(op, args: tuple, state_args: tuple):
    """Our op as our compatibility module calls it: out_z (z's shape) allocated by the call, as
    the original's bwd allocates its own."""
    u, delta, A, B, C, D, z, bias, dout, states, out, dz = args
    out_z = torch.empty_like(z)
    return op(u, delta, A, B, C, D, z, bias, dout, states, out, dz, out_z, True, *state_args)


def measure(bwd, reps: int) -> tuple:
    """(median wall us, {kernel: us per call}, the MiB one call allocates at its peak, what it
    returns included)."""
    for _ in range(3):
        bwd()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = bwd()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    del out
    walls = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        bwd()
        end.record()
        torch.cuda.synchronize()
        walls.append(start.elapsed_time(end) * 1e3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            bwd()
        torch.cuda.synchronize()
    kernels = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", 0) or 0
        if t > 0:
            kernels[ev.key[:70]] = t / reps
    return statistics.median(walls), kernels, peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orig-dir", help="the original's --target install (its compiled selective_scan_cuda)")
    ap.add_argument("--shapes", default="4x1536x2048,2x1536x2048", help="batch x dim x L, comma-separated")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    os.environ.setdefault("MAMBA_KERNELS_BACKEND", "cuda")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for line in provenance.ours_extension_lines(root):
        print("ours:", line)
    import selective_scan._ops  # noqa: F401  (loads our extension, which registers the ops)
    from selective_scan.scan_fn import SPACED_BWD_ARGS, _as_4d, paired_fwd_args

    ops = torch.ops.mamba_kernels
    orig = None
    if a.orig_dir:
        orig, so = provenance.load_original_extension(a.orig_dir, provenance.ORIG_SCAN_EXT)
        print("original:", so)
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; {dtype}; {a.reps} calls a row\n")
    print("| shape | side | wall us (median) | kernels, us a call | MiB allocated at the peak |")
    print("|---|---|---|---|---|")
    for shape in a.shapes.split(","):
        batch, dim, L = (int(v) for v in shape.split("x"))
        u, delta, A, B, C, D, z, bias, dout, dz = inputs(batch, dim, L, 16, dtype)
        B4, C4 = _as_4d(B), _as_4d(C)
        out, _, states = ops.selective_scan_fwd.default(
            u, delta, A, B4, C4, D, z, bias, True, True, *paired_fwd_args(L)
        )
        args = (u, delta, A, B4, C4, D, z, bias, dout, states, out, dz)
        ours = functools.partial(ours_bwd, ops.selective_scan_bwd.default, args, SPACED_BWD_ARGS)
        sides = [("ours", ours)]
        if orig is not None:
            o_out, o_x, _ = orig.fwd(u, delta, A, B, C, D, z, bias, True)
            o_args = (u, delta, A, B, C, D, z, bias, dout, o_x, o_out, dz, True, True)
            original = functools.partial(orig.bwd, *o_args)
            sides.append(("original", original))
        for name, fn in sides:
            wall, kernels, peak = measure(fn, a.reps)
            listed = "; ".join(f"{k}: {t:.1f}" for k, t in sorted(kernels.items(), key=lambda kv: -kv[1]))
            print(f"| {shape} | {name} | {wall:.1f} | {listed} | {peak:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
