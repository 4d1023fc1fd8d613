"""Calls for Nsight Compute to profile: one case, a few times, on one side, nothing timed.

    python3 bench/ncu_cases.py {ours|original} decode BATCH [--orig-dir DIR]
    python3 bench/ncu_cases.py {ours|original} fwd BxDxLxN:DTYPE [--orig-dir DIR]

Run it under ``ncu -k regex:NAME --launch-skip K --launch-count 1`` (bench/ncu_scan.sh does):
each case makes ``--calls`` calls (default 4) on the inputs the benchmark uses
(bench_selective_scan.py's decode_inputs and scan_inputs), so a profile sees the kernel the
benchmark times, warm. The original is loaded as the benchmark loads it (bench/provenance.py
proves its files first) and the modules each side loaded are printed before any call.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import bench_selective_scan as bench  # noqa: E402  (bench/ is not a package)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("side", choices=("ours", "original"))
    ap.add_argument("case", choices=("decode", "fwd"))
    ap.add_argument("size", help="decode: the batch; fwd: BxDxLxN:bf16|fp16|fp32")
    ap.add_argument("--orig-dir", default="/tmp/orig")
    ap.add_argument("--calls", type=int, default=4)
    args = ap.parse_args()
    impl = bench.load_ours("cuda") if args.side == "ours" else bench.load_original(args.orig_dir)
    for line in impl.about:
        print(f"{impl.name}: {line}")
    with torch.no_grad():
        if args.case == "decode":
            batch = int(args.size)
            inputs = bench.decode_inputs(batch, bench.DECODE_DIM, bench.DECODE_DSTATE, "cuda", 0)
            if impl.update is None:
                raise SystemExit(f"{impl.name}: no selective_state_update loaded")
            for _ in range(args.calls):
                bench._call_update(impl.update, inputs)
        else:
            (b, d, L, n, dtype), = bench.parse_shapes(args.size)
            inputs, _ = bench.scan_inputs(b, d, L, n, dtype, "cuda", 0, grad=False)
            for _ in range(args.calls):
                bench._call_scan(impl.scan, inputs)
    torch.cuda.synchronize()
    print(f"{impl.name}: {args.calls} calls of {args.case} {args.size} done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
