"""Side-by-side timing of the selective scan: ours against the original mamba_ssm.

    python3 bench/bench_selective_scan.py [--orig-dir DIR] [--orig-only] [--quick]
        [--only fwd,bwd,decode,overhead] [--shapes 8x2048x2048x16:bf16,...|tiny] [--device cuda|cpu]
        [--json PATH]

Sections, each one Markdown table:
  fwd       selective_scan_fn forward at each shape (batch x dim x seqlen x dstate : dtype)
  bwd       forward + backward: torch.autograd.grad of the output w.r.t. all eight inputs
  decode    selective_state_update, one token, dim 5120, dstate 16, batch 1 to 256
  overhead  host time per call at a tiny shape: selective_scan_fn and causal_conv1d_fn

Every shape uses what a Mamba block passes: variable B and C of shape (batch, 1, dstate,
seqlen), z, D (fp32), delta_bias (fp32, uniform in [-4, -1]) and delta_softplus=True;
A = -exp(randn) (fp32); delta = 0.5 * randn, so the softplus input is mostly in -5..0.

"call" is what a Python caller waits for: the median over repetitions of a CUDA-event-timed
loop of back-to-back calls (host overhead included; for decode, the host clock over 200 calls
with one synchronize at the end). "graph" replays the same calls from a CUDA graph: the
kernels' time. Input sets are rotated so that L2 does not hold the next call's inputs.
Before any time is reported, ours is compared with the original on the same inputs (max
absolute difference divided by the original's max absolute value, for the output and every
gradient); a shape where ours is off by more than the dtype's tolerance gets "wrong" instead
of times.

DIR holds the original's wheel installed with `pip install --no-deps --target DIR`. Only its
operator modules are imported (mamba_ssm.ops.selective_scan_interface with its compiled
selective_scan_cuda, and the Triton mamba_ssm.ops.triton.selective_state_update); the
package's top-level __init__, which pulls in the model classes and their dependencies, is not
run. einops and triton must be importable. Our side follows MAMBA_KERNELS_BACKEND; the header
says which path (compiled or PyTorch) ours took.

Provenance (bench/provenance.py), before anything is timed: the original's interface must be the
one under DIR and the selective_scan_cuda it binds DIR's compiled file (loaded from that file,
so our compatibility module selective_scan_cuda.py cannot stand in for it whatever sys.path
says); ours must be this checkout's packages with, on CUDA, their compiled extensions. The
header lists every module's file; a side that is not what it claims stops the run (exit 2).
`--device cpu --shapes tiny` is a smoke test of our side alone. ``--json PATH`` also writes the
fwd, bwd and decode rows as bench/results records (``python3 bench/results.py update PATH``).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import re
import statistics
import sys
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (ROOT, os.path.dirname(os.path.abspath(__file__))):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import _timing as T  # noqa: E402  (bench/ is not a package)
import provenance  # noqa: E402
import results  # noqa: E402  (bench/results.py: the results page's records)

Tensor = torch.Tensor
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
DEFAULT_SHAPES = ["8x2048x2048x16:bf16", "4x5120x2048x16:bf16", "2x2048x8192x16:bf16", "8x2048x2048x16:fp32"]
TINY_SHAPE = "2x64x256x16:fp32"
DECODE_DIM, DECODE_DSTATE, DECODE_BATCHES = 5120, 16, [1, 16, 64, 256]
OVERHEAD_SHAPE = (1, 64, 128, 16)  # batch, dim, seqlen, dstate
OVERHEAD_ROUNDS = 5  # interleaved rounds of the host-overhead rows
# Largest accepted max|ours - original| / max|original|, per input dtype: both sides compute
# in fp32, so the differences are the rounding of 16-bit outputs and of fp32 sums.
TOLERANCE = {torch.float32: 2e-3, torch.float16: 1e-2, torch.bfloat16: 3e-2}
SCAN_ARGS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
SECTIONS = ("fwd", "bwd", "decode", "overhead")


@dataclass
class Impl:
    """One side of the comparison: its selective_scan_fn and selective_state_update."""

    name: str
    scan: Optional[Callable] = None
    update: Optional[Callable] = None
    conv: Optional[Callable] = None
    about: List[str] = field(default_factory=list)


# ---------------------------------------------------------------- loading both sides


def load_original(orig_dir: str) -> Impl:
    """The original's operator modules from its --target install in ``orig_dir``, its interface
    bound to that install's own compiled selective_scan_cuda (bench/provenance.py proves it:
    ProvenanceError, and so no timing, otherwise). mamba_ssm's __init__ (model classes and their
    dependencies) is not run."""
    impl = Impl("original")
    try:
        mod, lines = provenance.load_original_scan(orig_dir)
    except provenance.ProvenanceError:
        raise
    except Exception as e:  # missing einops, an extension built for another torch, ...
        raise provenance.ProvenanceError(f"original: its interface did not import: {_brief(e)}") from e
    impl.scan = mod.selective_scan_fn
    impl.about += lines
    try:
        mod = importlib.import_module("mamba_ssm.ops.triton.selective_state_update")
        impl.update = mod.selective_state_update
        import triton

        impl.about.append(f"selective_state_update: Triton {triton.__version__} ({mod.__file__})")
    except Exception as e:
        impl.about.append(f"selective_state_update not loaded: {type(e).__name__}: {e}")
    return impl


def load_ours(device: str) -> Impl:
    try:
        import causal_conv1d
        import selective_scan
        from mamba_kernels.runtime import dispatch, knobs
    except Exception as e:  # a broken checkout: nothing to compare
        raise provenance.ProvenanceError(f"ours: import failed: {_brief(e)}") from e
    impl = Impl("ours", selective_scan.selective_scan_fn, selective_scan.selective_state_update,
                causal_conv1d.causal_conv1d_fn)
    mode = knobs.backend_mode()
    impl.about.append(f"mamba-kernels {selective_scan.__version__}, git {T.git_revision(ROOT)}, "
                      f"MAMBA_KERNELS_BACKEND={os.environ.get(knobs.BACKEND_VAR, '')!r} ({mode})")
    # on CUDA (unless the PyTorch path is asked for) our compiled kernels of this checkout, or no run
    compiled = device == "cuda" and mode != "reference"
    impl.about += provenance.check_ours_package(ROOT, compiled=compiled)
    for kernel in ("selective_scan", "causal_conv1d"):
        st = dispatch.extension_status(kernel)
        if device != "cuda" or mode == "reference":
            path = "PyTorch path"
        elif st.module is not None:
            path = "compiled CUDA kernel"
        elif mode == "cuda":
            path = "no compiled kernel, so every call raises"
        else:
            path = "PyTorch fallback"
        impl.about.append(f"{kernel}: {path} ({st.reason})")
    return impl


# ---------------------------------------------------------------- inputs and checks


def parse_shapes(spec: str) -> List[Tuple[int, int, int, int, torch.dtype]]:
    names = []
    for item in spec.split(","):
        item = item.strip()
        if item == "all":
            names += DEFAULT_SHAPES
        elif item == "tiny":
            names.append(TINY_SHAPE)
        elif item:
            names.append(item)
    shapes = []
    for name in names:
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)x(\d+):(bf16|fp16|fp32)", name)
        if not m:
            raise SystemExit(
                f"--shapes: {name!r} is not BATCHxDIMxSEQLENxDSTATE:bf16|fp16|fp32, 'all' or 'tiny'"
            )
        b, d, L, n = (int(g) for g in m.groups()[:4])
        shapes.append((b, d, L, n, DTYPES[m.group(5)]))
    return shapes


def scan_inputs(b: int, d: int, L: int, n: int, dtype: torch.dtype, device: str, seed: int,
                grad: bool) -> Tuple[Tuple[Tensor, ...], Optional[Tensor]]:
    g = torch.Generator(device=device).manual_seed(seed)

    def rn(*shape, dt=dtype, scale=1.0):
        return (scale * torch.randn(*shape, generator=g, device=device, dtype=torch.float32)).to(dt)

    u = rn(b, d, L)
    delta = rn(b, d, L, scale=0.5)
    A = -torch.exp(rn(d, n, dt=torch.float32))
    B = rn(b, 1, n, L)
    C = rn(b, 1, n, L)
    D = rn(d, dt=torch.float32)
    z = rn(b, d, L)
    delta_bias = -1.0 - 3.0 * torch.rand(d, generator=g, device=device)
    args = (u, delta, A, B, C, D, z, delta_bias)
    if not grad:
        return args, None
    return tuple(t.requires_grad_() for t in args), rn(b, d, L)


def _brief(e: Exception) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


def rel_err(ours: Tensor, ref: Tensor) -> float:
    """max|ours - ref| / max|ref|; inf when either holds a non-finite value."""
    a, r = ours.detach().float(), ref.detach().float()
    if not (torch.isfinite(a).all() and torch.isfinite(r).all()):
        return math.inf
    return (a - r).abs().max().item() / max(r.abs().max().item(), 1e-30)


def _call_scan(scan: Callable, args: Sequence[Tensor]) -> Tensor:
    u, delta, A, B, C, D, z, delta_bias = args
    return scan(u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=True)


def _fwd(scan: Callable, sets: List[Tuple[Tensor, ...]], i: int) -> None:
    _call_scan(scan, sets[i])


def _fwdbwd(scan: Callable, sets: List[Tuple[Tensor, ...]], gouts: List[Tensor], i: int) -> None:
    out = _call_scan(scan, sets[i])
    torch.autograd.grad(out, sets[i], gouts[i])


def _grads(scan: Callable, args: Sequence[Tensor], gout: Tensor) -> Tuple[Tensor, ...]:
    out = _call_scan(scan, args)
    return (out.detach(), *torch.autograd.grad(out, args, gout))


def _verdict(errs: Dict[str, float], dtype: torch.dtype) -> Tuple[bool, str]:
    """(ok, 'worst: NAME ERR') over the named relative errors."""
    if not errs:
        return True, "unchecked"
    name, worst = max(errs.items(), key=lambda kv: kv[1])
    ok = worst <= TOLERANCE[dtype]
    return ok, f"{'ok' if ok else 'WRONG'}, worst {name} {worst:.1e}"


# ---------------------------------------------------------------- sections


@dataclass
class Options:
    device: str
    quick: bool
    seed: int

    @property
    def reps(self) -> int:
        return 10 if self.quick else 30

    @property
    def inner(self) -> int:
        return 3 if self.quick else 10

    @property
    def budget(self) -> float:
        return 500.0 if self.quick else T.DEFAULT_BUDGET_MS


def _timings(fn: Callable[[int], None], n_sets: int, opt: Options, notes: List[str], what: str,
             inner: Optional[int] = None) -> Tuple[Optional[float], Optional[float]]:
    """(call ms, graph ms) of ``fn``; graph is None on CPU or when capture fails."""
    kw = dict(reps=opt.reps, inner=inner or opt.inner, device=opt.device, budget_ms=opt.budget)
    call = T.safe(partial(T.time_ms, fn, n_sets, **kw), notes, f"{what} call")
    graph = None
    if opt.device == "cuda" and call is not None:
        graph = T.safe(partial(T.time_ms, fn, n_sets, graph=True, **kw), notes, f"{what} CUDA graph")
    return call, graph


def _cells(res: Dict[str, Tuple[Optional[float], Optional[float]]], impls: List[Impl], wrong: bool,
           digits: int = 3) -> List[str]:
    cells = []
    for impl in impls:
        if impl.name == "ours" and wrong:
            cells += ["wrong", "wrong"]
        elif impl.name in res:
            call, graph = res[impl.name]
            cells += [T.fmt(call, digits), T.fmt(graph, digits)]
        else:
            cells += ["n/a", "n/a"]
    if len(impls) == 2 and not wrong:
        o, g = res.get("ours", (None, None)), res.get("original", (None, None))
        cells += [T.ratio(g[0], o[0]), T.ratio(g[1], o[1])]
    elif len(impls) == 2:
        cells += ["-", "-"]
    return cells


def _table_head(first: List[str], impls: List[Impl], unit: str, last: Sequence[str] = ()) -> None:
    cols = list(first)
    for impl in impls:
        cols += [f"{impl.name} call {unit}", f"{impl.name} graph {unit}"]
    if len(impls) == 2:
        cols += ["speedup call", "speedup graph"]
    cols += list(last)
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols), flush=True)


def _row(cells: List[str]) -> None:
    print("| " + " | ".join(cells) + " |", flush=True)


def _notes(notes: List[str]) -> None:
    for n in notes:
        print(f"- {n}")
    print(flush=True)


def _free(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


def scan_section(kind: str, shapes, impls: List[Impl], opt: Options,
                 measured: Optional[List[dict]] = None) -> None:
    grad = kind == "bwd"
    impls = [i for i in impls if i.scan is not None]
    title = "forward + backward (autograd.grad w.r.t. all 8 inputs)" if grad else "forward"
    print(f"\n## selective_scan_fn {title}, ms per call\n")
    if not impls:
        print("(no implementation loaded)\n")
        return
    check = "max rel. error of ours vs original, out" + (" and 8 grads" if grad else "")
    _table_head(["shape (b, d, L, n)", "dtype", check], impls, "ms")
    notes: List[str] = []
    for b, d, L, n, dtype in shapes:
        label = f"({b}, {d}, {L}, {n}) {DTYPE_NAMES[dtype]}"
        set_bytes = 3 * b * d * L * dtype.itemsize * (2 if grad else 1)
        n_sets = T.n_sets_for(set_bytes)
        sets, gouts = [], []
        for k in range(n_sets):
            args, gout = scan_inputs(b, d, L, n, dtype, opt.device, opt.seed + k, grad)
            sets.append(args)
            gouts.append(gout)
        errs: Dict[str, float] = {}
        if len(impls) == 2:
            try:
                if grad:
                    outs = [_grads(impl.scan, sets[0], gouts[0]) for impl in impls]
                    names = ["out"] + ["d" + a for a in SCAN_ARGS]
                else:
                    with torch.no_grad():
                        outs = [(_call_scan(impl.scan, sets[0]),) for impl in impls]
                    names = ["out"]
                byname = dict(zip([i.name for i in impls], outs))
                errs = {nm: rel_err(o, r) for nm, o, r in zip(names, byname["ours"], byname["original"])}
                del outs, byname
            except Exception as e:
                notes.append(f"{label}: check failed: {_brief(e)}")
                errs = {"check": math.inf}
            if grad and "check" not in errs:
                notes.append(f"{label}: " + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
        ok, verdict = _verdict(errs, dtype)
        res = {}
        for impl in impls:
            if impl.name == "ours" and not ok:
                continue
            fn = partial(_fwdbwd, impl.scan, sets, gouts) if grad else partial(_fwd, impl.scan, sets)
            if grad:
                res[impl.name] = _timings(fn, n_sets, opt, notes, f"{label} {impl.name}")
            else:
                with torch.no_grad():
                    res[impl.name] = _timings(fn, n_sets, opt, notes, f"{label} {impl.name}")
        _row([f"({b}, {d}, {L}, {n})", DTYPE_NAMES[dtype], verdict] + _cells(res, impls, not ok))
        if measured is not None and ok:
            measured.append({"section": kind, "shape": f"({b}, {d}, {L}, {n})", "dtype": DTYPE_NAMES[dtype],
                             "res": dict(res)})
        del sets, gouts
        _free(opt.device)
    print()
    _notes(notes)


def decode_inputs(batch: int, dim: int, dstate: int, device: str, seed: int) -> Tuple[Tensor, ...]:
    g = torch.Generator(device=device).manual_seed(seed)

    def rn(*shape, dt=torch.bfloat16, scale=1.0):
        return (scale * torch.randn(*shape, generator=g, device=device)).to(dt)

    state = rn(batch, dim, dstate, dt=torch.float32)
    x, dt, z = rn(batch, dim), rn(batch, dim, scale=0.5), rn(batch, dim)
    A = -torch.exp(rn(dim, dstate, dt=torch.float32))
    B, C = rn(batch, dstate), rn(batch, dstate)
    D = rn(dim, dt=torch.float32)
    dt_bias = -1.0 - 3.0 * torch.rand(dim, generator=g, device=device)
    return state, x, dt, A, B, C, D, z, dt_bias


def _call_update(update: Callable, args: Sequence[Tensor]) -> Tensor:
    state, x, dt, A, B, C, D, z, dt_bias = args
    return update(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True)


def _upd(update: Callable, sets: List[Tuple[Tensor, ...]], i: int) -> None:
    _call_update(update, sets[i])


def _copy_state(sets: List[Tuple[Tensor, ...]], i: int) -> None:
    sets[i][0].mul_(1.0)


DECODE_GRAPH_INNER = 20    # calls in one graph
DECODE_GRAPH_ROUNDS = 60   # paired replays of each side's graph


def _paired_graphs(timers: Dict[str, Optional[Callable[[], float]]], opt: Options,
                   res: Dict[str, Tuple[Optional[float], Optional[float]]],
                   ) -> Optional[Tuple[float, float, float]]:
    """Replays each side's graph in paired rounds and fills in res's graph times (each side's
    median); with both sides, the median of the rounds' speedups (original / ours) and its
    95 % interval (None when a side has no graph)."""
    live = {k: t for k, t in timers.items() if t is not None}
    if not live:
        return None
    samples = T.paired_rounds(live, DECODE_GRAPH_ROUNDS if not opt.quick else 20)
    for name, xs in samples.items():
        res[name] = (res[name][0], statistics.median(xs))
    if set(samples) != {"ours", "original"}:
        return None
    speedups = [o / u for o, u in zip(samples["original"], samples["ours"])]
    lo, hi = T.median_ci(speedups)
    return statistics.median(speedups), lo, hi


def decode_section(batches: Sequence[int], dim: int, impls: List[Impl], opt: Options,
                   measured: Optional[List[dict]] = None) -> None:
    impls = [i for i in impls if i.update is not None]
    print(f"\n## selective_state_update (decode, one token), dim {dim}, dstate {DECODE_DSTATE}, "
          "state fp32, x/dt/z/B/C bf16, ms per call\n")
    if not impls:
        print("(no implementation loaded)\n")
        return
    last = ["state copy graph ms"] if opt.device == "cuda" else []
    if len(impls) == 2 and opt.device == "cuda":
        last = ["speedup graph, 95 % interval"] + last
    _table_head(["batch", "max rel. error of ours vs original (out, new state)"], impls, "ms", last)
    notes: List[str] = []
    calls, reps = (100, 3) if opt.quick else (200, 5)
    for batch in batches:
        n_sets = T.n_sets_for(batch * dim * (DECODE_DSTATE * 4 + 8))
        sets = [decode_inputs(batch, dim, DECODE_DSTATE, opt.device, opt.seed + k) for k in range(n_sets)]
        errs: Dict[str, float] = {}
        if len(impls) == 2:
            try:
                with torch.no_grad():
                    got = {}
                    for impl in impls:
                        args = (sets[0][0].clone(),) + sets[0][1:]
                        got[impl.name] = (_call_update(impl.update, args), args[0])
                errs = {nm: rel_err(o, r) for nm, o, r in zip(("out", "state"), got["ours"], got["original"])}
            except Exception as e:
                notes.append(f"batch {batch}: check failed: {_brief(e)}")
                errs = {"check": math.inf}
        ok, verdict = _verdict(errs, torch.bfloat16)
        res, timers = {}, {}
        with torch.no_grad():
            for impl in impls:
                if impl.name == "ours" and not ok:
                    continue
                fn = partial(_upd, impl.update, sets)
                what = f"batch {batch} {impl.name}"
                call = T.safe(partial(T.wall_ms, fn, n_sets, calls=calls, reps=reps, device=opt.device),
                              notes, f"{what} call")
                if opt.device == "cuda" and call is not None:
                    graph_timer = partial(T.loop_timer, fn, n_sets, DECODE_GRAPH_INNER, graph=True)
                    timers[impl.name] = T.safe(graph_timer, notes, f"{what} CUDA graph")
                res[impl.name] = (call, None)  # the graph time: _paired_graphs
            paired = _paired_graphs(timers, opt, res)
        floor = []
        if opt.device == "cuda":  # the state read and written once in place: the step's bandwidth floor
            timed = partial(T.time_ms, partial(_copy_state, sets), n_sets, graph=True, reps=opt.reps,
                            inner=20, device=opt.device, budget_ms=opt.budget)
            floor = [T.fmt(T.safe(timed, notes, f"batch {batch} state copy"), 4)]
        cell = "-" if paired is None else f"{paired[0]:.3f}x ({paired[1]:.3f}-{paired[2]:.3f})"
        interval = [cell] if len(impls) == 2 and opt.device == "cuda" else []
        _row([str(batch), verdict] + _cells(res, impls, not ok, digits=4) + interval + floor)
        if measured is not None and ok:
            shape = f"batch {batch}, dim {dim}, dstate {DECODE_DSTATE}"
            measured.append({"section": "decode", "shape": shape, "dtype": "fp32 state, bf16 activations",
                             "res": dict(res), "paired": paired})
        del sets
        _free(opt.device)
    print("\n\"call\": host clock over back-to-back calls from Python, one synchronize at the end. "
          f"\"graph\": {DECODE_GRAPH_INNER} calls captured in a CUDA graph per side, the two graphs "
          f"replayed in {DECODE_GRAPH_ROUNDS} paired rounds (the first side alternating): each side's "
          "median, and the median of the rounds' ratios with its 95 % interval (order statistics). "
          "\"state copy\": the state multiplied by 1 in place (read and written once, PyTorch's "
          "elementwise kernel) from the same CUDA graph: what moving the state alone costs.\n")
    _notes(notes)


def overhead_section(impls: List[Impl], opt: Options) -> None:
    b, d, L, n = OVERHEAD_SHAPE
    dtype = torch.bfloat16 if opt.device == "cuda" else torch.float32
    print(f"\n## Host overhead per call at a tiny shape (batch {b}, dim {d}, seqlen {L}, dstate {n}, "
          f"{DTYPE_NAMES[dtype]}), microseconds\n")
    print("| function | side | call us (median of rounds) | call us (best round) | graph (kernels) us | "
          "overhead us (median) | overhead us (best) |")
    print("|---|---|---|---|---|---|---|", flush=True)
    notes: List[str] = []
    n_sets = 4
    rows: List[Tuple[str, str, Callable[[int], None], bool]] = []
    fsets = [scan_inputs(b, d, L, n, dtype, opt.device, opt.seed + k, False)[0] for k in range(n_sets)]
    gsets, gouts = [], []
    for k in range(n_sets):
        args, gout = scan_inputs(b, d, L, n, dtype, opt.device, opt.seed + k, True)
        gsets.append(args)
        gouts.append(gout)
    for impl in impls:
        if impl.scan is not None:
            rows.append(("selective_scan_fn forward", impl.name, partial(_fwd, impl.scan, fsets), True))
            rows.append(("selective_scan_fn forward+backward", impl.name,
                         partial(_fwdbwd, impl.scan, gsets, gouts), False))
    conv_sets = []
    for k in range(n_sets):
        g = torch.Generator(device=opt.device).manual_seed(opt.seed + k)
        conv_sets.append((torch.randn(b, d, L, generator=g, device=opt.device).to(dtype),
                          torch.randn(d, 4, generator=g, device=opt.device).to(dtype) / 4,
                          torch.randn(d, generator=g, device=opt.device).to(dtype)))
    for impl in impls:
        if impl.conv is not None:
            rows.append(("causal_conv1d_fn (width 4, bias, silu)", impl.name,
                         partial(_conv, impl.conv, conv_sets), True))
    calls = overhead_rounds(rows, n_sets, opt, notes)
    for (name, side, fn, nograd), rounds in zip(rows, calls):
        graph = None
        if opt.device == "cuda" and rounds:
            timed = partial(T.time_ms, fn, n_sets, graph=True, reps=opt.reps, inner=50, device=opt.device,
                            budget_ms=opt.budget)
            with torch.set_grad_enabled(not nograd):
                graph = T.safe(timed, notes, f"{name} {side} CUDA graph")
        med = statistics.median(rounds) if rounds else None
        best = min(rounds) if rounds else None
        over = [None if c is None or graph is None else 1e3 * (c - graph) for c in (med, best)]
        _row([name, side, T.fmt(med and 1e3 * med, 1), T.fmt(best and 1e3 * best, 1),
              T.fmt(graph and 1e3 * graph, 1), T.fmt(over[0], 1), T.fmt(over[1], 1)])
    print(f"\n\"call\": CUDA-event-timed loop of back-to-back calls (host-bound at this size), measured in "
          f"{OVERHEAD_ROUNDS} rounds; each round times every row once, both sides' rows interleaved and in "
          "reverse order every other round, so that a host slowing down or speeding up during the run "
          "reaches both sides alike. overhead = call - graph.\n")
    _notes(notes)


def overhead_rounds(rows: Sequence[Tuple[str, str, Callable[[int], None], bool]], n_sets: int, opt: Options,
                    notes: List[str]) -> List[List[float]]:
    """Each row's call time (ms) in every round that measured it: OVERHEAD_ROUNDS rounds, each
    timing every row once, in the rows' order and in reverse order every other round."""
    reps = max(5, opt.reps // OVERHEAD_ROUNDS)
    out: List[List[float]] = [[] for _ in rows]
    for r in range(OVERHEAD_ROUNDS):
        order = range(len(rows)) if r % 2 == 0 else reversed(range(len(rows)))
        for i in order:
            name, side, fn, nograd = rows[i]
            with torch.set_grad_enabled(not nograd):
                call = T.safe(partial(T.time_ms, fn, n_sets, reps=reps, inner=50, device=opt.device,
                                      budget_ms=opt.budget), notes, f"{name} {side} call, round {r + 1}")
            if call is not None:
                out[i].append(call)
    return out


def _conv(conv: Callable, sets: List[Tuple[Tensor, ...]], i: int) -> None:
    x, w, bias = sets[i]
    conv(x, w, bias, activation="silu")


# ---------------------------------------------------------------- main


def header(impls: List[Impl], args: argparse.Namespace, orig_about: List[str]) -> None:
    import platform

    print("# Selective scan: ours vs mamba_ssm\n")
    print(f"- date: {T.utc_now()}")
    print(f"- command: `{T.command_line(['MAMBA_KERNELS_BACKEND', 'CUDA_VISIBLE_DEVICES'])}`")
    if args.device == "cuda":
        print(f"- GPU: {T.gpu_description()}")
    print(f"- host: {platform.node() or '?'}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"- torch {torch.__version__}, CUDA {torch.version.cuda}"
          + (f", triton {_triton_version()}" if args.device == "cuda" else ""))
    for impl in impls:
        if impl.name == "ours":
            print(f"- ours: {'; '.join(impl.about)}")
    if orig_about:
        print(f"- original: {'; '.join(orig_about)}")
    print(f"- shapes: variable B, C (batch, 1, dstate, seqlen), z, D fp32, delta_bias fp32, softplus; "
          f"tolerance of the check: fp32 {TOLERANCE[torch.float32]:g}, bf16 {TOLERANCE[torch.bfloat16]:g}, "
          f"fp16 {TOLERANCE[torch.float16]:g}")
    print(flush=True)


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except Exception:
        return "absent"


SECTION_OPS = {"fwd": "selective_scan fwd", "bwd": "selective_scan fwd+bwd",
               "decode": "selective_state_update"}


def json_records(measured: Sequence[dict], context: Dict[str, str]) -> List[dict]:
    """The fwd, bwd and decode rows as bench/results records: scan rows by the call from Python
    (with the graph's ratio beside it), decode rows by the paired graph rounds and by the call."""
    recs = []
    for m in measured:
        op, res = SECTION_OPS[m["section"]], m["res"]
        o_call, o_graph = res.get("ours", (None, None))
        g_call, g_graph = res.get("original", (None, None))
        common = dict(op=op, shape=m["shape"], dtype=m["dtype"], unit="ms", context=context)
        if m["section"] != "decode":
            if o_call is not None:
                rg = round(g_graph / o_graph, 3) if g_graph and o_graph else None
                recs.append(results.speedup_record(ours=o_call, original=g_call, variant="call from Python",
                                                   ratio_graph=rg, **common))
            continue
        if o_graph is not None:
            paired = m.get("paired")
            extra = {} if paired is None else {"ratio": round(paired[0], 3),
                                               "interval": [round(paired[1], 3), round(paired[2], 3)]}
            recs.append(results.speedup_record(ours=o_graph, original=g_graph, variant="graph",
                                               **extra, **common))
        if o_call is not None:
            recs.append(results.speedup_record(ours=o_call, original=g_call, variant="call from Python",
                                               **common))
    return recs


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orig-dir", default=None, help="where the original's wheel was installed (--target)")
    ap.add_argument("--orig-only", action="store_true", help="time the original alone (ours not imported)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of: {', '.join(SECTIONS)}")
    ap.add_argument("--shapes", default="all", help="comma list of BxDxLxN:dtype, 'all' (default) or 'tiny'")
    ap.add_argument("--decode-batches", default=None, help="comma list (default 1,16,64,256; 1,4 with tiny)")
    ap.add_argument("--decode-dim", type=int, default=None, help=f"default {DECODE_DIM}; 256 with tiny")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH",
                    help="also write the fwd, bwd and decode rows as bench/results records")
    args = ap.parse_args(argv)
    only = [s.strip().replace("fwdbwd", "bwd") for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        ap.error(f"--only: unknown section(s) {', '.join(unknown)}; use {', '.join(SECTIONS)}")
    shapes = parse_shapes(args.shapes)
    tiny = args.shapes.strip() == "tiny"
    batches = [int(x) for x in (args.decode_batches or ("1,4" if tiny else "1,16,64,256")).split(",")]
    dim = args.decode_dim or (256 if tiny else DECODE_DIM)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu for the smoke test of our side", file=sys.stderr)
        return 1
    if args.device == "cpu" and (args.orig_dir or args.orig_only):
        ap.error("the original runs on CUDA only: drop --orig-dir/--orig-only with --device cpu")
    if args.orig_only and not args.orig_dir:
        ap.error("--orig-only needs --orig-dir")

    impls: List[Impl] = []
    orig_about: List[str] = []
    try:  # provenance first, and refused loudly: nothing is timed on a side that is not itself
        if args.orig_dir:  # before ours, so that nothing of ours is imported under its names
            orig = load_original(args.orig_dir)
            orig_about = orig.about
        if not args.orig_only:
            impls.append(load_ours(args.device))
        if args.orig_dir:
            impls.append(orig)
    except provenance.ProvenanceError as e:
        print(f"PROVENANCE FAILED: {e}", file=sys.stderr)
        return 2
    if not args.orig_dir:
        orig_about = ["not loaded (no --orig-dir): nothing is checked against it"]
    header(impls, args, orig_about)
    opt = Options(args.device, args.quick, args.seed)
    measured: List[dict] = []
    if "fwd" in only:
        scan_section("fwd", shapes, impls, opt, measured)
    if "bwd" in only:
        scan_section("bwd", shapes, impls, opt, measured)
    if "decode" in only:
        decode_section(batches, dim, impls, opt, measured)
    if "overhead" in only:
        overhead_section(impls, opt)
    if args.json:
        context = T.run_context(ROOT, ("MAMBA_KERNELS_BINDING",))
        results.write_records(args.json, json_records(measured, context))
    return 0


if __name__ == "__main__":
    sys.exit(main())
