"""End to end on real clients: mamba_ssm's Mamba block and MambaLMHeadModel, and transformers'
MambaForCausalLM, each run in its own process on one set of kernels, then compared.

  python bench/e2e_mamba.py run --stack mamba_ssm --label ours --dir D [--tiny] [--device cpu]
  python bench/e2e_mamba.py run --stack transformers --label ours --dir D ...
  python bench/e2e_mamba.py compare --dir D --stack mamba_ssm --base orig --label ours
  python bench/e2e_mamba.py compile --dir D [--tiny] [--device cpu]

What a process runs on is decided by sys.path (bench/gpu_clients_run.sh sets it): mamba_ssm's
Python from its sdist with our selective_scan_cuda/causal_conv1d ("ours"), or mamba_ssm's own
wheel with its compiled selective_scan_cuda first on the path ("orig", with --orig-dir); before
anything runs, bench/provenance.py proves it (the interface binds the original's .so under
--orig-dir, or our compatibility module of this checkout; exit 2 otherwise), and the modules
actually loaded are recorded. Weights and inputs come from fixed seeds on the CPU, so every process builds
the same model. Each run checks that the fast path is taken (it counts the calls that reach the
compiled scan, conv and decode functions) and saves outputs, gradients, generated tokens and
timings (median of 15 runs after a warm-up, CUDA synchronised, with the fastest and
slowest run beside it) to D/<stack>-<label>.pt. The host-bound rows (block and LM, forward and
fwd+bwd) get a host profile beside them (``host_profile``): the host's time until the call
returns, the host time inside each counted entry point, and the GPU's kernel time;
``compare`` prints markdown tables: differences against the base within stated tolerances
(relative to the base's largest magnitude), and the timings side by side.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Optional

import provenance  # bench/ is the script's directory, first on sys.path
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# max |a - b| / max |b| allowed, per dtype: outputs, then gradients (the scan's rounding differs
# between kernels and grows through the layers; bf16 keeps 8 bits of mantissa)
TOLERANCE = {"float32": (1e-3, 5e-3), "bfloat16": (5e-2, 1e-1)}
SEED = 0


def sizes(tiny: bool) -> dict:
    if tiny:
        return dict(d_model=32, n_layer=2, vocab=64, batch=2, block_L=40, lm_L=24, prompt=6, new=6, reps=1,
                    mem_block=(2, 40, 32))
    # mem_block: (batch, seqlen, d_model) of a block whose training memory is measured (beside
    # the timed block's, memory_shapes), a Mamba-2.8B-sized layer (5120 channels) at 8192 steps
    # reps: 15, as the small block's and the LM's calls are host-bound and vary from call to call
    return dict(d_model=768, n_layer=4, vocab=1024, batch=4, block_L=2048, lm_L=1024, prompt=64, new=192,
                reps=15, mem_block=(8, 8192, 2560))


CALLS: Counter = Counter()
HOST_S: Counter = Counter()  # host seconds spent inside each counted function, while CLOCK.on


class CLOCK:
    on = False  # set only by host_profile: the timed rows run the wrappers without a clock


def counting(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        CALLS[name] += 1
        if not CLOCK.on:
            return fn(*args, **kwargs)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            HOST_S[name] += time.perf_counter() - t0

    return wrapper


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str, reps: int) -> tuple:
    """(median, fastest, slowest) milliseconds of ``fn`` over ``reps`` calls after one warm-up."""
    fn()
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times), max(times)


class Timings(dict):
    """Median milliseconds (or tokens/s) per quantity, and each one's range over its repetitions
    in ``spread``: at the small sizes the calls are host-bound, and the range says how far a
    median can be trusted."""

    def __init__(self):
        super().__init__()
        self.spread = {}

    def time(self, key: str, fn, device: str, reps: int) -> None:
        med, lo, hi = timed(fn, device, reps)
        self[key], self.spread[key] = med, (lo, hi)

    def rate(self, key: str, work: float, fn, device: str, reps: int) -> None:
        """``work`` units per second (tokens/s): the fastest call gives the highest rate."""
        med, lo, hi = timed(fn, device, reps)
        self[key], self.spread[key] = work / (med / 1e3), (work / (hi / 1e3), work / (lo / 1e3))


def kernel_ms(fn, device: str, reps: int) -> Optional[float]:
    """Milliseconds of GPU kernel time per call of ``fn`` (torch.profiler's CUDA activity: every
    kernel, copy and fill it launched, summed), or None off CUDA."""
    if device != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        sync(device)
    total_us = 0.0
    for e in prof.key_averages():
        total_us += getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
    return total_us / 1e3 / reps


def host_profile(times: Timings, key: str, fn, device: str, reps: int) -> None:
    """Where the time of a host-bound row goes, as rows of their own beside ``key``: the host's
    time until ``fn`` returns (before the synchronisation), the host time inside each counted
    kernel entry point (selective_scan_cuda.fwd, the conv functions: inclusive, per run of
    ``fn``, with the calls per run) and the GPU's kernel time per run. Where the host time is
    close to the row's wall time and the kernel time well below it, the host binds, and the
    entry points' rows say how much of it each side's kernels cost on the host."""
    fn()
    sync(device)
    CALLS.clear()
    HOST_S.clear()
    host = []
    CLOCK.on = True
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            host.append(time.perf_counter() - t0)
            sync(device)
    finally:
        CLOCK.on = False
    times[f"{key}: host time until the call returns"] = statistics.median(host) * 1e3
    for name in sorted(HOST_S):
        per_run = CALLS[name] / reps
        times[f"{key}: host time in {name} ({per_run:g} calls)"] = HOST_S[name] / reps * 1e3
    CALLS.clear()
    HOST_S.clear()
    try:
        gpu = kernel_ms(fn, device, 3)
    except Exception as e:  # the profiler is an extra: the row's own figures stand without it
        print(f"host_profile {key}: no GPU kernel time ({type(e).__name__}: {e})", file=sys.stderr)
        gpu = None
    if gpu is not None:
        times[f"{key}: GPU kernel time"] = gpu


def origin(name: str) -> str:
    try:
        return getattr(importlib.import_module(name), "__file__", None) or "built in"
    except Exception as e:  # recorded, not fatal: the report says what was loaded
        return f"not importable ({type(e).__name__}: {e})"


def install_counters_mamba_ssm() -> None:
    """Count the calls that reach the kernels under mamba_ssm's Python (names looked up at call time)."""
    import mamba_ssm.modules.mamba_simple as ms
    import mamba_ssm.ops.selective_scan_interface as ssi

    import selective_scan_cuda

    selective_scan_cuda.fwd = counting("selective_scan_cuda.fwd", selective_scan_cuda.fwd)
    selective_scan_cuda.bwd = counting("selective_scan_cuda.bwd", selective_scan_cuda.bwd)
    for mod, name in ((ssi, "causal_conv1d_fwd_function"), (ssi, "causal_conv1d_bwd_function"),
                      (ms, "causal_conv1d_update"), (ms, "selective_state_update")):
        if getattr(mod, name, None) is not None:
            setattr(mod, name, counting(name, getattr(mod, name)))


