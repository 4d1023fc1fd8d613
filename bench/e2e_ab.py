"""mamba_ssm end to end, ours and the original in one process, their calls interleaved.

    python bench/e2e_ab.py --orig-dir DIR --dir D [--dtypes bfloat16] [--reps 15] [--tiny] [--device cuda]
                           [--control ours|orig]

Why one process: the small block's, the LM's and generate's rows are host-bound, and between two
processes of the same kernels they moved by 30 % and changed sign (docs/notes/bench-passes.md, the fourth
and fifth passes), more than the differences being measured. Here both sides run on one model,
one set of weights and inputs, in one process:

* mamba_ssm's Python (its sdist's, on sys.path, as bench/e2e_mamba.py's "ours" runs it) reads
  ``selective_scan_cuda`` as a global of its interface module at every call. This script points
  that global at one of two stand-ins, each forwarding ``fwd`` and ``bwd`` to one side and
  counting the calls: our compatibility module (``selective_scan_cuda.py`` of this checkout), or
  the original's compiled file from ``--orig-dir``, loaded by path (bench/provenance.py checks
  both files before anything runs, and every row checks that its calls reached its side).
* The conv and the decode step are the same code on both sides (our causal_conv1d, mamba_ssm's
  Triton ``selective_state_update``), as in bench/e2e_mamba.py.
* Every repetition times both sides back to back, the first side alternating, so a drift of the
  machine lands on both. Each row gives both medians with their ranges, the ratio of the medians
  and the median of the per-repetition ratios.
* ``--control ours`` (or ``orig``) points both columns at one side: an A/A run, whose ratios show
  how far from 1.0 the harness itself lands on this machine, the yardstick for a real run's.
* Outputs and gradients of the block and the LM are compared between the sides within
  e2e_mamba.TOLERANCE; the memory of two blocks (kept for the backward, fwd+bwd peak: the
  large one and the one timed, e2e_mamba.memory_shapes) is measured once per side.

Writes the markdown report to stdout and D/e2e_ab.json; exit 1 on a problem (a tolerance
exceeded, a row whose calls missed its side), 2 when provenance fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import _timing as T
import e2e_mamba as e2e  # bench/ is the script's directory, first on sys.path
import provenance
import torch

SIDES = ("ours", "orig")
CALLS = e2e.CALLS  # "<side>:fwd" / "<side>:bwd" -> calls, counted by e2e_mamba.counting


def stand_in(side: str, module) -> types.ModuleType:
    """A module whose fwd and bwd forward to ``module``'s through e2e_mamba's counting wrapper,
    named per side (the same wrapper on both sides, so its cost is too)."""
    m = types.ModuleType(f"selective_scan_cuda ({side})")
    m.__file__ = provenance.module_file(module)
    m.fwd = e2e.counting(f"{side}:fwd", module.fwd)
    m.bwd = e2e.counting(f"{side}:bwd", module.bwd)
    return m


class Switch:
    """Points mamba_ssm's interface (and any other module given) at one side's stand-in."""

    def __init__(self, modules: Dict[str, types.ModuleType], clients: List[types.ModuleType]):
        self.modules, self.clients = modules, clients

    def use(self, side: str) -> None:
        for c in self.clients:
            c.selective_scan_cuda = self.modules[side]


def interleaved(fns: Dict[str, Callable[[], object]], before: Callable[[str], None], reps: int,
                sync: Callable[[], None]) -> Dict[str, List[float]]:
    """Milliseconds of each side's ``fns[side]`` over ``reps`` rounds after one warm-up round;
    each round runs every side once, back to back, the first side alternating between rounds.
    ``before(side)`` runs ahead of each call, outside the timed region."""
    sides = list(fns)
    for side in sides:  # warm-up
        before(side)
        fns[side]()
        sync()

    def timer(side: str) -> Callable[[], float]:
        def one() -> float:
            before(side)
            sync()
            t0 = time.perf_counter()
            fns[side]()
            sync()
            return (time.perf_counter() - t0) * 1e3
        return one

    return T.paired_rounds({s: timer(s) for s in sides}, reps)


def summarise(times: Dict[str, List[float]], rate_work: Optional[float] = None) -> dict:
    """Each side's median and range (ms, or ``rate_work`` per second), ours / orig of the medians
    and the median of the per-round ratios (rounds pair up in order; both in time, so below 1 is
    ours faster; for a rate both are turned to rate ratios, above 1 ours faster)."""
    row = {}
    for side, ts in times.items():
        if rate_work is None:
            row[side] = (statistics.median(ts), min(ts), max(ts))
        else:
            rates = [rate_work / (t / 1e3) for t in ts]
            row[side] = (statistics.median(rates), min(rates), max(rates))
    paired = [a / b for a, b in zip(times["ours"], times["orig"])]
    if rate_work is not None:
        paired = [1.0 / p for p in paired]
    row["ratio"] = row["ours"][0] / row["orig"][0]
    row["paired"] = statistics.median(paired)
    row["paired_ci"] = T.median_ci(paired)  # 95 %: what the rounds allow a claim of
    row["rounds"] = paired  # every round's ratio, in order, for the JSON (later analysis)
    return row


def load_sides(orig_dir: str, device: str, control: Optional[str] = None
               ) -> Tuple[Dict[str, types.ModuleType], List[str]]:
    """The two sides' selective_scan_cuda, checked: ours is what mamba_ssm's interface imported
    (our compatibility module of this checkout, with our compiled extensions on CUDA), the
    original is its compiled file under ``orig_dir``. With ``control`` ("ours" or "orig") both
    sides call that one module: an A/A run, whose ratios are the harness's own spread and bias."""
    lines = provenance.check_ours_client(e2e.ROOT, compiled=device == "cuda")
    iface = sys.modules[provenance.ORIG_INTERFACE]
    ours = iface.selective_scan_cuda
    if device == "cuda":
        lines.append(provenance.arm_ours_entry(ours))
    orig, so = provenance.load_original_extension(orig_dir, provenance.ORIG_SCAN_EXT)
    lines.append(f"original's {provenance.ORIG_SCAN_EXT} (loaded by path, switched in per call): {so}")
    if control is not None:
        both = {"ours": ours, "orig": orig}[control]
        lines.append(f"CONTROL RUN: both columns call {control}'s selective_scan_cuda; every ratio below "
                     "is the harness's own spread, not a comparison")
        return {"ours": stand_in("ours", both), "orig": stand_in("orig", both)}, lines
    return {"ours": stand_in("ours", ours), "orig": stand_in("orig", orig)}, lines


