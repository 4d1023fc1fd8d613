"""Host (Python-side) overhead of ``selective_scan_fn`` and ``causal_conv1d_fn``, on CPU, no GPU.

    .venv/bin/python bench/experiments/host_overhead_fn.py [--reps 31] [--calls 2000] [--root DIR]

Same method as bench/experiments/host_overhead.py (whose helpers this imports): the compiled ops
``torch.ops.mamba_kernels.selective_scan_{fwd,bwd}`` and ``causal_conv1d_*`` are defined here
with CPU kernels (in Python) that only allocate their outputs (the ``_cuda`` modules are
dummies), and the dispatch decision is made as for CUDA tensors. So every call runs the real
validation, dispatch decision, knob reads, ``autograd.Function`` machinery and op dispatch on
CPU tensors, plus stand-in ops whose own cost is on the first lines: the rest is what our
Python layers add. What the C++ op does on a GPU host (its checks, allocations on the device,
the launch) is not in these numbers: bench/experiments/op_overhead.py times that on the GPU.

Shape: bench/bench_selective_scan.py's overhead row, (batch 1, dim 64, seqlen 128, dstate 16)
bf16, variable B and C (1, 1, 16, 128), z, D and delta_bias fp32, softplus; the conv: x (1, 64,
128) bf16, width 4, fp32 weight and bias, silu. "no grad" is inside ``torch.no_grad()`` (what
the benchmark's forward row does; the enter/exit is its own row); "inputs require grad" is a
training forward (the Function records the graph, the scan keeps its states). The rows named
"as MambaInnerFn calls it" are the compatibility modules as mamba_ssm calls them (positional
arguments, the scan states in the original's shape; the backward with the forward's x and y,
and dz written in place).
Median over ``--reps`` repetitions of ``--calls`` calls, per call, one torch thread.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import List, Optional

import torch
from host_overhead import SCHEMAS as CONV_SCHEMAS
from host_overhead import (
    _stand_in_bwd,
    _stand_in_fwd,
    _stand_in_fwd_final_states,
    _stand_in_update,
    decide_as_cuda,
    header_schemas,
    run,
    stand_in_extension,
)

SCAN_SCHEMAS = header_schemas("csrc/selective_scan/scan_ops.h", "kScanSchemas")
CHUNK = 64


def _scan_fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus, keep_y, state_steps=CHUNK, state_count=-1,
              state_pairs=False):
    b, d, L = u.shape
    out = torch.empty_like(delta) if keep_y else u.new_empty((0,))
    out_z = torch.empty_like(delta) if z is not None else u.new_empty((0,))
    count = state_count if state_count >= 0 else -(-L // state_steps)
    rows, per_row = (count // 2, 2) if state_pairs else (count, 1)  # pairs: the original's x shape
    return out, out_z, u.new_empty((b, d, rows, per_row * A.shape[1]), dtype=torch.float32)


def _scan_bwd(u, delta, A, B, C, D, z, delta_bias, dout, ckpt, y, dz, out_z, delta_softplus,
              state_steps=CHUNK, state_pairs=False):
    f32 = torch.float32
    dD = u.new_empty((u.shape[1] if D is not None else 0,), dtype=f32)
    dbias = u.new_empty((u.shape[1] if delta_bias is not None else 0,), dtype=f32)
    return (torch.empty_like(u), torch.empty_like(delta), torch.empty_like(A), torch.empty_like(B),
            torch.empty_like(C), dD, dbias)


def install_stand_ins() -> torch.library.Library:
    lib = torch.library.Library("mamba_kernels", "FRAGMENT")
    stand_in_extension("selective_scan", lib, SCAN_SCHEMAS,
                       {"selective_scan_fwd": _scan_fwd, "selective_scan_bwd": _scan_bwd})
    stand_in_extension("causal_conv1d", lib, CONV_SCHEMAS, {
        "causal_conv1d_fwd": _stand_in_fwd,
        "causal_conv1d_fwd_final_states": _stand_in_fwd_final_states,
        "causal_conv1d_bwd": _stand_in_bwd,
        "causal_conv1d_update": _stand_in_update,
    })
    import causal_conv1d._ops  # noqa: F401  (the fake implementations, registered as on a GPU)
    import selective_scan._ops  # noqa: F401

    decide_as_cuda()
    return lib


def _compat_without_op(cuda_compat, u, delta, A, B, C, D, z, bias):
    """A second copy of selective_scan/cuda_compat.py whose ops return outputs made once, so
    that timing its fwd and bwd times our Python alone."""
    spec = importlib.util.spec_from_file_location("selective_scan._compat_python_only", cuda_compat.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made_fwd = _scan_fwd(u, delta, A, B, C, D, z, bias, True, *cuda_compat.paired_fwd_args(u.shape[-1]))
    made_bwd = _scan_bwd(u, delta, A, B, C, D, z, bias, u, made_fwd[2], u, u, u, True)
    fwd, bwd = (lambda *a: made_fwd), (lambda *a: made_bwd)
    ops = types.SimpleNamespace(fwd=fwd, bwd=bwd, fwd_entry=fwd, bwd_entry=bwd, CHUNK=CHUNK)
    module._ops_module = lambda: ops
    return module


def cases() -> List[tuple]:
    from causal_conv1d import causal_conv1d_fn
    from mamba_kernels.runtime import dispatch, knobs
    from selective_scan import selective_scan_fn

    ops = torch.ops.mamba_kernels
    bf = torch.bfloat16
    b, d, L, n = 1, 64, 128, 16
    u, delta, z = (torch.randn(b, d, L, dtype=bf) for _ in range(3))
    A, D, bias = -torch.rand(d, n), torch.randn(d), torch.rand(d)
    B, C = torch.randn(b, 1, n, L, dtype=bf), torch.randn(b, 1, n, L, dtype=bf)
    args = (u, delta, A, B, C, D, z, bias)
    gargs = tuple(t.clone().requires_grad_() for t in args)
    dout = torch.randn(b, d, L, dtype=bf)
    x = torch.randn(b, d, L, dtype=bf)
    w, wb = torch.randn(d, 4) / 4, torch.randn(d)

    def scan(a):
        u, delta, A, B, C, D, z, bias = a
        return selective_scan_fn(u, delta, A, B, C, D=D, z=z, delta_bias=bias, delta_softplus=True)

    def scan_no_grad() -> None:
        with torch.no_grad():
            scan(args)

    def conv_no_grad() -> None:
        with torch.no_grad():
            causal_conv1d_fn(x, w, wb, activation="silu")

    def no_grad_alone() -> None:
        with torch.no_grad():
            pass

    import causal_conv1d_cuda
    import selective_scan_cuda
    from selective_scan import cuda_compat

    y, states, _ = selective_scan_cuda.fwd(*args, True)  # what MambaInnerFn keeps for its backward
    dz = torch.empty_like(z)
    python_only = _compat_without_op(cuda_compat, u, delta, A, B, C, D, z, bias)

    return [
        ("stand-in op alone: ops.selective_scan_fwd", lambda: ops.selective_scan_fwd(*args, True, False)),
        ("stand-in op alone: ops.causal_conv1d_fwd",
         lambda: ops.causal_conv1d_fwd(x, w, wb, None, None, True)),
        ("dispatch decision alone: dispatch.use_cuda", lambda: dispatch.use_cuda("selective_scan", "cuda")),
        ("knob alone: knobs.scan_states()", getattr(knobs, "scan_states", lambda: None)),
        ("torch.no_grad() alone (enter and exit)", no_grad_alone),
        ("selective_scan_fn, no input requires grad", lambda: scan(args)),
        ("selective_scan_fn, inside torch.no_grad()", scan_no_grad),
        ("selective_scan_fn, inputs require grad", lambda: scan(gargs)),
        ("selective_scan_fn + backward, inputs require grad", lambda: scan(gargs).backward(dout)),
        ("causal_conv1d_fn, no input requires grad", lambda: causal_conv1d_fn(x, w, wb, activation="silu")),
        ("causal_conv1d_fn, inside torch.no_grad()", conv_no_grad),
        # what mamba_ssm's MambaInnerFn calls (the compatibility modules)
        ("selective_scan_cuda.fwd (as MambaInnerFn calls it)",
         lambda: selective_scan_cuda.fwd(u, delta, A, B, C, D, z, bias, True)),
        ("selective_scan_cuda.bwd (as MambaInnerFn calls it)",
         lambda: selective_scan_cuda.bwd(u, delta, A, B, C, D, z, bias, dout, states, y, dz, True, True)),
        ("causal_conv1d_cuda.causal_conv1d_fwd (as MambaInnerFn calls it)",
         lambda: causal_conv1d_cuda.causal_conv1d_fwd(x, w, wb, None, None, None, True)),
        # our Python alone: the same module with an op that returns ready outputs
        ("selective_scan_cuda.fwd, its Python alone (an op that costs nothing)",
         lambda: python_only.fwd(u, delta, A, B, C, D, z, bias, True)),
        ("selective_scan_cuda.bwd, its Python alone (an op that costs nothing)",
         lambda: python_only.bwd(u, delta, A, B, C, D, z, bias, dout, states, y, dz, True, True)),
        # a part of selective_scan_cuda.fwd on its own
        ("selective_scan_cuda.fwd part: the argument checks",
         lambda: cuda_compat._check(u, delta, A, B, C, D, z, bias, True)),
    ]


def main(argv: Optional[List[str]] = None) -> int:
    return run(argv, __doc__, install_stand_ins, cases)


if __name__ == "__main__":
    sys.exit(main())