def install_counters_transformers(cpu: bool) -> None:
    """transformers resolves mamba_ssm's and causal_conv1d's functions when its modeling module is
    imported (first as attributes of the package, then by their module path): wrap them before
    that, in both places, so the wrappers are what it resolves."""
    import mamba_ssm
    import mamba_ssm.ops.selective_scan_interface as ssi
    import mamba_ssm.ops.triton.selective_state_update as ssu

    import causal_conv1d
    import selective_scan_cuda

    selective_scan_cuda.fwd = counting("selective_scan_cuda.fwd", selective_scan_cuda.fwd)
    selective_scan_cuda.bwd = counting("selective_scan_cuda.bwd", selective_scan_cuda.bwd)
    names = [(ssi, "mamba_inner_fn"), (ssi, "selective_scan_fn"), (causal_conv1d, "causal_conv1d_fn"),
             (causal_conv1d, "causal_conv1d_update")]
    if cpu:  # CPU smoke run: the Triton decode step needs a GPU; transformers' own step runs
        ssu.selective_state_update = None
    else:
        names.append((ssu, "selective_state_update"))
    for mod, name in names:
        wrapped = counting(name, getattr(mod, name))
        setattr(mod, name, wrapped)
        if mod is not causal_conv1d and hasattr(mamba_ssm, name):
            setattr(mamba_ssm, name, wrapped)