def expect_side(what: str, side: str, problems: List[str], want: Tuple[str, ...] = ("fwd",)) -> None:
    """Every call since the last check went to ``side``, and there were some."""
    other = [s for s in SIDES if s != side][0]
    got = {k: CALLS[f"{side}:{k}"] for k in want}
    stray = sum(v for name, v in CALLS.items() if name.startswith(f"{other}:"))
    if stray or not all(got.values()):
        problems.append(f"{what} ({side}): calls {dict(CALLS)}, expected only {side}'s {want}")
    CALLS.clear()


def profile_calls(title: str, fn: Callable[[], object], path: Path, calls: int = 5) -> None:
    """torch.profiler's table of ``calls`` calls of fn (CPU and CUDA), by CPU time, into path."""
    fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"## {title}: {calls} calls, by self CPU time\n\n{table}\n")


def run_dtype(sz: dict, device: str, dtype: torch.dtype, switch: Switch, reps: int, problems: List[str],
              report: dict, profile_dir: Optional[str] = None) -> None:
    from mamba_ssm.modules.mamba_simple import Mamba

    sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)
    name = str(dtype).replace("torch.", "")
    rows, checks = {}, {}
    out_tol, grad_tol = e2e.TOLERANCE[name]

    def compare(key: str, got: Dict[str, torch.Tensor], tol: float) -> None:
        r = e2e.rel(got["ours"], got["orig"])
        checks[key] = (r, tol)
        if not r <= tol:
            problems.append(f"{name} {key}: ours differs from the original by {r:.2e} (tolerance {tol:g})")
        elif r == 0.0:  # two different kernels do not round alike through a whole model
            problems.append(f"{name} {key}: bitwise equal on both sides, so one kernel ran for both")

    # the block, training path (mamba_inner_fn)
    block, x, dy, g = e2e.mamba_block(Mamba, sz, device, dtype)
    outs, dxs = {}, {}
    for side in SIDES:
        switch.use(side)
        xl = x.clone().requires_grad_()
        block.zero_grad(set_to_none=True)
        y = block(xl)
        y.backward(dy)
        expect_side("block fwd+bwd", side, problems, ("fwd", "bwd"))
        outs[side], dxs[side] = y.detach().float().cpu(), xl.grad.float().cpu()
    compare("block out", outs, out_tol)
    compare("block dx", dxs, grad_tol)
    xl = x.clone().requires_grad_()

    def block_step():
        block.zero_grad(set_to_none=True)
        block(xl).backward(dy)

    with torch.no_grad():
        fwd = {s: (lambda: block(x)) for s in SIDES}
        rows["block forward"] = summarise(interleaved(fwd, switch.use, reps, sync))
    CALLS.clear()
    rows["block fwd+bwd"] = summarise(interleaved({s: block_step for s in SIDES}, switch.use, reps, sync))
    CALLS.clear()
    if device == "cuda":
        # The timed block's fwd+bwd time is the interleaved "block fwd+bwd" row above: three
        # unpaired calls of it here only add noise (1.381 in one run whose paired row said 0.997).
        timed_block = (sz["batch"], sz["block_L"], sz["d_model"])
        for side in SIDES:
            switch.use(side)
            for shape in e2e.memory_shapes(sz):
                for k, v in e2e.block_memory(Mamba, shape, dtype, with_time=shape != timed_block).items():
                    rows.setdefault(k, {})[side] = (v, v, v)
            expect_side("block memory", side, problems, ("fwd", "bwd"))
        for row in rows.values():
            if "ours" in row and "ratio" not in row:
                row["ratio"] = row["paired"] = row["ours"][0] / row["orig"][0]

    # the language model
    model, ids = e2e.mamba_lm(sz, device, dtype, g)

    def lm_step():
        model.zero_grad(set_to_none=True)
        logits, loss = e2e.next_token_loss(model, ids)
        loss.backward()
        return logits

    logits = {}
    for side in SIDES:
        switch.use(side)
        logits[side] = lm_step().detach().float().cpu()
        expect_side("LM fwd+bwd", side, problems, ("fwd", "bwd"))
    compare("LM logits", logits, out_tol)
    with torch.no_grad():
        fwd = {s: (lambda: model(ids)) for s in SIDES}
        rows["LM forward"] = summarise(interleaved(fwd, switch.use, reps, sync))
        if profile_dir is not None:  # where an LM forward's host time goes, per side
            for side in SIDES:
                switch.use(side)
                where = Path(profile_dir) / f"lm_fwd_{name}_{side}.txt"
                profile_calls(f"{name} LM forward, {side}", fwd[side], where)
    rows["LM fwd+bwd"] = summarise(interleaved({s: lm_step for s in SIDES}, switch.use, reps, sync))
    CALLS.clear()

    # generate: the prompt runs the scan (selective_scan_fn over selective_scan_cuda), the steps
    # the decode kernels, which both sides share
    model.eval()
    prompt = ids[:, : sz["prompt"]]
    max_length = sz["prompt"] + sz["new"]
    tokens = sz["batch"] * sz["new"]
    for cg in ((False, True) if device == "cuda" else (False,)):
        def gen(cg=cg):
            return model.generate(prompt, max_length=max_length, top_k=1, cg=cg)

        got = {}
        for side in SIDES:
            switch.use(side)
            got[side] = gen()[:, sz["prompt"]:].cpu()
            expect_side(f"generate cg={cg}", side, problems)
        same = (got["ours"] == got["orig"]).float().mean().item()
        checks[f"generate{' (CUDA graphs)' if cg else ''}: tokens equal"] = (same, None)
        key = f"generate{' (CUDA graphs)' if cg else ''}, tokens/s"
        times = interleaved({s: gen for s in SIDES}, switch.use, max(1, reps // 3), sync)
        rows[key] = summarise(times, tokens)
        CALLS.clear()
    report[name] = {"rows": rows, "checks": checks}


def _cell(v: Tuple[float, float, float], unit: str) -> str:
    med, lo, hi = v
    return f"{med:.3f}{unit}" + (f" ({lo:.3f}-{hi:.3f})" if hi > lo else "")


def markdown(report: dict, meta: dict) -> str:
    lines = ["### mamba_ssm end to end, ours and the original interleaved in one process", ""]
    lines += [f"- {line}" for line in meta["provenance"]]
    lines += [f"- sizes {meta['sizes']}; device {meta['gpu']}; torch {meta['torch']}; "
              f"{meta['reps']} rounds (generate {max(1, meta['reps'] // 3)}), the first side alternating", ""]
    for name, r in report.items():
        lines += [f"#### {name}", "", "| quantity | ours | original | ours / original (medians) | "
                  "median of the rounds' ratios (95 % interval) |", "|---|---|---|---|---|"]
        for k, row in r["rows"].items():
            unit = "" if ("tokens/s" in k or "MiB" in k) else " ms"
            ci = row.get("paired_ci")
            interval = f" ({ci[0]:.3f}-{ci[1]:.3f})" if ci else ""
            lines.append(f"| {k} | {_cell(row['ours'], unit)} | {_cell(row['orig'], unit)} | "
                         f"{row['ratio']:.3f} | {row['paired']:.3f}{interval} |")
        lines += ["", "| check | value | tolerance |", "|---|---|---|"]
        for k, (v, tol) in r["checks"].items():
            lines.append(f"| {k} | {100 * v:.1f} % |  |" if tol is None else f"| {k} | {v:.2e} | {tol:g} |")
        lines.append("")
    lines.append("Times in ms (tokens/s for generate, MiB for memory): medians, the fastest and the slowest "
                 "round in brackets. A ratio below 1 is ours faster, except for tokens/s, where above 1 is.")
    for p in meta["problems"]:
        lines.append(f"- PROBLEM: {p}")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--orig-dir", required=True,
                    help="the original's --target install (its compiled selective_scan_cuda)")
    ap.add_argument("--dir", required=True, help="where e2e_ab.json goes")
    ap.add_argument("--dtypes", default=None,
                    help="comma-separated (default float32,bfloat16; float32 on CPU)")
    ap.add_argument("--reps", type=int, default=None, help="rounds per row (default: e2e_mamba's reps)")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (a smoke run)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--control", choices=("ours", "orig"), default=None,
                    help="an A/A run: both columns call this side's selective_scan_cuda (the harness's "
                         "own spread and bias between its two columns)")
    ap.add_argument("--profile-lm", action="store_true",
                    help="also write torch.profiler tables of the LM forward per side into --dir (GPU only)")
    a = ap.parse_args(argv)
    sz = e2e.sizes(a.tiny)
    reps = a.reps or sz["reps"]
    dtypes = a.dtypes or ("float32,bfloat16" if a.device == "cuda" else "float32")
    try:
        import mamba_ssm.ops.selective_scan_interface as iface

        sides, lines = load_sides(a.orig_dir, a.device, a.control)
    except Exception as e:  # ProvenanceError, or an import failing: nothing is measured
        print(f"PROVENANCE FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if a.device != "cuda":  # a CPU smoke run: mamba_ssm's Triton decode step needs a GPU
        import mamba_ssm.modules.mamba_simple as ms

        ms.selective_state_update = None
    switch = Switch(sides, [iface])
    meta = {"provenance": lines, "sizes": sz, "reps": reps, "torch": str(torch.__version__),
            "gpu": torch.cuda.get_device_name() if a.device == "cuda" else "cpu"}
    report, problems = {}, []
    for name in dtypes.split(","):
        try:
            profile_dir = a.dir if a.profile_lm and a.device == "cuda" else None
            run_dtype(sz, a.device, getattr(torch, name), switch, reps, problems, report, profile_dir)
        except Exception as e:
            import traceback

            traceback.print_exc()
            problems.append(f"{name}: {type(e).__name__}: {e}")
    meta["problems"] = problems
    Path(a.dir).mkdir(parents=True, exist_ok=True)
    (Path(a.dir) / "e2e_ab.json").write_text(json.dumps({"meta": meta, "report": report}, indent=1))
    print(markdown(report, meta))
    return 1 if problems else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
