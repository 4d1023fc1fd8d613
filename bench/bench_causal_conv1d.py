"""Side-by-side timing of causal_conv1d: ours, the original causal-conv1d (its compiled
extension and its cpp_functions, loaded from files so the two packages named causal_conv1d
do not collide) and torch's grouped conv1d. Prints markdown tables.

    python3 bench/bench_causal_conv1d.py [--orig-dir DIR] [--quick] [--json PATH]

DIR holds the original's installed wheel (causal_conv1d_cuda*.so and causal_conv1d/); its
cpp_functions must bind that .so and ours must be this checkout's compiled extensions
(bench/provenance.py; exit 2 before timing otherwise, and the header names each file). Every
time is the median over many repetitions, timed with CUDA events after a warm-up, each
repetition a loop of calls on rotating input sets (so L2 holds none of them). "eager" runs
the public functional layer (causal_conv1d.cpp_functions on both sides), Python overhead
included; "graph" replays the same calls from a CUDA graph: kernel time only. ``--json PATH``
also writes the graph times as bench/results records (``python3 bench/results.py update PATH``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
from functools import partial
from types import ModuleType
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (ROOT, os.path.dirname(os.path.abspath(__file__))):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import _timing as T  # noqa: E402
import provenance  # noqa: E402  (bench/provenance.py: what each side loaded)
import results  # noqa: E402  (bench/results.py: the results page's records)

SHAPES = [  # (batch, dim, seqlen, width), dtype
    ((8, 5120, 2048, 4), torch.bfloat16),
    ((4, 4096, 8192, 4), torch.bfloat16),
    ((8, 5120, 2048, 4), torch.float32),
    ((16, 2048, 4096, 2), torch.float16),
]
DECODE = [(64, 5120), (128, 5120), (256, 5120)]  # (batch, dim), width 4, bf16, one token


def load_original(orig_dir: str) -> Tuple[ModuleType, List[str]]:
    """The original's cpp_functions, bound to its own compiled causal_conv1d_cuda (loaded from
    its file in ``orig_dir`` and checked after the import: ProvenanceError otherwise)."""
    py = os.path.join(orig_dir, "causal_conv1d", "cpp_functions.py")
    if not os.path.exists(py):
        raise provenance.ProvenanceError(f"original: no causal_conv1d/cpp_functions.py in {orig_dir}")
    _, so = provenance.bind_original_extension(orig_dir, provenance.ORIG_CONV_EXT)
    spec = importlib.util.spec_from_file_location("orig_causal_conv1d_cpp_functions", py)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    what = "original: cpp_functions.causal_conv1d_cuda"
    bound = provenance.require_compiled(what, getattr(mod, "causal_conv1d_cuda", None), orig_dir)
    return mod, [f"cpp_functions: {py}", f"cpp_functions.causal_conv1d_cuda: {bound}"]


def time_ms(
    fn: Callable[[int], None], n_sets: int, reps: int = 30, inner: int = 10, graph: bool = False
) -> float:
    """Median milliseconds of one call; fn(i) runs the call on input set i."""
    def loop() -> None:
        for j in range(inner):
            fn(j % n_sets)

    for _ in range(3):
        loop()
    torch.cuda.synchronize()
    run = loop
    if graph:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            loop()  # warm-up on the side stream, as capture requires
            torch.cuda.synchronize()
            with torch.cuda.graph(g, stream=s):
                loop()
        torch.cuda.current_stream().wait_stream(s)
        run = g.replay
        run()
    torch.cuda.synchronize()
    times: List[float] = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (GB/s)."""
    n = 2 ** 30 // 2  # 1 GiB of bf16
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = time_ms(partial(_copy, dst, src), 1, reps=20, inner=5)
    return 2 * n * 2 / ms / 1e6


def _copy(dst: torch.Tensor, src: torch.Tensor, i: int) -> None:
    dst.copy_(src)


def _fwd(mod, xs, w, bias, i: int) -> None:
    mod.causal_conv1d_fwd_function(xs[i], w, bias, None, None, None, True)


def _fwdbwd(mod, xs, gs, w, bias, i: int) -> None:
    mod.causal_conv1d_fwd_function(xs[i], w, bias, None, None, None, True)
    mod.causal_conv1d_bwd_function(xs[i], w, bias, gs[i], None, None, None, None, False, True)


