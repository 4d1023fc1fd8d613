"""CPU speed of the chunked selective scan against a per-step Python loop.

    python bench/cpu_scan.py [--repeat 3] [--threads N] [--shapes 2x256x4096x16,1x64x1024x16]

For each shape (batch x dim x L x dstate), fp32, variable B/C, with D, z, delta_bias and
softplus (the Mamba block's configuration), it times the forward and the forward+backward of
``selective_scan_fn`` (chunked, custom backward) and of ``selective_scan_ref`` (a loop over
time steps like mamba_ssm's reference, backward by autograd), and prints a markdown table.
Times are the best of ``--repeat`` runs (the loop: of ``--loop-repeat`` runs).
The loop's fwd+bwd at 2x256x4096x16 takes about 15 minutes on the 2-core CPU (its autograd
backward materialises a full-size gradient per time step); pass ``--shapes`` to skip it.
Results: bench/RESULTS.md, section "CPU: chunked selective scan vs per-step loop".
"""

from __future__ import annotations

import argparse
import platform
import time
from datetime import date
from typing import Callable, List, Tuple

import torch

from selective_scan import selective_scan_fn, selective_scan_ref


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


def time_fn(fn: Callable, inputs: List[torch.Tensor], repeat: int) -> Tuple[float, float]:
    """Best forward time and best forward+backward time, in seconds."""
    fwd, total = float("inf"), float("inf")
    for _ in range(repeat):
        leaves = [t.clone().requires_grad_() for t in inputs]
        t0 = time.perf_counter()
        with torch.no_grad():
            fn(*leaves, delta_softplus=True)
        t1 = time.perf_counter()
        out = fn(*leaves, delta_softplus=True)
        out.sum().backward()
        t2 = time.perf_counter()
        fwd, total = min(fwd, t1 - t0), min(total, t2 - t1)
    return fwd, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--loop-repeat", type=int, default=1, help="repeats for the slow per-step loop")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--shapes", default="2x256x4096x16,1x64x1024x16")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"date {date.today()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, "
        f"cpu capability {torch.backends.cpu.get_cpu_capability()}"
    )
    print()
    print(
        "| batch x dim x L x dstate | chunked fwd | chunked fwd+bwd | per-step loop fwd "
        "| per-step loop fwd+bwd | speed-up fwd+bwd |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for spec in args.shapes.split(","):
        batch, dim, L, dstate = (int(v) for v in spec.split("x"))
        inputs = make_inputs(batch, dim, L, dstate)
        c_fwd, c_tot = time_fn(selective_scan_fn, inputs, args.repeat)
        l_fwd, l_tot = time_fn(selective_scan_ref, inputs, args.loop_repeat)
        print(
            f"| {batch} x {dim} x {L} x {dstate} | {c_fwd:.2f} s | {c_tot:.2f} s | {l_fwd:.2f} s "
            f"| {l_tot:.2f} s | {l_tot / c_tot:.1f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
