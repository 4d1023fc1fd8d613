"""Host (Python-side) overhead of the scan's decode step (selective_state_update), on CPU.

    .venv/bin/python bench/experiments/host_overhead_scan.py [--reps 31] [--calls 2000] [--root DIR]

Same method as bench/experiments/host_overhead.py (whose helpers this imports): the compiled op
``torch.ops.mamba_kernels.selective_state_update`` is defined here with a CPU kernel (in
Python) that only allocates the output (``selective_scan._cuda`` is a dummy module), and
the dispatch decision is made as for CUDA tensors. So every call runs the real validation,
dispatch decision and ``_update_ops`` wrapper on CPU tensors, plus a stand-in op whose own
cost is printed on the first line: the rest is what our Python layers add.

Shapes: "one head" is batch 1, dim 64, dstate 16, bf16 state/x/dt/B/C, fp32 A and D,
dt_softplus (bench/experiments/op_overhead.py's call on the H200); "heads" is batch 4 of 8 slots, 8
heads of dim 64, one group, dstate 128, z, dt_bias and int32 state_batch_indices. "A
requires grad" is a model called outside ``torch.no_grad()`` (A derived from a parameter);
"inside torch.no_grad()" includes entering and leaving the caller's ``no_grad`` (its own row).
Median over ``--reps`` repetitions of ``--calls`` calls, per call, one torch thread.

Recorded 2026-11-30 on the project's 2-core AMD EPYC VM (torch 2.14.1+cu130 on CPU, Python
3.11.7), microseconds per call, median of three runs (after: of six); "before" is the commit
that added this file (``--root`` on its unpacked tree), "after" the one that trimmed
selective_state_update.py:

| call | before | after |
|---|---:|---:|
| stand-in op alone: op(...) | 3.2 | 3.2 |
| dispatch decision alone: dispatch.use_cuda | 0.8 | 0.8 |
| selective_state_update, one head | 13.4 | 7.4 |
| selective_state_update, one head, A requires grad | 13.4 | 8.8 |
| selective_state_update, one head, inside torch.no_grad() | 13.3 | 8.5 |
| torch.no_grad() alone (enter and exit) | 1.2 | 1.2 |
| selective_state_update, heads, z, dt_bias, indices | 14.2 | 8.4 |

So the decode step adds 4.2 us over its op (was 10.2): the checks read each attribute once,
compare without building the expected-shape strings and dicts (messages are made only on
failure), and answer the kernel's dtype/dstate rule in the same pass (2.0 us, were 5.6 plus
0.6); the extension module comes from the package instead of a per-call import;
``torch.no_grad()`` (1.2 us) is entered only when an operand requires grad; ``state.is_cuda``
replaces ``state.device.type``. The rest: the dispatch decision (0.8 us), the grad-mode
read, the call itself.
"""

from __future__ import annotations

import sys
from typing import List, Optional

import torch
from host_overhead import decide_as_cuda, header_schemas, run, stand_in_extension

SCHEMA = header_schemas("csrc/selective_scan/update_ops.h", "kUpdateSchemas")["selective_state_update"]


def _stand_in_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices):
    return torch.empty_like(x)


def install_stand_ins() -> torch.library.Library:
    """A CPU stand-in for the compiled decode op, and a dispatch decision made as for CUDA tensors."""
    lib = torch.library.Library("mamba_kernels", "FRAGMENT")
    stand_in_extension("selective_scan", lib, {"selective_state_update": SCHEMA},
                       {"selective_state_update": _stand_in_update})
    import selective_scan._update_ops  # noqa: F401  (registers the fake implementation, as on a GPU)

    decide_as_cuda()
    return lib


def cases() -> List[tuple]:
    from mamba_kernels.runtime import dispatch
    from selective_scan import selective_state_update

    op = torch.ops.mamba_kernels.selective_state_update.default
    bf = torch.bfloat16
    b, d, n = 1, 64, 16
    state, x, dt = torch.randn(b, d, n, dtype=bf), torch.randn(b, d, dtype=bf), torch.rand(b, d, dtype=bf)
    A, B, C, D = -torch.rand(d, n), torch.randn(b, n, dtype=bf), torch.randn(b, n, dtype=bf), torch.randn(d)
    Ag = A.clone().requires_grad_()
    h, hb, hn, slots = 8, 4, 128, 8
    hstate = torch.randn(slots, h, d, hn, dtype=bf)
    hx, hdt, hz = (torch.randn(hb, h, d, dtype=bf) for _ in range(3))
    hA, hD, hbias = -torch.rand(h, d, hn), torch.randn(h, d), torch.randn(h, d)
    hB, hC = torch.randn(hb, 1, hn, dtype=bf), torch.randn(hb, 1, hn, dtype=bf)
    idx = torch.tensor([3, 0, 6, 1], dtype=torch.int32)

    def under_no_grad() -> None:
        with torch.no_grad():
            selective_state_update(state, x, dt, A, B, C, D, dt_softplus=True)

    def no_grad_alone() -> None:
        with torch.no_grad():
            pass

    return [
        ("stand-in op alone: op(...)", lambda: op(state, x, dt, A, B, C, D, None, None, True, None)),
        ("dispatch decision alone: dispatch.use_cuda", lambda: dispatch.use_cuda("selective_scan", "cuda")),
        ("selective_state_update, one head", lambda: selective_state_update(state, x, dt, A, B, C, D,
                                                                             dt_softplus=True)),
        ("selective_state_update, one head, A requires grad",
         lambda: selective_state_update(state, x, dt, Ag, B, C, D, dt_softplus=True)),
        ("selective_state_update, one head, inside torch.no_grad()", under_no_grad),
        ("torch.no_grad() alone (enter and exit)", no_grad_alone),
        ("selective_state_update, heads, z, dt_bias, indices",
         lambda: selective_state_update(hstate, hx, hdt, hA, hB, hC, hD, hz, hbias, True, idx)),
    ]


def main(argv: Optional[List[str]] = None) -> int:
    return run(argv, __doc__, install_stand_ins, cases)


if __name__ == "__main__":
    sys.exit(main())
