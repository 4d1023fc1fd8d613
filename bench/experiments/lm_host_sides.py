"""What a selective_scan_cuda.fwd call costs mamba_ssm's LM forward in place: the LM forward
(no grad, e2e_mamba's default LM, bf16) with mamba_ssm's interface pointed at one stand-in
after another, every side timed in the same interleaved rounds.

    cd /tmp && PYTHONPATH=<mamba_ssm's Python>:<this checkout> \
        python3 <this checkout>/bench/lm_host_sides.py --orig-dir DIR [--reps 40] [--pad 10,20] \
        [--pybind-probe]

Sides:
- orig:  the original's compiled ``fwd`` (from DIR, loaded by path);
- ours:  our compatibility module's ``fwd`` (this checkout's, with its compiled extensions);
- ours, op only:  our forward op's C++ entry called with the arguments ours passes it, in one
  Python function of four lines: what our op costs in place, without our Python;
- orig + N us:  the original's ``fwd`` behind a busy wait of N us: the calibration, i.e. what
  N us more host time per call costs the LM forward (4 layers, one call each);
- orig + one more pybind11 call / our op call / aten call:  the original's ``fwd``, then one
  more call on tiny inputs (a (1, 16, 16, 16) scan with z, D and delta_bias; for aten, an add of
  two 16-element tensors): what one call of each kind costs in place, with the same GPU work.
  The op row less the pybind11 row is what our op's call path costs over the original's;
- ours, pybind11 entry (with --pybind-probe):  our forward op called from a pybind11 function
  through the C++ dispatcher (bench/experiments/pybind_entry_probe.py, JIT-built): our op without the
  ``torch.ops`` entry from Python.

Each side's calls are also timed where they run (a perf_counter before and after each call of
the side's ``fwd`` inside the model, the same wrapper on every side): the table's last column,
the median host time of one call in place, which the calibration rows need not convert.

Why: the LM forward waits on the host, and a call timed in a loop runs warm; in a model each
call runs between other work. The calibration rows show how added host time passes into the
wall time: on the H200 monotonically but not one for one (docs/notes/bench-passes.md, fifteenth pass), so
they rank the sides' costs, and the last column gives each call's own time.
Both sides' files are checked (bench/provenance.py) and printed first; exit 2 when they fail.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
import e2e_ab  # noqa: E402
import e2e_mamba as e2e  # noqa: E402
import provenance  # noqa: E402


def busy(us: float, fn):
    def call(*args):
        end = time.perf_counter() + us * 1e-6
        while time.perf_counter() < end:
            pass
        return fn(*args)

    return call


def extra_call_sides(orig_fwd, entry, paired_fwd_args) -> dict:
    """Sides that make the original's call and then one more tiny call of a given kind."""
    g = torch.Generator(device="cuda").manual_seed(1)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    f32 = dict(device="cuda", dtype=torch.float32)
    u, delta, z = (torch.randn(1, 16, 16, generator=g, **bf) for _ in range(3))
    A = -torch.rand(16, 16, generator=g, **f32)
    B, C = (torch.randn(1, 1, 16, 16, generator=g, **bf) for _ in range(2))
    D, bias = torch.rand(16, generator=g, **f32), torch.rand(16, generator=g, **f32)
    layout = paired_fwd_args(16)
    add = torch.ops.aten.add.Tensor._op
    tiny = {
        "pybind11 call": lambda: orig_fwd(u, delta, A, B, C, D, z, bias, True),
        "our op call": lambda: entry(u, delta, A, B, C, D, z, bias, True, True, *layout),
        "aten call": lambda: add(D, bias),
    }

    def then(extra):
        def call(*args):
            r = orig_fwd(*args)
            extra()
            return r

        return call

    return {f"orig + one more {k}": then(fn) for k, fn in tiny.items()}


def timed(fn, log: list):
    """fn, logging the host seconds of each call."""
    clock = time.perf_counter

    def call(*args):
        t0 = clock()
        r = fn(*args)
        log.append(clock() - t0)
        return r

    return call


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orig-dir", required=True)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--pad", default="10,20", help="comma-separated us of the calibration sides")
    ap.add_argument("--pybind-probe", action="store_true", help="add the side of pybind_entry_probe.py")
    a = ap.parse_args()
    try:
        import mamba_ssm.ops.selective_scan_interface as iface

        lines = provenance.check_ours_client(e2e.ROOT, compiled=True)
        ours = iface.selective_scan_cuda
        lines.append(provenance.arm_ours_entry(ours))
        orig, so = provenance.load_original_extension(a.orig_dir, provenance.ORIG_SCAN_EXT)
    except Exception as e:
        print(f"PROVENANCE FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    from selective_scan import _ops
    from selective_scan.scan_fn import paired_fwd_args

    entry = _ops.fwd_entry

    def op_only(u, delta, A, B, C, D, z, delta_bias, softplus):
        layout = paired_fwd_args(u.shape[2])
        out, out_z, x = entry(u, delta, A, B, C, D, z, delta_bias, softplus, True, *layout)
        return [out, x, out_z]

    sides = {"orig": orig.fwd, "ours": ours.fwd, "ours, op only": op_only}
    for us in (float(v) for v in a.pad.split(",") if v):
        sides[f"orig + {us:g} us"] = busy(us, orig.fwd)
    sides.update(extra_call_sides(orig.fwd, entry, paired_fwd_args))
    if a.pybind_probe:
        import pybind_entry_probe

        probe = pybind_entry_probe.build()
        print(f"- pybind11 entry probe: {probe.__file__}")
        sides["ours, pybind11 entry"] = probe.fwd
    for line in lines + [f"original's {provenance.ORIG_SCAN_EXT}: {so}"]:
        print(f"- {line}")
    print(f"- {torch.cuda.get_device_name()}; torch {torch.__version__}; binding "
          f"{os.environ.get('MAMBA_KERNELS_BINDING', 'auto')}")

    sz = e2e.sizes(False)
    model, ids = e2e.mamba_lm(sz, "cuda", torch.bfloat16, torch.Generator().manual_seed(0))
    calls: dict = {k: [] for k in sides}
    modules = {k: types.SimpleNamespace(fwd=timed(f, calls[k]), bwd=orig.bwd) for k, f in sides.items()}

    def use(side: str) -> None:
        iface.selective_scan_cuda = modules[side]

    with torch.no_grad():
        fns = {k: (lambda: model(ids)) for k in sides}
        times = e2e_ab.interleaved(fns, use, a.reps, torch.cuda.synchronize)
    base = statistics.median(times["orig"])
    print(f"\nLM forward ({sz['n_layer']} layers, batch {sz['batch']}, L {sz['lm_L']}), bf16, no grad; "
          f"{a.reps} interleaved rounds, ms\n")
    print("| side | median | best | / orig | host us a call, in place (median) |\n|---|---|---|---|---|")
    for k, ts in times.items():
        per_call = statistics.median(calls[k]) * 1e6
        print(f"| {k} | {statistics.median(ts):.3f} | {min(ts):.3f} | {statistics.median(ts) / base:.3f} | "
              f"{per_call:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