def expect_calls(what: str, want: dict, problems: list) -> None:
    got = {k: CALLS[k] for k in want}
    if any(got[k] < v for k, v in want.items()):
        problems.append(f"{what}: fast path NOT taken, calls {got}, expected at least {want}")
    CALLS.clear()


def grads_of(module, names) -> dict:
    params = dict(module.named_parameters())
    return {f"d{n}": params[n].grad.detach().float().cpu() for n in names if params[n].grad is not None}


def memory_shapes(sz: dict) -> tuple:
    """(batch, seqlen, d_model) of each block whose training memory is measured: the large
    block, and the block the time rows run (where the backward's temporaries are a larger share
    of what a layer holds)."""
    return sz["mem_block"], (sz["batch"], sz["block_L"], sz["d_model"])


def block_memory(Mamba, shape, dtype: torch.dtype, with_time: bool = True) -> dict:
    """What one Mamba block keeps between its forward and backward (what training holds per
    layer; the scan-state tensor x is part of it) and its fwd+bwd peak, in MiB, plus the time
    (unless ``with_time`` is false)."""
    batch, L, d_model = shape
    torch.manual_seed(SEED)
    block = Mamba(d_model=d_model).to(device="cuda", dtype=dtype)
    x = torch.randn(batch, L, d_model, device="cuda", dtype=dtype).requires_grad_()
    dy = torch.randn_like(x)
    block(x).backward(dy)  # warm-up: allocations of the parameters' gradients
    mib = 2.0 ** 20
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y = block(x)
    kept = torch.cuda.memory_allocated() - base - y.numel() * y.element_size()
    y.backward(dy)
    peak = torch.cuda.max_memory_allocated() - base
    del y

    def step():
        block(x).backward(dy)

    label = "x".join(map(str, shape))
    rows = {
        f"block {label} kept for backward, MiB": kept / mib,
        f"block {label} fwd+bwd peak, MiB": peak / mib,
    }
    if with_time:
        rows[f"block {label} fwd+bwd"] = timed(step, "cuda", 3)[0]
    return rows


def mamba_block(Mamba, sz: dict, device: str, dtype: torch.dtype) -> tuple:
    """(block, x, dy, generator): mamba_ssm's Mamba block, its input and output gradient, from
    fixed seeds on the CPU, so every process (and both sides of bench/e2e_ab.py) builds the same."""
    torch.manual_seed(SEED)
    block = Mamba(d_model=sz["d_model"]).to(device=device, dtype=dtype)
    g = torch.Generator().manual_seed(SEED + 1)
    x = torch.randn(sz["batch"], sz["block_L"], sz["d_model"], generator=g).to(device=device, dtype=dtype)
    dy = torch.randn(x.shape, generator=g).to(device=device, dtype=dtype)
    return block, x, dy, g


def mamba_lm(sz: dict, device: str, dtype: torch.dtype, g: torch.Generator) -> tuple:
    """(model, ids): mamba_ssm's MambaLMHeadModel and a batch of token ids (its Triton norms on
    CUDA only), from fixed seeds; ``g`` is the generator mamba_block returned."""
    from mamba_ssm.models.config_mamba import MambaConfig
    from mamba_ssm.models.mixer_seq_simple import MambaLMHeadModel

    torch.manual_seed(SEED)
    cpu = device != "cuda"
    cfg = MambaConfig(d_model=sz["d_model"], n_layer=sz["n_layer"], vocab_size=sz["vocab"],
                      rms_norm=not cpu, fused_add_norm=not cpu)
    model = MambaLMHeadModel(cfg).to(device=device, dtype=dtype)
    ids = torch.randint(0, sz["vocab"], (sz["batch"], sz["lm_L"]), generator=g).to(device)
    return model, ids


