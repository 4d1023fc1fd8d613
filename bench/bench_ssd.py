"""The SSD chunked scan: ours (selective_scan._ssd_ops, csrc/ssd) against mamba_ssm's Triton
``mamba_chunk_scan_combined``, forward alone and forward + backward, at Mamba-2's shapes, in one
process.

    python3 bench/bench_ssd.py --ms-dir DIR [--shapes all|0,1,2,3] [--reps N] [--no-first-call]
                               [--no-backward] [--json PATH]

Forward + backward: ours is ssd_forward_cuda then ssd_backward_cuda (the gradients of x, dt, A,
B, C, D, dt_bias); Triton's is mamba_chunk_scan_combined on inputs that require grad, then
torch.autograd.grad of its output with the same dout. Their gradients are compared too.

DIR holds mamba_ssm's Python (``pip install --no-deps --target DIR`` of the 2.3.2.post1 sdist
with MAMBA_SKIP_CUDA_BUILD=TRUE, as bench/gpu_clients_run.sh installs it into /tmp/ms_ours):
its Triton kernels need no compiled extension. mamba_ssm's package __init__ is not run (it
imports the model classes); ssd_combined.py needs einops and triton. Our extension must be built
in this checkout (setup.py build_ext --inplace).

Before timing, each side's module file is printed and checked (bench/provenance.py): ours the
compiled selective_scan._cuda of this checkout, the original's ssd_combined.py under DIR. The
outputs of the two sides are compared (max |difference| / max |value|). Times are CUDA-event
medians of loops over several input sets (bench/_timing.py). The first call of each side in a
fresh process (Triton compiles and autotunes there) is timed in a child process per side.
``--json PATH`` also writes the timed rows as bench/results records (``python3 bench/results.py
update PATH``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import provenance  # noqa: E402  (bench/, imports nothing heavy)
import results  # noqa: E402  (bench/results.py, standard library only)

# (batch, seqlen, nheads, headdim, dstate, ngroups, chunk, dtype); the Triton times the task
# quoted on an H200 are in the comments (forward; forward + backward)
SHAPES = [
    (8, 2048, 80, 64, 128, 1, 256, "bfloat16"),  # Triton 1.296 ms; 4.611 ms
    (4, 4096, 128, 64, 128, 8, 256, "bfloat16"),  # Triton 1.539 ms; 6.729 ms
    (2, 8192, 32, 64, 64, 1, 256, "float32"),  # Triton 1.119 ms; 4.723 ms
]
# A packed batch: 64 sequences of lengths drawn from 1-1024 (a fixed seed) in one row, with the
# 2.7B layer's heads; the forward takes cu_seqlens and seq_idx and returns each sequence's final
# state, the forward + backward seq_idx alone (mamba_ssm's backward refuses the varlen states).
# (The task quoted Triton at 1.963 ms; 7.278 ms for its own draw of 33,742 tokens.)
_DRAW = random.Random(64)
VARLEN_LENGTHS = [_DRAW.randint(1, 1024) for _ in range(64)]
VARLEN_SHAPE = (1, sum(VARLEN_LENGTHS), 80, 64, 128, 1, 256, "bfloat16")
SHAPES.append(VARLEN_SHAPE)
GRADS = ("x", "dt", "A", "B", "C", "D", "dt_bias")
ORIG_MODULE = "mamba_ssm.ops.triton.ssd_combined"


def shape_text(shape) -> str:
    names = ("batch", "seqlen", "nheads", "headdim", "dstate", "ngroups", "chunk")
    text = ", ".join(f"{n} {v}" for n, v in zip(names, shape))
    if tuple(shape) == VARLEN_SHAPE:
        text = f"varlen: {len(VARLEN_LENGTHS)} sequences of 1-1024 packed, " + text
    return text


def json_records(measured, context):
    """(kind, shape, {"ours": ms, "triton": ms}) rows as bench/results records of the op "ssd"."""
    return [results.speedup_record("ssd", shape_text(shape), shape[7], ms["ours"], ms.get("triton"), "ms",
                                   context, variant=kind)
            for kind, shape, ms in measured if ms.get("ours") is not None]


def load_ours():
    import selective_scan._cuda as ext

    from selective_scan import _ssd_ops

    lines = [f"ours: selective_scan._cuda = {provenance.require_compiled('ours', ext, ROOT)}",
             f"ours: op module = {provenance.require_file_under('ours', _ssd_ops, ROOT)}"]
    return _ssd_ops.ssd_forward_cuda, lines


def load_ours_bwd():
    from selective_scan import _ssd_ops

    return _ssd_ops.ssd_backward_cuda


def load_orig(ms_dir: str):
    pkg = os.path.join(os.path.realpath(ms_dir), "mamba_ssm")
    if not os.path.isdir(pkg):
        raise provenance.ProvenanceError(f"original: no mamba_ssm/ in {ms_dir}")
    version = provenance._read_version(pkg)
    provenance._namespace_package("mamba_ssm", pkg, version)
    mod = importlib.import_module(ORIG_MODULE)
    where = provenance.require_file_under("original: " + ORIG_MODULE, mod, ms_dir)
    return mod.mamba_chunk_scan_combined, [f"original: mamba_ssm {version}, {ORIG_MODULE} = {where}"]


def make_inputs(shape, n_sets, seed=0):
    import torch

    batch, seqlen, nheads, headdim, dstate, ngroups, chunk, dtype = shape
    dt_ = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(seed)
    sets = []
    for _ in range(n_sets):
        def r(*s, dtype=dt_, scale=1.0):
            return (torch.randn(*s, device="cuda", generator=g) * scale).to(dtype)

        sets.append(dict(
            x=r(batch, seqlen, nheads, headdim), dt=r(batch, seqlen, nheads, scale=0.5),
            A=-torch.exp(torch.rand(nheads, device="cuda", generator=g)), B=r(batch, seqlen, ngroups, dstate),
            C=r(batch, seqlen, ngroups, dstate), D=torch.randn(nheads, device="cuda", generator=g),
            dt_bias=torch.randn(nheads, device="cuda", generator=g) * 0.5,
            dout=r(batch, seqlen, nheads, headdim),
        ))
        if tuple(shape) == VARLEN_SHAPE:  # the packed sequences' offsets and ids
            ends = torch.tensor(VARLEN_LENGTHS).cumsum(0)
            offsets = torch.cat([torch.zeros(1, dtype=ends.dtype), ends])
            sets[-1]["cu_seqlens"] = offsets.to("cuda", torch.int32)
            ids = torch.repeat_interleave(torch.arange(len(VARLEN_LENGTHS)), torch.tensor(VARLEN_LENGTHS))
            sets[-1]["seq_idx"] = ids[None].to("cuda", torch.int32)
    return sets


def varlen_args(a, forward: bool) -> dict:
    """The packed batch's keyword arguments (none for the other shapes): the forward takes
    cu_seqlens and returns the varlen states; forward + backward takes seq_idx alone."""
    if "seq_idx" not in a:
        return {}
    if forward:
        return dict(seq_idx=a["seq_idx"], cu_seqlens=a["cu_seqlens"])
    return dict(seq_idx=a["seq_idx"])


def callers(shape, ours, orig):
    """fn(inputs) for each side, Mamba-2's call: D per head, dt_bias, softplus, no z."""
    chunk = shape[6]

    def o(a):
        return ours(a["x"], a["dt"], a["A"], a["B"], a["C"], chunk, D=a["D"], dt_bias=a["dt_bias"],
                    dt_softplus=True, **varlen_args(a, True))[0]

    def t(a):
        kw = varlen_args(a, True)
        out = orig(a["x"], a["dt"], a["A"], a["B"], a["C"], chunk, D=a["D"], dt_bias=a["dt_bias"],
                   dt_softplus=True, **kw, **(dict(return_varlen_states=True) if kw else {}))
        return out[0] if kw else out

    return {"ours": o, "triton": t}