def _torch_fwd(xs, w1, b1, i: int) -> None:
    W, L = w1.shape[-1], xs[i].shape[-1]
    F.conv1d(xs[i], w1, b1, padding=W - 1, groups=w1.shape[0])[..., :L]


def _update(mod, x, state, w, bias, i: int) -> None:
    mod.causal_conv1d_update_function(x, state, w, bias, True, None, None)


def _safe(f: Callable[[], float]) -> Optional[float]:
    try:
        return f()
    except Exception as e:  # e.g. a path that cannot be captured in a graph
        print(f"<!-- skipped: {type(e).__name__}: {str(e)[:160]} -->")
        return None


def conv_cases(orig: Optional[ModuleType], copy_gbs: float, quick: bool) -> List[Dict[str, object]]:
    from causal_conv1d import cpp_functions as ours

    rows = []
    for (b, d, L, W), dtype in SHAPES:
        for layout in ("channel-first", "channel-last"):
            n_sets = 2 if b * d * L * dtype.itemsize > 2 ** 28 else 4
            xs, gs = [], []
            for _ in range(n_sets):
                if layout == "channel-last":
                    x = torch.randn(b, L, d, device="cuda", dtype=dtype).transpose(1, 2)
                    g = torch.randn(b, L, d, device="cuda", dtype=dtype).transpose(1, 2)
                else:
                    x = torch.randn(b, d, L, device="cuda", dtype=dtype)
                    g = torch.randn(b, d, L, device="cuda", dtype=dtype)
                xs.append(x)
                gs.append(g)
            w = torch.randn(d, W, device="cuda") / W
            bias = torch.randn(d, device="cuda")
            xbytes = b * d * L * dtype.itemsize
            impls: Dict[str, Optional[ModuleType]] = {"ours": ours, "original": orig}
            res: Dict[str, Dict[str, Optional[float]]] = {}
            for name, mod in impls.items():
                if mod is None:
                    continue
                fwd = partial(_fwd, mod, xs, w, bias)
                fwdbwd = partial(_fwdbwd, mod, xs, gs, w, bias)
                res[name] = {
                    "fwd": _safe(partial(time_ms, fwd, n_sets)),
                    "fwd_graph": _safe(partial(time_ms, fwd, n_sets, graph=True)),
                    "fwdbwd": _safe(partial(time_ms, fwdbwd, n_sets)),
                    "fwdbwd_graph": _safe(partial(time_ms, fwdbwd, n_sets, graph=True)),
                }
            if not quick:
                tfwd = partial(_torch_fwd, xs, w.to(dtype).unsqueeze(1), bias.to(dtype))
                res["torch"] = {"fwd": _safe(partial(time_ms, tfwd, n_sets, reps=10, inner=3))}
            rows.append({"shape": (b, d, L, W), "dtype": dtype, "layout": layout, "xbytes": xbytes,
                         "res": res, "copy": copy_gbs})
            del xs, gs
            torch.cuda.empty_cache()
    return rows


def decode_cases(orig: Optional[ModuleType]) -> List[Dict[str, object]]:
    from causal_conv1d import cpp_functions as ours

    rows = []
    for b, d in DECODE:
        W, dtype = 4, torch.bfloat16
        x = torch.randn(b, d, 1, device="cuda", dtype=dtype)
        w = torch.randn(d, W, device="cuda") / W
        bias = torch.randn(d, device="cuda")
        res = {}
        for name, mod in (("ours", ours), ("original", orig)):
            if mod is None:
                continue
            state = torch.randn(b, W - 1, d, device="cuda", dtype=dtype).transpose(1, 2)
            upd = partial(_update, mod, x, state, w, bias)
            res[name] = {"eager": _safe(partial(time_ms, upd, 1, reps=50, inner=20)),
                         "graph": _safe(partial(time_ms, upd, 1, reps=50, inner=20, graph=True))}
        rows.append({"batch": b, "dim": d, "res": res})
    return rows


