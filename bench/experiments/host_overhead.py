"""Host (Python-side) overhead of causal_conv1d's compiled path, measured on CPU, no GPU.

    .venv/bin/python bench/experiments/host_overhead.py [--reps 31] [--calls 2000] [--root DIR]

The compiled ops are replaced, in this process only, by stand-ins: the four
``torch.ops.mamba_kernels.causal_conv1d_*`` schemas are defined here with CPU kernels (in
Python) that only allocate the outputs (``causal_conv1d._cuda`` is a dummy module), and
the dispatch decision is made as for CUDA tensors (the real ``dispatch.use_cuda``, asked
about ``"cuda"``). So every call runs the real validation, dispatch decision,
autograd.Function machinery and ``_ops`` wrappers on CPU tensors, plus a stand-in op whose
own cost is printed on the first line: the rest is what our Python layers add. Nothing the
C++ op does on a GPU host (casting weight and bias to fp32, allocating on the device,
launching kernels) is in these numbers. ``--root`` measures another checkout of the package
(e.g. an older commit unpacked with ``git archive <commit> | tar -x -C DIR``).

Shape: batch 1, dim 64, seqlen 128, bf16 x, width 4, fp32 weight and bias, silu (decode:
a (64, 64) bf16 token, state (64, 64, 3)); median over ``--reps`` repetitions of
``--calls`` calls, per call, one torch thread.

Recorded 2026-11-30 on the project's 2-core AMD EPYC VM (torch 2.14.1+cu130 on CPU,
Python 3.11.7), microseconds per call, median of three runs each; "before" is the parent of
the commit that added this file (``--root`` on its unpacked tree), "after" that commit:

| call | before | after |
|---|---:|---:|
| stand-in op alone: ops.causal_conv1d_fwd | 2.9 | 2.9 |
| dispatch decision alone: dispatch.use_cuda | 1.0 | 1.0 |
| cpp_functions.causal_conv1d_fwd_function | 7.5 | 6.1 |
| causal_conv1d_fn, no input requires grad | 11.5 | 7.0 |
| causal_conv1d_fn, weight and bias require grad | 12.5 | 9.3 |
| causal_conv1d_fn + backward, all require grad | 46.9 | 41.0 |
| causal_conv1d_update, one token, batch 64 | 12.7 | 9.0 |

So ``causal_conv1d_fn`` adds 4.1 us (was 8.6) over its op without autograd and 6.4 us (was
9.6) with it: the forward validates once (it validated twice, three times with a
``final_states_out`` buffer), the checks read each attribute once and build no strings,
``CausalConv1dFn.apply`` (about 2.5 us) is skipped when autograd would record nothing, and
the decode step skips ``torch.no_grad()`` (1.2 us) when no input requires grad. The rest:
the dispatch decision (1.0 us: reading ``MAMBA_KERNELS_BACKEND``, a lock), ``apply`` with
autograd, the op call.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
import types
from typing import Callable, List, Optional

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

def header_schemas(header: str, array: str) -> dict:
    """{op name: the rest of its schema} from the C++ array of schema strings that both bindings
    register (e.g. csrc/causal_conv1d/conv_ops.h, kConvSchemas): the stand-ins take the real
    ops' signatures from the one place they are written."""
    with open(os.path.join(ROOT, header)) as f:
        text = f.read()
    body = text[text.index(array + "[] = {"):]
    body = body[body.index("{") + 1 : body.index("};")]
    schemas = {}
    # adjacent literals concatenate; a comma after a literal ends one schema
    for item in re.split(r'"\s*,', body):
        schema = "".join(re.findall(r'"([^"]*)"?', item + '"'))
        if schema.strip():
            name = schema[: schema.index("(")]
            schemas[name] = schema[len(name):]
    return schemas


SCHEMAS = header_schemas("csrc/causal_conv1d/conv_ops.h", "kConvSchemas")


def _stand_in_fwd(x, weight, bias, seq_idx, initial_states, silu_activation):
    return torch.empty_like(x)


def _stand_in_fwd_final_states(x, weight, bias, seq_idx, initial_states, final_states_out, silu_activation):
    return torch.empty_like(x)


def _stand_in_bwd(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, return_dinitial_states,
                  silu_activation):
    dbias = torch.empty_like(bias) if bias is not None else weight.new_empty((0,))
    return torch.empty_like(weight), dbias, x.new_empty((0,))


def _stand_in_update(x, conv_state, weight, bias, silu_activation, cache_seqlens, conv_state_indices):
    return torch.empty_like(x)