def grad_callers(shape, ours, ours_bwd, orig):
    """fn(inputs) -> the gradients (GRADS order) for each side, forward included."""
    import torch

    chunk = shape[6]

    def o(a):
        kw = varlen_args(a, False)
        y = ours(a["x"], a["dt"], a["A"], a["B"], a["C"], chunk, D=a["D"], dt_bias=a["dt_bias"],
                 dt_softplus=True, **kw)[0]
        g = ours_bwd(a["dout"], a["x"], a["dt"], a["A"], a["B"], a["C"], y, chunk, D=a["D"],
                     dt_bias=a["dt_bias"], dt_softplus=True, **kw)
        return (g[0], g[1], g[2], g[3], g[4], g[5], g[7])

    def t(a):
        leaves = [a[k].detach().requires_grad_() for k in GRADS]
        x, dt, A, B, C, D, dt_bias = leaves
        with torch.enable_grad():
            out = orig(x, dt, A, B, C, chunk, D=D, dt_bias=dt_bias, dt_softplus=True, **varlen_args(a, False))
            return torch.autograd.grad(out, leaves, a["dout"])

    return {"ours": o, "triton": t}


def set_bytes(shape):
    batch, seqlen, nheads, headdim, dstate, ngroups, _, dtype = shape
    e = 4 if dtype == "float32" else 2
    return batch * seqlen * (2 * nheads * headdim + 2 * ngroups * dstate + nheads) * e