def _fmt(v: Optional[float], digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _ratio(orig: Optional[float], ours: Optional[float]) -> str:
    return "-" if orig is None or ours is None else f"{orig / ours:.2f}x"


def print_tables(rows, dec, copy_gbs: float) -> None:
    print(f"\ndevice-to-device copy: {copy_gbs:.0f} GB/s (read + write)\n")
    print("| shape (b, d, L, W) | dtype | layout | ours fwd ms (graph) | GB/s | % copy | orig fwd ms (graph) "
          "| speedup fwd | torch conv1d fwd ms | ours fwd+bwd ms (graph) | orig fwd+bwd ms (graph) "
          "| speedup fwd+bwd |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        o, g = r["res"].get("ours", {}), r["res"].get("original", {})
        t = r["res"].get("torch", {})
        fg = o.get("fwd_graph") or o.get("fwd")
        gbs = 2 * r["xbytes"] / fg / 1e6 if fg else None
        print(
            f"| {r['shape']} | {str(r['dtype']).replace('torch.', '')} | {r['layout']} "
            f"| {_fmt(o.get('fwd'))} ({_fmt(o.get('fwd_graph'))}) | {_fmt(gbs, 0)} "
            f"| {_fmt(gbs and 100 * gbs / copy_gbs, 0)} "
            f"| {_fmt(g.get('fwd'))} ({_fmt(g.get('fwd_graph'))}) "
            f"| {_ratio(g.get('fwd_graph'), o.get('fwd_graph'))} "
            f"| {_fmt(t.get('fwd'))} "
            f"| {_fmt(o.get('fwdbwd'))} ({_fmt(o.get('fwdbwd_graph'))}) "
            f"| {_fmt(g.get('fwdbwd'))} ({_fmt(g.get('fwdbwd_graph'))}) "
            f"| {_ratio(g.get('fwdbwd_graph'), o.get('fwdbwd_graph'))} |"
        )
    print("\nGB/s counts one read of x and one write of out; speedups compare graph (kernel) times.\n")
    print("| decode (batch, dim), W=4 bf16 | ours eager ms | ours graph ms | orig eager ms | orig graph ms "
          "| speedup (graph) |")
    print("|---|---|---|---|---|---|")
    for r in dec:
        o, g = r["res"].get("ours", {}), r["res"].get("original", {})
        print(
            f"| ({r['batch']}, {r['dim']}) | {_fmt(o.get('eager'), 4)} | {_fmt(o.get('graph'), 4)} "
            f"| {_fmt(g.get('eager'), 4)} | {_fmt(g.get('graph'), 4)} "
            f"| {_ratio(g.get('graph'), o.get('graph'))} |"
        )


def json_records(rows, dec, context: Dict[str, str]) -> List[dict]:
    """The graph (kernel) times as bench/results records: what the tables' speedups compare."""
    recs = []
    for r in rows:
        o, g = r["res"].get("ours", {}), r["res"].get("original", {})
        dtype = str(r["dtype"]).replace("torch.", "")
        for op, key in (("causal_conv1d fwd", "fwd_graph"), ("causal_conv1d fwd+bwd", "fwdbwd_graph")):
            if o.get(key) is not None:
                recs.append(results.speedup_record(op, str(r["shape"]), dtype, o[key], g.get(key), "ms",
                                                   context, variant=f"{r['layout']}, graph"))
    for r in dec:
        o, g = r["res"].get("ours", {}), r["res"].get("original", {})
        if o.get("graph") is not None:
            shape = f"({r['batch']}, {r['dim']})"
            recs.append(results.speedup_record("causal_conv1d update", shape, "bfloat16", o["graph"],
                                               g.get("graph"), "ms", context, variant="graph"))
    return recs


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orig-dir", default=None, help="directory with the original's installed wheel")
    ap.add_argument("--quick", action="store_true", help="skip the torch conv1d baseline")
    ap.add_argument("--json", metavar="PATH", help="also write the results as bench/results records")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 1
    os.environ.setdefault("MAMBA_KERNELS_BACKEND", "cuda")
    try:  # provenance before timing: each side is what its column says, or no run
        orig, orig_lines = None, ["not loaded (no --orig-dir)"]
        if args.orig_dir:
            orig, orig_lines = load_original(args.orig_dir)
        ours_lines = provenance.check_ours_package(ROOT)
    except provenance.ProvenanceError as e:
        print(f"PROVENANCE FAILED: {e}", file=sys.stderr)
        return 2
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"- ours: {'; '.join(ours_lines)}")
    print(f"- original: {'; '.join(orig_lines)}")
    copy_gbs = copy_bandwidth()
    rows = conv_cases(orig, copy_gbs, args.quick)
    dec = decode_cases(orig)
    print_tables(rows, dec, copy_gbs)
    if args.json:
        results.write_records(args.json, json_records(rows, dec, T.run_context(ROOT)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
