"""The recompute form's backward, two ways, on our kernels only (GPU):

    python3 bench/experiments/bwd_states_ab.py [--shapes 4x1536x2048,...] [--reps 30]

* spaced: what ``selective_scan_cuda.bwd`` does under ``recompute`` for real A, dstate <= 16:
  the backward op starts from the forward's x (a state every 1024 steps, in pairs) and
  recomputes the chunk starts between them, one window per 1024 steps;
* rerun: what it did before: a forward op for the states every 64 steps, then the one-pass
  backward from them.

Both get the same inputs, the same y (out) and dout, as mamba_ssm's MambaInnerFn passes them
(bf16 u/delta/z, variable B/C of one group, fp32 A/D/delta_bias, softplus). Reported per shape:
milliseconds from a CUDA graph (kernels) and from Python (what a caller waits for), the peak
memory each allocates beyond its inputs, and whether the gradients agree bitwise (they must:
both start from the same states). Both sides are this checkout's kernels (checked first).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCH)
import _timing as T  # noqa: E402
import provenance  # noqa: E402

DEFAULT_SHAPES = "4x1536x1024,4x1536x2048,4x1536x4096,8x2048x2048,2x2048x8192,8x5120x8192"


def inputs(b, d, L, n=16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rn(*shape, dt=torch.bfloat16, scale=1.0):
        return (scale * torch.randn(*shape, generator=g, device="cuda")).to(dt)

    u, delta, z = rn(b, d, L), rn(b, d, L, scale=0.5), rn(b, d, L)
    A = -torch.exp(rn(d, n, dt=torch.float32))
    B, C = rn(b, 1, n, L), rn(b, 1, n, L)
    D = rn(d, dt=torch.float32)
    bias = -1.0 - 3.0 * torch.rand(d, generator=g, device="cuda")
    return u, delta, A, B, C, D, z, bias


def measure(b, d, L, reps):
    """(spaced, rerun graph ms; spaced, rerun call ms; spaced, rerun MiB beyond what is
    allocated before the call; whether every output agrees bitwise)."""
    from selective_scan import _ops
    from selective_scan.scan_fn import SPACED_BWD_ARGS, paired_fwd_args

    u, delta, A, B, C, D, z, bias = inputs(b, d, L)
    y, _, x = _ops.fwd(u, delta, A, B, C, D, z, bias, True, True, *paired_fwd_args(L))
    dout = torch.randn_like(u)
    dz = torch.empty_like(z)
    empty = u.new_empty((0,))

    def spaced(_i=0):
        return _ops.bwd(u, delta, A, B, C, D, z, bias, dout, x, y, dz, empty, True, *SPACED_BWD_ARGS)

    def rerun(_i=0):
        _, _, ckpt = _ops.fwd(u, delta, A, B, C, D, None, bias, True, False)
        return _ops.bwd(u, delta, A, B, C, D, z, bias, dout, ckpt, y, dz, empty, True)

    same = all(torch.equal(p, q) for p, q in zip(spaced(), rerun()))
    row = [T.time_ms(fn, 1, graph=True, reps=reps, inner=5) for fn in (spaced, rerun)]
    row += [T.time_ms(fn, 1, reps=reps, inner=5) for fn in (spaced, rerun)]
    for fn in (spaced, rerun):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        row.append((torch.cuda.max_memory_allocated() - base) / 2 ** 20)
    return (*row, same)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma list of BxDxL (dstate 16, bf16)")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    sys.path.insert(0, provenance.ROOT)
    for line in provenance.check_ours_package(provenance.ROOT):
        print(f"- ours: {line}")
    from selective_scan.scan_fn import SPACED_BWD_ARGS

    print(f"- {T.gpu_description()}; torch {torch.__version__}; {T.utc_now()}")
    print(f"- command: `{T.command_line()}`\n")
    print("| shape (b, d, L) | windows | spaced graph ms | rerun graph ms | spaced / rerun | "
          "spaced call ms | rerun call ms | spaced extra MiB | rerun extra MiB | grads bitwise |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for spec in args.shapes.split(","):
        b, d, L = (int(v) for v in spec.split("x"))
        sg, rg, sc, rc, sm, rm, same = measure(b, d, L, args.reps)
        windows = -(-L // SPACED_BWD_ARGS[0])
        print(f"| ({b}, {d}, {L}) | {windows} | {sg:.3f} | {rg:.3f} | {sg / rg:.3f} | {sc:.3f} | {rc:.3f} | "
              f"{sm:.0f} | {rm:.0f} | {'yes' if same else 'NO'} |", flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
