"""Host cost of one call at each layer, for the build first on sys.path (run once per binding):

    PYTHONPATH=<build> python3 bench/experiments/op_overhead.py

Times (microseconds per call, back-to-back, one synchronize at the end, median of 5) the
decode step at batch 1 x 64 channels three ways: the registered op called directly
(torch.ops.mamba_kernels.selective_state_update.default: the dispatcher and the binding
alone), the dispatch decision (dispatch.use_cuda), and the public Python function; then every
other registered op called directly at a tiny shape (batch 1, 64 channels, 16 steps), where the
host cost is all there is; then selective_scan_fn and causal_conv1d_fn at bench_selective_scan's
overhead shape (1, 64, 128, 16) bf16, each next to its op called directly (the difference is our
Python layers; the conv with bf16 and with fp32 weight and bias, which the op casts to fp32); then
torch.profiler CPU tables of the direct decode calls and of each public call. The
difference between two builds' lines is the binding's own cost.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
from _timing import wall_ms  # noqa: E402
from provenance import ours_extension_lines  # noqa: E402

os.environ.setdefault("MAMBA_KERNELS_BACKEND", "cuda")


def per_call_us(fn, calls: int = 2000, reps: int = 5) -> float:
    """bench/_timing.wall_ms, in microseconds, for a call without input sets."""
    return 1e3 * wall_ms(lambda i: fn(), 1, calls=calls, reps=reps, warmup=50)


def tiny_op_calls(dev: str):
    """(name, call) for each of the other registered ops, arguments built once."""
    import causal_conv1d._cuda  # noqa: F401  (registers the conv ops)

    ops = torch.ops.mamba_kernels
    b, d, L, n, w = 1, 64, 16, 16, 4
    bf = dict(device=dev, dtype=torch.bfloat16)
    x = torch.randn(b, d, L, **bf)
    weight, bias = torch.randn(d, w, **bf), torch.randn(d, **bf)
    dout, dx = torch.randn(b, d, L, **bf), torch.empty(b, d, L, **bf)
    final = torch.empty(b, d, w - 1, **bf)
    conv_state, step = torch.randn(b, d, w - 1, **bf), torch.randn(b, d, 1, **bf)
    u, delta, z = torch.randn(b, d, L, **bf), torch.rand(b, d, L, **bf), torch.randn(b, d, L, **bf)
    A = -torch.rand(d, n, device=dev)
    Bv, Cv = torch.randn(b, 1, n, L, **bf), torch.randn(b, 1, n, L, **bf)
    D, dbias = torch.randn(d, device=dev), torch.rand(d, device=dev)
    y, _, ckpt = ops.selective_scan_fwd(u, delta, A, Bv, Cv, D, z, dbias, True, True)
    dz, no_out_z = torch.empty_like(z), u.new_empty((0,))
    return [
        ("causal_conv1d_fwd", lambda: ops.causal_conv1d_fwd(x, weight, bias, None, None, True)),
        ("causal_conv1d_fwd_final_states",
         lambda: ops.causal_conv1d_fwd_final_states(x, weight, bias, None, None, final, True)),
        ("causal_conv1d_bwd",
         lambda: ops.causal_conv1d_bwd(x, weight, bias, dout, None, None, None, dx, False, True)),
        ("causal_conv1d_update",
         lambda: ops.causal_conv1d_update(step, conv_state, weight, bias, True, None, None)),
        ("selective_scan_fwd", lambda: ops.selective_scan_fwd(u, delta, A, Bv, Cv, D, z, dbias, True, False)),
        ("selective_scan_bwd",
         lambda: ops.selective_scan_bwd(u, delta, A, Bv, Cv, D, z, dbias, dout, ckpt, y, dz, no_out_z, True)),
    ]


def public_calls(dev: str):
    """(name, call) at bench_selective_scan.py's overhead shape, (1, 64, 128, 16) bf16: each
    public function next to its op called directly, so their difference is the Python layers;
    the conv with bf16 weight and bias (what a bf16 model passes, cast to fp32 by the op) and
    with fp32 ones."""
    from causal_conv1d import causal_conv1d_fn
    from selective_scan import selective_scan_fn

    ops = torch.ops.mamba_kernels
    b, d, L, n = 1, 64, 128, 16
    bf = dict(device=dev, dtype=torch.bfloat16)
    u, delta, z = torch.randn(b, d, L, **bf), 0.5 * torch.randn(b, d, L, **bf), torch.randn(b, d, L, **bf)
    A, D, bias = -torch.rand(d, n, device=dev), torch.randn(d, device=dev), -torch.rand(d, device=dev)
    B, C = torch.randn(b, 1, n, L, **bf), torch.randn(b, 1, n, L, **bf)
    x = torch.randn(b, d, L, **bf)
    w32, b32 = torch.randn(d, 4, device=dev) / 4, torch.randn(d, device=dev)
    w16, b16 = w32.to(torch.bfloat16), b32.to(torch.bfloat16)
    return [
        ("op selective_scan_fwd at (1, 64, 128, 16)",
         lambda: ops.selective_scan_fwd(u, delta, A, B, C, D, z, bias, True, False)),
        ("selective_scan_fn at (1, 64, 128, 16)",
         lambda: selective_scan_fn(u, delta, A, B, C, D=D, z=z, delta_bias=bias, delta_softplus=True)),
        ("op causal_conv1d_fwd, bf16 weight/bias",
         lambda: ops.causal_conv1d_fwd(x, w16, b16, None, None, True)),
        ("causal_conv1d_fn, bf16 weight/bias", lambda: causal_conv1d_fn(x, w16, b16, activation="silu")),
        ("op causal_conv1d_fwd, fp32 weight/bias",
         lambda: ops.causal_conv1d_fwd(x, w32, b32, None, None, True)),
        ("causal_conv1d_fn, fp32 weight/bias", lambda: causal_conv1d_fn(x, w32, b32, activation="silu")),
    ]


def main() -> int:
    import selective_scan._cuda as ext

    from mamba_kernels.runtime import dispatch
    from selective_scan import selective_state_update

    print("extension:", ext.__file__)
    for line in ours_extension_lines(root=None):  # compiled files of our packages, or ProvenanceError
        print(f"provenance: {line}")
    b, d, n = 1, 64, 16
    dev = "cuda"
    state = torch.randn(b, d, n, device=dev, dtype=torch.bfloat16)
    x = torch.randn(b, d, device=dev, dtype=torch.bfloat16)
    dt = torch.rand(b, d, device=dev, dtype=torch.bfloat16)
    A = -torch.rand(d, n, device=dev)
    B = torch.randn(b, n, device=dev, dtype=torch.bfloat16)
    C = torch.randn(b, n, device=dev, dtype=torch.bfloat16)
    D = torch.randn(d, device=dev)
    op = torch.ops.mamba_kernels.selective_state_update.default

    def direct():
        op(state, x, dt, A, B, C, D, None, None, True, None)

    rows = [
        ("op called directly", per_call_us(direct)),
        ("dispatch.use_cuda", per_call_us(lambda: dispatch.use_cuda("selective_scan", "cuda"))),
        ("selective_state_update()", per_call_us(lambda: selective_state_update(state, x, dt, A, B, C, D,
                                                                                 dt_softplus=True))),
        ("torch.empty_like (reference)", per_call_us(lambda: torch.empty_like(state))),
    ]
    for name, fn in tiny_op_calls(dev) + public_calls(dev):
        try:
            rows.append((f"op {name}", per_call_us(fn)))
        except Exception as e:  # reported in its row; the others still run
            print(f"op {name}: {type(e).__name__}: {e}")
    for name, us in rows:
        print(f"{name:40s} {us:8.2f} us")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(200):
            direct()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))
    for name, fn in public_calls(dev)[1::2]:  # where a public call's host time goes
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
        print(f"\n{name}, 200 calls:")
        averages = prof.key_averages()
        print(averages.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