def stand_in_extension(kernel: str, lib: torch.library.Library, schemas: dict, impls: dict) -> None:
    """Define ``schemas`` in ``lib`` with the CPU ``impls`` and make a dummy module stand for
    ``kernel``'s compiled extension (imported by its ``_ops`` modules, reported usable by dispatch)."""
    from mamba_kernels.runtime import dispatch

    name = dispatch.EXTENSIONS[kernel]
    ext = types.ModuleType(name)
    sys.modules[name] = ext
    for op, schema in schemas.items():
        lib.define(op + schema)
        lib.impl(op, impls[op], "CPU")
    dispatch._status[kernel] = dispatch.ExtensionStatus(ext, "stand-in for this benchmark")


def decide_as_cuda() -> None:
    """Make the dispatch decision as for CUDA tensors (the real ``dispatch.use_cuda``, asked
    about ``"cuda"``); once per process."""
    from mamba_kernels.runtime import dispatch

    real = dispatch.use_cuda
    if not getattr(real, "as_cuda", False):
        dispatch.use_cuda = lambda kernel, device_type: real(kernel, "cuda")
        dispatch.use_cuda.as_cuda = True


def install_stand_ins() -> torch.library.Library:
    """CPU stand-ins for the compiled ops, and a dispatch decision made as for CUDA tensors."""
    lib = torch.library.Library("mamba_kernels", "FRAGMENT")
    impls = {
        "causal_conv1d_fwd": _stand_in_fwd,
        "causal_conv1d_fwd_final_states": _stand_in_fwd_final_states,
        "causal_conv1d_bwd": _stand_in_bwd,
        "causal_conv1d_update": _stand_in_update,
    }
    stand_in_extension("causal_conv1d", lib, SCHEMAS, impls)
    import causal_conv1d._ops  # noqa: F401  (registers the fake implementations, as on a GPU)

    decide_as_cuda()
    return lib


def per_call_us(fn: Callable[[], object], reps: int, calls: int) -> float:
    """Median over ``reps`` loops of ``calls`` calls, microseconds per call."""
    for _ in range(max(calls // 4, 10)):
        fn()
    times: List[float] = []
    for _ in range(reps):
        t = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter_ns() - t) / calls / 1e3)
    return statistics.median(times)


def cases() -> List[tuple]:
    from causal_conv1d import causal_conv1d_fn, causal_conv1d_update, cpp_functions
    from mamba_kernels.runtime import dispatch

    ops = torch.ops.mamba_kernels
    x = torch.randn(1, 64, 128, dtype=torch.bfloat16)
    w, b = torch.randn(64, 4) / 4, torch.randn(64)
    wg, bg = w.clone().requires_grad_(), b.clone().requires_grad_()
    xg = x.clone().requires_grad_()
    dout = torch.randn_like(x)
    xt, state = torch.randn(64, 64, dtype=torch.bfloat16), torch.randn(64, 64, 3, dtype=torch.bfloat16)

    def fwd_bwd() -> None:
        causal_conv1d_fn(xg, wg, bg, activation="silu").backward(dout)

    return [
        ("stand-in op alone: ops.causal_conv1d_fwd",
         lambda: ops.causal_conv1d_fwd(x, w, b, None, None, True)),
        ("dispatch decision alone: dispatch.use_cuda", lambda: dispatch.use_cuda("causal_conv1d", "cuda")),
        ("cpp_functions.causal_conv1d_fwd_function",
         lambda: cpp_functions.causal_conv1d_fwd_function(x, w, b, None, None, None, True)),
        ("causal_conv1d_fn, no input requires grad", lambda: causal_conv1d_fn(x, w, b, activation="silu")),
        ("causal_conv1d_fn, weight and bias require grad",
         lambda: causal_conv1d_fn(x, wg, bg, activation="silu")),
        ("causal_conv1d_fn + backward, all require grad", fwd_bwd),
        ("causal_conv1d_update, one token, batch 64", lambda: causal_conv1d_update(xt, state, w, b, "silu")),
    ]


def run(argv: Optional[List[str]], doc: str, install: Callable[[], object],
        make_cases: Callable[[], List[tuple]]) -> int:
    """The command line shared by the host-overhead benchmarks: stand-ins, then the table."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--root", default=ROOT, help="the checkout to measure (default: this one)")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.abspath(args.root))
    os.environ.pop("MAMBA_KERNELS_BACKEND", None)  # auto: the default decision
    torch.set_num_threads(1)
    _lib = install()  # noqa: F841  (the ops live as long as the Library object)
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}; us per call, median of {args.reps} "
          f"x {args.calls} calls\n")
    print("| call | us |\n|---|---:|")
    for name, fn in make_cases():
        print(f"| {name} | {per_call_us(fn, args.reps, args.calls):.2f} |", flush=True)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return run(argv, __doc__, install_stand_ins, cases)


if __name__ == "__main__":
    sys.exit(main())
