"""Host time of ``selective_scan_cuda.fwd`` / ``bwd``, ours against the original, as mamba_ssm's
MambaInnerFn calls them, in one process with the calls interleaved.

    PYTHONPATH=<this checkout> python3 bench/experiments/compat_host_ab.py --orig-dir DIR \
        [--shape 4x1536x2048] [--rounds 40]

Why: mamba_ssm's small block (d_model 768: 1536 inner channels, batch 4, length 2048) and its LM
are host-bound on the H200. Their kernels take half the wall time (bench/experiments/profile_block.py), so
what a side's Python and binding cost the host per call decides those rows. Each round times,
for each side (first side alternating), the host time of one call (perf_counter around the call,
no synchronisation: the GPU runs behind) and the wall time of the call with a synchronisation
after it, for the forward and for the backward. Inputs are laid out as MambaInnerFn lays them
out: delta a (dim, batch x L) matrix viewed as (batch, dim, L), z a view into xz, B and C
(batch, 1, dstate, L). Then a torch.profiler CPU table of each side's forward and backward: the
ops and CUDA runtime calls one call makes (launches, allocations, copies, synchronisations). Under the
recompute form a third side, "ours-op", calls our ops directly with the arguments our
compatibility layer passes them: ours minus ours-op is what our Python costs.

Ours is this checkout's ``selective_scan_cuda`` (refused unless it is); the original is the
compiled file under ``--orig-dir`` (bench/provenance.py loads it by path and checks it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
import provenance  # noqa: E402


def inputs(batch: int, dim: int, L: int, dstate: int, dtype: torch.dtype):
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, device="cuda", dtype=dt, generator=g)

    xz = rnd(batch, 2 * dim, L)
    u = rnd(batch, dim, L)
    delta = (0.1 * rnd(dim, batch * L)).view(dim, batch, L).permute(1, 0, 2)  # MambaInnerFn's layout
    A = -torch.rand(dim, dstate, device="cuda", generator=g) - 0.5
    B = rnd(batch, 1, dstate, L)
    C = rnd(batch, 1, dstate, L)
    D = torch.ones(dim, device="cuda")
    z = xz[:, dim:]
    bias = torch.zeros(dim, device="cuda") - 2.0
    dout = (0.1 * rnd(dim, batch * L)).view(dim, batch, L).permute(1, 0, 2)
    dxz = torch.empty_like(xz)
    return u, delta, A, B, C, D, z, bias, dout, dxz[:, dim:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orig-dir", required=True)
    ap.add_argument("--shape", default="4x1536x2048", help="batch x dim x L (dstate 16)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    a = ap.parse_args()
    batch, dim, L = (int(v) for v in a.shape.split("x"))
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32

    ours, orig = provenance.require_compat_scan_sides(a.orig_dir)
    print(
        f"shape (batch, dim, L, dstate) = ({batch}, {dim}, {L}, 16) {dtype}; torch {torch.__version__}; "
        f"{torch.cuda.get_device_name()}; "
        f"MAMBA_KERNELS_SCAN_STATES={os.environ.get('MAMBA_KERNELS_SCAN_STATES', 'auto')}",
    )

    u, delta, A, B, C, D, z, bias, dout, dz = inputs(batch, dim, L, 16, dtype)
    sides = {"ours": ours, "orig": orig}
    saved = {}

    # "ours-op": our ops called directly with the arguments our compatibility layer passes
    # them (the recompute form's layout), so ours - ours-op is our Python's share
    from selective_scan.scan_fn import SPACED_BWD_ARGS, _as_4d, paired_fwd_args

    ops = torch.ops.mamba_kernels
    B4, C4 = _as_4d(B), _as_4d(C)

    class Direct:
        @staticmethod
        def fwd(u, delta, A, B, C, D, z, bias, softplus):
            out, out_z, ckpt = ops.selective_scan_fwd.default(
                u, delta, A, B4, C4, D, z, bias, softplus, True, *paired_fwd_args(L)
            )
            return out, ckpt, out_z

        @staticmethod
        def bwd(u, delta, A, B, C, D, z, bias, dout, ckpt, out, dz, softplus, recompute_out_z):
            out_z = torch.empty_like(z)
            return ops.selective_scan_bwd.default(
                u, delta, A, B4, C4, D, z, bias, dout, ckpt, out, dz, out_z, softplus, *SPACED_BWD_ARGS
            )

    if os.environ.get("MAMBA_KERNELS_SCAN_STATES", "auto") != "keep":
        sides["ours-op"] = Direct

    def fwd(side):
        out, x, out_z = sides[side].fwd(u, delta, A, B, C, D, z, bias, True)
        saved[side] = (out, x)
        return out_z

    def bwd(side):
        out, x = saved[side]
        return sides[side].bwd(u, delta, A, B, C, D, z, bias, dout, x, out, dz, True, True)

    host = {(s, w): [] for s in sides for w in ("fwd", "bwd")}
    wall = {(s, w): [] for s in sides for w in ("fwd", "bwd")}
    for side in sides:  # warm-up
        fwd(side), bwd(side)
    torch.cuda.synchronize()
    for r in range(a.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for side in order:
            for what, fn in (("fwd", fwd), ("bwd", bwd)):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn(side)
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                host[side, what].append((t1 - t0) * 1e6)
                wall[side, what].append((t2 - t0) * 1e6)

    names = list(sides)
    print(
        "\n| call | "
        + " | ".join(f"{n} host us (median / best)" for n in names)
        + " | "
        + " | ".join(f"{n} wall us" for n in names)
        + " |"
    )
    print("|---" * (1 + 2 * len(names)) + "|")
    for what in ("fwd", "bwd"):
        cells = [f"{statistics.median(host[n, what]):.1f} / {min(host[n, what]):.1f}" for n in names]
        cells += [f"{statistics.median(wall[n, what]):.1f}" for n in names]
        print(f"| {what} | " + " | ".join(cells) + " |")

    for side in sides:
        for what, fn in (("fwd", fwd), ("bwd", bwd)):
            fwd(side)
            torch.cuda.synchronize()
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=acts) as prof:
                for _ in range(5):
                    fn(side)
            torch.cuda.synchronize()
            print(f"\n## {side}: {what}, 5 calls, by CPU time")
            print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=30, max_name_column_width=70))
    return 0


if __name__ == "__main__":
    sys.exit(main())
