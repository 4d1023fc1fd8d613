"""Where a selective-scan forward call's host time goes: the same call taken apart, layer by
layer, every side timed in the same rounds (interleaved, the GPU idle before each call).

    PYTHONPATH=<this checkout> python3 bench/experiments/host_decompose.py --orig-dir DIR \
        [--shape 4x1536x2048] [--rounds 200]

Sides (each one call, MambaInnerFn's layouts, recompute form):
- orig:          the original's ``selective_scan_cuda.fwd`` (pybind11, its own allocations);
- ours:          our ``selective_scan_cuda.fwd`` (our Python, then our op);
- op:            our op through ``torch.ops`` (OpOverloadPacket), the arguments ours passes it;
- op.default:    the same through its OpOverload;
- op.below-ad:   the same with the dispatcher told to skip the autograd and ADInplaceOrView
                 keys (torch._C._AutoDispatchBelowADInplaceOrView): what those layers cost;
- empty x3:      three ``torch.empty`` of the op's outputs' sizes: the allocations alone;
- aten.add:      ``torch.ops.aten.add.Tensor`` on two small tensors: one dispatcher op with a
                 launch, through the same torch.ops path;
- views:         three Python view ops (B and C to 4-d, a reshape of the states): what each view
                 a wrapper makes around an op costs on this host.

Why: the small block's and the LM's rows wait on the host, and the host moves by 2x between
runs, so only sides timed in the same rounds can be compared (docs/notes/bench-passes.md, tenth pass).
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
from compat_host_ab import inputs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orig-dir", required=True)
    ap.add_argument("--shape", default="4x1536x2048", help="batch x dim x L (dstate 16)")
    ap.add_argument("--rounds", type=int, default=200)
    a = ap.parse_args()
    batch, dim, L = (int(v) for v in a.shape.split("x"))

    ours, orig = provenance.require_compat_scan_sides(a.orig_dir)
    print(
        f"shape ({batch}, {dim}, {L}, 16) bf16; torch {torch.__version__}; {torch.cuda.get_device_name()}; "
        f"binding: {os.environ.get('MAMBA_KERNELS_BINDING', 'auto')}"
    )

    from selective_scan.scan_fn import _as_4d, paired_fwd_args

    u, delta, A, B, C, D, z, bias, _, _ = inputs(batch, dim, L, 16, torch.bfloat16)
    # MambaInnerFn passes B and C as (batch, 1, dstate, L); mamba_ssm's selective_scan_fn may pass
    # them 3-d, which the compatibility layer turns 4-d (a view, timed under "views")
    B3, C3 = B[:, 0], C[:, 0]
    B4, C4 = B, C
    layout = paired_fwd_args(L)
    packet = torch.ops.mamba_kernels.selective_scan_fwd
    overload = packet.default
    small = torch.ones(8, device="cuda")
    add = torch.ops.aten.add.Tensor
    out_shapes = [(batch, dim, L), (batch, dim, L), (batch, dim, 2, 16)]

    def below_ad():
        with torch._C._AutoDispatchBelowADInplaceOrView():
            return overload(u, delta, A, B4, C4, D, z, bias, True, True, *layout)

    states = overload(u, delta, A, B4, C4, D, z, bias, True, True, *layout)[2]

    def views():
        return _as_4d(B3), _as_4d(C3), states.view(batch, dim, -1, 32)

    sides = {
        "orig": lambda: orig.fwd(u, delta, A, B4, C4, D, z, bias, True),
        "ours": lambda: ours.fwd(u, delta, A, B4, C4, D, z, bias, True),
        "op": lambda: packet(u, delta, A, B4, C4, D, z, bias, True, True, *layout),
        "op.default": lambda: overload(u, delta, A, B4, C4, D, z, bias, True, True, *layout),
        "op.below-ad": below_ad,
        "empty x3": lambda: [torch.empty(s, device="cuda", dtype=torch.bfloat16) for s in out_shapes],
        "aten.add": lambda: add(small, small),
        "views": views,
    }
    host = {s: [] for s in sides}
    for fn in sides.values():  # warm-up
        fn()
        fn()
    torch.cuda.synchronize()
    names = list(sides)
    for r in range(a.rounds):
        for side in names if r % 2 == 0 else names[::-1]:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            sides[side]()
            host[side].append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    print(f"\n{a.rounds} rounds, host us per call\n\n| side | median | best | 25th pct |\n|---|---|---|---|")
    for side in names:
        v = sorted(host[side])
        print(f"| {side} | {statistics.median(v):.1f} | {v[0]:.1f} | {v[len(v) // 4]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
