"""CPU speed of the PyTorch selective scan against per-step loops over time.

    python bench/cpu_scan.py [--repeat 3] [--threads N] [--shapes 2x256x4096x16,1x64x1024x16]
                             [--loop-backward]

For each shape (batch x dim x L x dstate), fp32, variable B/C, with D, z, delta_bias and
softplus (the Mamba block's configuration), it times:

* ``selective_scan_fn`` on CPU tensors (the chunked PyTorch scan with its custom backward):
  forward without autograd, and forward+backward;
* the same PyTorch path called directly, the backward given the forward's chunk-end states and
  un-gated output instead of recomputing them (``pytorch_scan.forward(..., checkpoints=True)``
  / ``backward(..., checkpoints=..., y=...)``), as ``mamba_inner_fn`` calls it
  (``SelectiveScanFn`` recomputes both);
* ``selective_scan_ref``, the package's per-step reference loop (like mamba_ssm's), forward;
* a plain per-step loop written the fast way (decays and inputs precomputed for all steps,
  then one multiply-add and one reduction per step), forward. Its output is checked against
  ``selective_scan_fn`` before timing, so both compute the same thing.

The speed-up is against the faster of the two loops. Times are the best of ``--repeat`` runs
(the loops: ``--loop-repeat``). ``--loop-backward`` also times the reference loop's autograd
backward, which takes about 15 minutes at 2x256x4096x16 on a 2-core CPU.
Results: docs/notes/bench-passes.md, section "CPU: chunked selective scan vs per-step loop".
"""

from __future__ import annotations

import argparse
import platform
import time
from datetime import date
from typing import Callable, List

import torch
import torch.nn.functional as F

from selective_scan import pytorch_scan, selective_scan_fn, selective_scan_ref


def make_inputs(batch: int, dim: int, L: int, dstate: int) -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(batch, dim, L, generator=g),  # u
        0.5 * torch.rand(batch, dim, L, generator=g),  # delta
        -torch.rand(dim, dstate, generator=g) * 4,  # A
        torch.randn(batch, dstate, L, generator=g),  # B
        torch.randn(batch, dstate, L, generator=g),  # C
        torch.randn(dim, generator=g),  # D
        torch.randn(batch, dim, L, generator=g),  # z
        0.5 * torch.rand(dim, generator=g),  # delta_bias
    ]


def plain_loop(u, delta, A, B, C, D, z, delta_bias, delta_softplus=True):
    """The per-step recurrence with everything that can be precomputed precomputed."""
    dt = delta + delta_bias[:, None]
    dt = F.softplus(dt) if delta_softplus else dt
    decay = torch.exp(dt.unsqueeze(-1) * A[:, None, :])  # (batch, dim, L, n)
    x = (dt * u).unsqueeze(-1) * B.transpose(1, 2).unsqueeze(1)
    Ct = C.transpose(1, 2).unsqueeze(1)  # (batch, 1, L, n)
    h = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])
    ys = []
    for t in range(u.shape[2]):
        h = decay[:, :, t] * h + x[:, :, t]
        ys.append((h * Ct[:, :, t]).sum(-1))
    y = torch.stack(ys, -1) + D[:, None] * u
    return y * F.silu(z)


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def forward_only(fn: Callable, inputs: List[torch.Tensor]) -> Callable[[], object]:
    def run():
        with torch.no_grad():
            return fn(*inputs, delta_softplus=True)

    return run


def forward_backward(fn: Callable, inputs: List[torch.Tensor]) -> Callable[[], object]:
    def run():
        leaves = [t.detach().requires_grad_() for t in inputs]
        fn(*leaves, delta_softplus=True).sum().backward()

    return run


def from_checkpoints(inputs: List[torch.Tensor]) -> Callable[[], object]:
    """Forward keeping the chunk-end states and y, then backward from them (dout = ones)."""

    def run():
        problem = pytorch_scan.make_problem(*inputs, True, 1)
        y, out_z, _, ckpt = pytorch_scan.forward(problem, False, checkpoints=True)
        problem = pytorch_scan.make_problem(*inputs, True, 1)  # as an autograd backward would
        pytorch_scan.backward(problem, torch.ones_like(out_z), checkpoints=ckpt, y=y)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--loop-repeat", type=int, default=3, help="repeats for the per-step loops")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--shapes", default="2x256x4096x16,1x64x1024x16")
    ap.add_argument("--loop-backward", action="store_true", help="also time the reference loop's backward")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"date {date.today()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, "
        f"cpu capability {torch.backends.cpu.get_cpu_capability()}"
    )
    print()
    heads = ["batch x dim x L x dstate", "ours fwd", "ours fwd+bwd", "fwd+bwd from checkpoints"]
    heads += ["reference loop fwd", "plain loop fwd"]
    heads += ["reference loop fwd+bwd"] if args.loop_backward else []
    heads.append("fwd speed-up vs the faster loop")
    print("| " + " | ".join(heads) + " |")
    print("| --- |" + " ---: |" * (len(heads) - 1))
    for spec in args.shapes.split(","):
        batch, dim, L, dstate = (int(v) for v in spec.split("x"))
        inputs = make_inputs(batch, dim, L, dstate)
        same = forward_only(plain_loop, inputs)(), forward_only(selective_scan_fn, inputs)()
        torch.testing.assert_close(*same, rtol=1e-4, atol=1e-4)
        ours_f = best(forward_only(selective_scan_fn, inputs), args.repeat)
        ours_fb = best(forward_backward(selective_scan_fn, inputs), args.repeat)
        ours_ck = best(from_checkpoints(inputs), args.repeat)
        ref_f = best(forward_only(selective_scan_ref, inputs), args.loop_repeat)
        plain_f = best(forward_only(plain_loop, inputs), args.loop_repeat)
        cells = [
            f"{ours_f * 1e3:.1f} ms",
            f"{ours_fb * 1e3:.1f} ms ({ours_fb / ours_f:.2f}x fwd)",
            f"{ours_ck * 1e3:.1f} ms ({ours_ck / ours_f:.2f}x fwd)",
            f"{ref_f * 1e3:.1f} ms",
            f"{plain_f * 1e3:.1f} ms",
        ]
        if args.loop_backward:
            cells.append(f"{best(forward_backward(selective_scan_ref, inputs), 1):.1f} s")
        cells.append(f"{min(ref_f, plain_f) / ours_f:.1f}x")
        print(f"| {batch} x {dim} x {L} x {dstate} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