def first_call_child(side: str, idx: int, ms_dir: str) -> None:
    import torch

    t0 = time.perf_counter()
    fn, _ = load_ours() if side == "ours" else load_orig(ms_dir)
    t_import = time.perf_counter() - t0
    shape = SHAPES[idx]
    a = make_inputs(shape, 1)[0]
    torch.cuda.synchronize()
    call = callers(shape, fn if side == "ours" else None, fn if side != "ours" else None)[side]
    t0 = time.perf_counter()
    call(a)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    call(a)
    torch.cuda.synchronize()
    second = time.perf_counter() - t0
    print(json.dumps({"import_s": t_import, "first_ms": 1e3 * first, "second_ms": 1e3 * second}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ms-dir", default="/tmp/ms_ours", help="mamba_ssm's --target install")
    ap.add_argument("--shapes", default="all", help="'all' or indices into SHAPES, e.g. 0,2")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--no-first-call", action="store_true")
    ap.add_argument("--no-backward", action="store_true", help="time the forward alone")
    ap.add_argument("--json", metavar="PATH", help="also write the timed rows as bench/results records")
    ap.add_argument("--first-call-child", nargs=2, metavar=("SIDE", "SHAPE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.first_call_child:
        first_call_child(args.first_call_child[0], int(args.first_call_child[1]), args.ms_dir)
        return 0

    import torch
    from _timing import n_sets_for, time_ms

    ours, lines_o = load_ours()
    orig, lines_t = load_orig(args.ms_dir)
    print(f"device: {torch.cuda.get_device_name()} | torch {torch.__version__}")
    for line in lines_o + lines_t:
        print("provenance:", line)
    idxs = range(len(SHAPES)) if args.shapes == "all" else [int(i) for i in args.shapes.split(",")]
    rows, measured = [], []
    for i in idxs:
        shape = SHAPES[i]
        n_sets = n_sets_for(set_bytes(shape), most=4)
        sets = make_inputs(shape, n_sets, seed=i)
        fns = callers(shape, ours, orig)
        with torch.no_grad():
            a, b = fns["ours"](sets[0]).float(), fns["triton"](sets[0]).float()
        diff = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
        nan = bool(torch.isnan(a).any())
        ms = {}
        for side, fn in fns.items():
            with torch.no_grad():
                ms[side] = time_ms(lambda j, fn=fn, sets=sets: fn(sets[j]), n_sets, reps=args.reps, inner=5)
        rows.append((shape, ms, diff, nan))
        if not nan and diff <= (1e-2 if shape[7] == "float32" else 5e-2):  # a wrong answer has no speed
            measured.append(("forward", shape, ms))
        print(f"shape {shape}: ours {ms['ours']:.3f} ms | triton {ms['triton']:.3f} ms | "
              f"ours/triton {ms['ours'] / ms['triton']:.2f} | max|ours-triton|/max|triton| {diff:.2e}"
              f"{' | NaN in ours' if nan else ''}", flush=True)
        if not args.no_backward:
            gfns = grad_callers(shape, ours, load_ours_bwd(), orig)
            ga, gb = gfns["ours"](sets[0]), gfns["triton"](sets[0])
            diffs = {k: ((u.float() - v.float()).abs().max() / v.float().abs().max().clamp_min(1e-30)).item()
                     for k, u, v in zip(GRADS, ga, gb)}
            gnan = any(bool(torch.isnan(u).any()) for u in ga)
            del ga, gb
            gms = {side: time_ms(lambda j, fn=fn, sets=sets: fn(sets[j]), n_sets, reps=args.reps, inner=2)
                   for side, fn in gfns.items()}
            rows.append((shape, gms, 0.0, gnan))
            if not gnan:
                measured.append(("forward + backward", shape, gms))
            print(f"shape {shape} fwd+bwd: ours {gms['ours']:.3f} ms | triton {gms['triton']:.3f} ms | "
                  f"ours/triton {gms['ours'] / gms['triton']:.2f} | max|d ours - d triton|/max|d triton| "
                  + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items())
                  + (" | NaN in ours" if gnan else ""), flush=True)
        del sets
        torch.cuda.empty_cache()
    if not args.no_first_call:
        i0 = list(idxs)[0]
        for side in ("ours", "triton"):
            cmd = [sys.executable, os.path.abspath(__file__), "--ms-dir", args.ms_dir,
                   "--first-call-child", side, str(i0)]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            ok = r.returncode == 0 and r.stdout.strip()
            res = r.stdout.strip().splitlines()[-1] if ok else r.stderr[-500:]
            print(f"first call in a fresh process, {side}, shape {SHAPES[i0]}: {res}", flush=True)
    if args.json:
        from _timing import run_context

        results.write_records(args.json, json_records(measured, run_context(ROOT)))
    bad = [r for r in rows if r[3] or r[2] > (1e-2 if r[0][7] == "float32" else 5e-2)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