def next_token_loss(model, ids: torch.Tensor) -> tuple:
    """(logits, loss): the LM's logits and the cross entropy of each next token, in fp32."""
    logits = model(ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    return logits, loss


def run_mamba_ssm(sz: dict, device: str, dtype: torch.dtype, problems: list) -> tuple:
    from mamba_ssm.modules.mamba_simple import Mamba

    if device != "cuda":  # CPU smoke run: mamba_ssm's Triton decode step and norms need a GPU
        import mamba_ssm.modules.mamba_simple as ms

        ms.selective_state_update = None
    install_counters_mamba_ssm()
    res, times = {}, Timings()
    # the Mamba block, training path (mamba_inner_fn)
    block, x, dy, g = mamba_block(Mamba, sz, device, dtype)
    xl = x.clone().requires_grad_()
    y = block(xl)
    y.backward(dy)
    expect_calls("Mamba block fwd+bwd", {"selective_scan_cuda.fwd": 1, "selective_scan_cuda.bwd": 1,
                                         "causal_conv1d_fwd_function": 1}, problems)
    res["block.out"] = y.detach().float().cpu()
    res["block.dx"] = xl.grad.float().cpu()
    names = ["in_proj.weight", "x_proj.weight", "A_log", "conv1d.weight", "dt_proj.bias", "D"]
    res.update({f"block.{k}": v for k, v in grads_of(block, names).items()})
    with torch.no_grad():
        times.time("block forward", lambda: block(x), device, sz["reps"])
        host_profile(times, "block forward", lambda: block(x), device, sz["reps"])

    def block_step():
        block.zero_grad(set_to_none=True)
        block(xl).backward(dy)

    times.time("block fwd+bwd", block_step, device, sz["reps"])
    host_profile(times, "block fwd+bwd", block_step, device, sz["reps"])
    if device == "cuda":
        for shape in memory_shapes(sz):
            times.update(block_memory(Mamba, shape, dtype))
    CALLS.clear()
    # the language model: forward + backward of a next-token loss, then greedy generation
    model, ids = mamba_lm(sz, device, dtype, g)
    cpu = device != "cuda"

    def lm_loss():
        return next_token_loss(model, ids)

    logits, loss = lm_loss()
    loss.backward()
    expect_calls("MambaLMHeadModel fwd+bwd", {"selective_scan_cuda.fwd": sz["n_layer"],
                                              "selective_scan_cuda.bwd": sz["n_layer"]}, problems)
    res["lm.logits"] = logits.detach().float().cpu()
    res["lm.loss"] = loss.detach().float().cpu().reshape(1)
    res.update({f"lm.{k}": v for k, v in grads_of(model, ["backbone.embedding.weight",
                                                          "backbone.layers.0.mixer.in_proj.weight",
                                                          "backbone.layers.0.mixer.A_log"]).items()})
    with torch.no_grad():
        times.time("LM forward", lambda: model(ids), device, sz["reps"])
        host_profile(times, "LM forward", lambda: model(ids), device, sz["reps"])

    def lm_step():
        model.zero_grad(set_to_none=True)
        lm_loss()[1].backward()

    times.time("LM fwd+bwd", lm_step, device, sz["reps"])
    host_profile(times, "LM fwd+bwd", lm_step, device, sz["reps"])
    model.eval()
    prompt = ids[:, : sz["prompt"]]
    max_length = sz["prompt"] + sz["new"]
    CALLS.clear()
    for cg in ((False, True) if device == "cuda" else (False,)):
        try:
            out = model.generate(prompt, max_length=max_length, top_k=1, cg=cg)
            if not cg:
                steps = sz["n_layer"] * (sz["new"] - 1)
                want = {"causal_conv1d_update": steps}
                if not cpu:
                    want["selective_state_update"] = steps
                expect_calls("generate (decode steps)", want, problems)
                res["gen.tokens"] = out[:, sz["prompt"]:].cpu()
            key = f"generate{' (CUDA graphs)' if cg else ''}, tokens/s"
            times.rate(key, sz["batch"] * sz["new"],
                       lambda cg=cg: model.generate(prompt, max_length=max_length, top_k=1, cg=cg), device,
                       max(1, sz["reps"] // 3))
        except Exception as e:  # reported, the rest still runs
            problems.append(f"generate cg={cg}: {type(e).__name__}: {e}")
    return res, times


def run_transformers(sz: dict, device: str, dtype: torch.dtype, problems: list, fast: bool) -> tuple:
    if fast:
        install_counters_transformers(cpu=device != "cuda")
    from transformers import MambaConfig, MambaForCausalLM

    res, times = {}, Timings()
    torch.manual_seed(SEED)
    cfg = MambaConfig(vocab_size=sz["vocab"], hidden_size=sz["d_model"], num_hidden_layers=sz["n_layer"],
                      state_size=16, expand=2, conv_kernel=4, use_cache=True)
    model = MambaForCausalLM(cfg).to(device=device, dtype=dtype)
    g = torch.Generator().manual_seed(SEED + 2)
    ids = torch.randint(0, sz["vocab"], (sz["batch"], sz["lm_L"]), generator=g).to(device)
    model.train()
    out = model(ids, labels=ids, use_cache=False)
    out.loss.backward()
    if fast:
        expect_calls("MambaForCausalLM train fwd+bwd", {"mamba_inner_fn": sz["n_layer"],
                                                        "selective_scan_cuda.fwd": sz["n_layer"],
                                                        "selective_scan_cuda.bwd": sz["n_layer"]}, problems)
    res["train.logits"] = out.logits.detach().float().cpu()
    res.update({f"train.{k}": v for k, v in grads_of(model, ["backbone.embeddings.weight",
                                                             "backbone.layers.0.mixer.in_proj.weight",
                                                             "backbone.layers.0.mixer.A_log"]).items()})

    def step():
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids, use_cache=False).loss.backward()

    times.time("train fwd+bwd", step, device, sz["reps"])
    model.eval()
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits
        if fast:
            expect_calls("MambaForCausalLM eval forward", {"selective_scan_fn": sz["n_layer"],
                                                           "causal_conv1d_fn": sz["n_layer"]}, problems)
        res["eval.logits"] = logits.float().cpu()
        times.time("eval forward", lambda: model(ids, use_cache=False), device, sz["reps"])
        prompt = ids[:, : sz["prompt"]]
        try:
            kw = dict(max_new_tokens=sz["new"], min_new_tokens=sz["new"], do_sample=False, pad_token_id=0)
            tokens = model.generate(prompt, **kw)
            if fast:
                steps = sz["n_layer"] * (sz["new"] - 1)
                want = {"causal_conv1d_update": steps}
                if device == "cuda":
                    want["selective_state_update"] = steps
                expect_calls("MambaForCausalLM generate", want, problems)
            res["gen.tokens"] = tokens[:, sz["prompt"]:].cpu()
            times.rate("generate, tokens/s", sz["batch"] * sz["new"], lambda: model.generate(prompt, **kw),
                       device, max(1, sz["reps"] // 3))
        except Exception as e:
            problems.append(f"generate: {type(e).__name__}: {e}")
    return res, times


def side_provenance(a) -> list:
    """What this process must run on, proven before anything runs (bench/provenance.py): a label
    starting with "orig" binds the original's compiled selective_scan_cuda from --orig-dir; one
    starting with "ours" our compatibility modules and (on CUDA) compiled extensions from this
    checkout; any other label (transformers' own path) is only recorded."""
    if a.label.startswith("orig"):
        if not a.orig_dir:
            raise provenance.ProvenanceError(f"label {a.label!r} needs --orig-dir (the original's install)")
        iface = importlib.import_module(provenance.ORIG_INTERFACE)
        return provenance.check_original_interface(iface, a.orig_dir)
    if a.label.startswith("ours"):
        return provenance.check_ours_client(ROOT, compiled=a.device == "cuda")
    return [f"label {a.label!r}: no kernels of ours or the original's are expected"]


def cmd_run(a) -> int:
    sz = sizes(a.tiny)
    try:
        checked = side_provenance(a)
    except Exception as e:  # ProvenanceError, or the import itself failing: nothing is measured
        print(f"PROVENANCE FAILED ({a.label}): {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    for line in checked:
        print(f"provenance {a.label}: {line}", flush=True)
    out_dir = Path(a.dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "stack": a.stack, "label": a.label, "device": a.device, "sizes": sz, "torch": str(torch.__version__),
        "modules": {m: origin(m) for m in ("selective_scan_cuda", "causal_conv1d", "mamba_ssm",
                                           "transformers")},
        "gpu": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
        "provenance": checked,
    }
    results, problems = {}, []
    for dtype_name in a.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        try:
            if a.stack == "mamba_ssm":
                res, times = run_mamba_ssm(sz, a.device, dtype, problems)
            else:
                res, times = run_transformers(sz, a.device, dtype, problems, fast=a.label != "torch")
            results[dtype_name] = {"tensors": res, "times": dict(times), "spread": times.spread}
        except Exception as e:
            import traceback

            traceback.print_exc()
            problems.append(f"{dtype_name}: {type(e).__name__}: {e}")
    meta["problems"] = problems
    torch.save({"meta": meta, "results": results}, out_dir / f"{a.stack}-{a.label}.pt")
    print(json.dumps({"meta": meta, "times": {k: v["times"] for k, v in results.items()}}, indent=1))
    return 1 if problems else 0


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def cmd_compare(a) -> int:
    base = torch.load(Path(a.dir) / f"{a.stack}-{a.base}.pt")
    other = torch.load(Path(a.dir) / f"{a.stack}-{a.label}.pt")
    bad = 0
    print(f"### {a.stack}: {a.label} against {a.base}\n")
    for side in (base, other):
        m = side["meta"]
        print(f"- {m['label']}: " + "; ".join(f"{k} from {v}" for k, v in m["modules"].items()))
        checked = m.get("provenance") or ["NOT CHECKED (a run before bench/provenance.py)"]
        print(f"  - checked: {'; '.join(checked)}")
        for p in m["problems"]:
            print(f"  - PROBLEM: {p}")
            bad += 1
    m = other["meta"]
    print(f"- sizes: {m['sizes']}; device {m['gpu']}; torch {m['torch']}\n")
    for dtype_name, res in other["results"].items():
        if dtype_name not in base["results"]:
            continue
        ref = base["results"][dtype_name]
        out_tol, grad_tol = TOLERANCE[dtype_name]
        print(f"#### {dtype_name}\n")
        print("| quantity | max rel. difference | tolerance | within |\n|---|---|---|---|")
        for k, t in res["tensors"].items():
            if k not in ref["tensors"]:
                continue
            if t.dtype in (torch.int64, torch.int32):
                want = ref["tensors"][k]
                same = (t == want).float().mean().item() if t.shape == want.shape else 0.0
                print(f"| {k} | {100 * same:.1f}% of tokens equal | reported | - |")
                continue
            tol = grad_tol if k.split(".", 1)[1].startswith("d") else out_tol  # gradients: "<part>.d<name>"
            r = rel(t, ref["tensors"][k])
            ok = r <= tol
            bad += not ok
            print(f"| {k} | {r:.2e} | {tol:g} | {'yes' if ok else '**NO**'} |")
        print(f"\n| timing | {a.label} | {a.base} | {a.label} / {a.base} |\n|---|---|---|---|")

        def cell(side, k):  # median, and (fastest-slowest) where the run recorded the range
            v = side["times"].get(k)
            if v is None:
                return "-"
            unit = "" if ("tokens/s" in k or "MiB" in k) else " ms"
            lo_hi = side.get("spread", {}).get(k)
            return f"{v:.3f}{unit}" + (f" ({lo_hi[0]:.3f}-{lo_hi[1]:.3f})" if lo_hi else "")

        for k, v in res["times"].items():
            w = ref["times"].get(k)
            ratio = f"{v / w:.2f}" if w else "-"
            print(f"| {k} | {cell(res, k)} | {cell(ref, k)} | {ratio} |")
        print("\nTimes: the median over the repetitions, in brackets the fastest and the slowest one.\n")
    return 1 if bad else 0


def cmd_compile(a) -> int:
    """torch.compile of a Mamba block on our ops: graph breaks and their reasons (those from our
    packages singled out), and compiled against eager, forward and backward."""
    import torch._dynamo as dynamo

    sz = sizes(a.tiny)
    problems = []
    ours_markers = ("/selective_scan/", "/causal_conv1d/", "/mamba_kernels/", "selective_scan_cuda.py",
                    "causal_conv1d_cuda.py")
    report = {}
    from mamba_ssm.modules.mamba_simple import Mamba

    from selective_scan import mamba_inner_fn as our_inner

    blocks = {"mamba_ssm Mamba block (its MambaInnerFn over selective_scan_cuda)": None,
              "Mamba block with our selective_scan.mamba_inner_fn": our_inner}
    for name, inner in blocks.items():
        import mamba_ssm.modules.mamba_simple as ms

        saved = ms.mamba_inner_fn
        if inner is not None:
            ms.mamba_inner_fn = inner
        try:
            torch.manual_seed(SEED)
            block = Mamba(d_model=sz["d_model"]).to(a.device)
            g = torch.Generator().manual_seed(SEED + 3)
            L = min(sz["block_L"], 512)
            x = torch.randn(2, L, sz["d_model"], generator=g).to(a.device).requires_grad_()
            dynamo.reset()
            ex = dynamo.explain(block)(x)
            reasons, ours = [], []
            for r in ex.break_reasons:  # where each break happened: the innermost frames of its stack
                files = [f"{f.filename}:{f.lineno}" for f in getattr(r, "user_stack", [])]
                head = str(getattr(r, "reason", r)).splitlines()[0]
                text = f"{head} at {' <- '.join(reversed(files[-3:]))}"
                reasons.append(text)
                if any(m in f for f in files for m in ours_markers):
                    ours.append(text)
            entry = {"graphs": ex.graph_count, "graph breaks": ex.graph_break_count, "break reasons": reasons,
                     "breaks from our packages": ours}
            if ours:
                problems.append(f"{name}: {len(ours)} graph breaks from our packages")
            dynamo.reset()
            eager = block(x)
            eager.backward(torch.ones_like(eager))
            gx_eager = x.grad.clone()
            x.grad = None
            block.zero_grad(set_to_none=True)
            compiled = torch.compile(block)
            out = compiled(x)
            out.backward(torch.ones_like(out))
            entry["compiled vs eager, out max rel"] = rel(out.detach(), eager.detach())
            entry["compiled vs eager, dx max rel"] = rel(x.grad, gx_eager)
            if max(entry["compiled vs eager, out max rel"], entry["compiled vs eager, dx max rel"]) > 1e-4:
                problems.append(f"{name}: compiled differs from eager")
            report[name] = entry
        except Exception as e:
            import traceback

            traceback.print_exc()
            problems.append(f"{name}: {type(e).__name__}: {e}")
        finally:
            ms.mamba_inner_fn = saved
    print("### torch.compile of a Mamba block\n")
    for name, e in report.items():
        print(f"- {name}: {e['graphs']} graph(s), {e['graph breaks']} break(s), "
              f"{len(e['breaks from our packages'])} from our packages; compiled vs eager max rel. "
              f"difference: out {e['compiled vs eager, out max rel']:.2e}, "
              f"dx {e['compiled vs eager, dx max rel']:.2e}")
        for r in e["break reasons"]:
            print(f"  - break: {r[:300]}")
    for p in problems:
        print(f"- PROBLEM: {p}")
    Path(a.dir).mkdir(parents=True, exist_ok=True)
    (Path(a.dir) / "compile.json").write_text(json.dumps({"report": report, "problems": problems}, indent=1))
    return 1 if problems else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--stack", choices=["mamba_ssm", "transformers"], required=True)
    r.add_argument("--label", required=True, help="ours, orig, or (transformers) torch: its own slow path")
    r.add_argument("--dtypes", default=None, help="comma-separated; float32,bfloat16 (on CPU float32)")
    r.add_argument("--orig-dir", default=None, help="the original's install (labels orig*)")
    c = sub.add_parser("compare")
    c.add_argument("--stack", choices=["mamba_ssm", "transformers", "mamba2"], required=True)
    c.add_argument("--base", required=True)
    c.add_argument("--label", required=True)
    k = sub.add_parser("compile")
    for s in (r, c, k):
        s.add_argument("--dir", required=True)
    for s in (r, k):
        s.add_argument("--tiny", action="store_true", help="tiny sizes (CPU smoke run)")
        s.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    if a.cmd == "run":
        a.dtypes = a.dtypes or ("float32,bfloat16" if a.device == "cuda" else "float32")
        return cmd_run(a)
    if a.cmd == "compare":
        return cmd_compare(a)
    return cmd_compile(a)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
