"""Mamba-2 end to end on mamba_ssm 2.3.2: its Mamba2 layer and a MambaLMHeadModel of Mamba-2
layers, each side in its own process, then compared with bench/e2e_mamba.py's table.

  python bench/e2e_mamba2.py run --label ours --dir D --ms-dir MS [--tiny] [--device cpu]
  python bench/e2e_mamba2.py run --label triton --dir D --ms-dir MS
  python bench/e2e_mamba.py compare --stack mamba2 --base triton --label ours --dir D

MS holds mamba_ssm's Python (its sdist installed with the CUDA build skipped, as
bench/gpu_ssd_run.sh does). "ours": the process makes ``import triton`` fail, calls
``selective_scan.for_mamba_ssm.install()`` and then imports mamba_ssm, so its Triton modules
(SSD, gated norm, layer norm, decode step) are ours. "triton": mamba_ssm's own Triton modules.
Both sides use our causal_conv1d (the conv is not what is compared). Before anything is measured
the process proves which modules it runs on (exit 2 otherwise). Weights and inputs come from
fixed seeds on the CPU, so both processes build the same model; outputs, gradients, greedy
tokens, times (median of the repetitions, with the range) and peak memory go to
D/mamba2-<label>.pt.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

LABELS = ("ours", "triton")
SERVED = ("ssd_combined", "layernorm_gated", "layer_norm", "selective_state_update")
SEED = 0


def sizes(tiny: bool) -> dict:
    if tiny:
        return dict(d_model=64, d_state=16, headdim=16, chunk=16, n_layer=2, vocab=64, batch=2, block_L=40,
                    lm_L=24, prompt=6, new=6, reps=1)
    # the layer of a ~1B Mamba-2 (d_model 2048 would double it): 32 heads of 64, dstate 128, chunk 256
    return dict(d_model=1024, d_state=128, headdim=64, chunk=256, n_layer=4, vocab=1024, batch=4,
                block_L=2048, lm_L=1024, prompt=64, new=192, reps=10)


def prepare(label: str, ms_dir: str) -> list:
    """Make the side's imports happen and prove them; returns the provenance lines."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ms = os.path.realpath(ms_dir)
    if label == "ours":
        sys.modules["triton"] = None  # as on Windows: `import triton` raises ImportError
        from selective_scan import for_mamba_ssm

        for_mamba_ssm.install()
    sys.path.insert(0, ms)
    import mamba_ssm
    import mamba_ssm.modules.mamba2  # noqa: F401  (imports the modules checked below)

    lines = [f"mamba_ssm {getattr(mamba_ssm, '__version__', '?')} from {os.path.dirname(mamba_ssm.__file__)}"]
    if not os.path.realpath(mamba_ssm.__file__).startswith(ms + os.sep):
        raise RuntimeError(f"mamba_ssm came from {mamba_ssm.__file__}, not from {ms}")
    want = os.path.join(root, "selective_scan") if label == "ours" else os.path.join(ms, "mamba_ssm")
    for name in SERVED:
        mod = sys.modules.get(f"mamba_ssm.ops.triton.{name}")
        if mod is None:
            __import__(f"mamba_ssm.ops.triton.{name}")
            mod = sys.modules[f"mamba_ssm.ops.triton.{name}"]
        where = os.path.realpath(mod.__file__)
        if not where.startswith(want + os.sep):
            raise RuntimeError(f"mamba_ssm.ops.triton.{name} is {where}, expected a file under {want}")
        lines.append(f"mamba_ssm.ops.triton.{name} = {where}")
    if label == "ours":
        lines.append(f"triton importable: {sys.modules.get('triton', 'absent') is not None}")
    return lines


def peak_mib(fn) -> float:
    """MiB that one call of fn allocates at its peak beyond what was allocated before it."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def run(label: str, sz: dict, device: str, dtype, problems: list) -> tuple:
    import e2e_mamba as e2e
    import torch
    from mamba_ssm.models.config_mamba import MambaConfig
    from mamba_ssm.models.mixer_seq_simple import MambaLMHeadModel
    from mamba_ssm.modules import mamba2 as m2

    for name in ("mamba_split_conv1d_scan_combined", "mamba_chunk_scan_combined", "selective_state_update"):
        if getattr(m2, name, None) is not None:
            setattr(m2, name, e2e.counting(name, getattr(m2, name)))
    res, times = {}, e2e.Timings()
    layer = dict(d_state=sz["d_state"], headdim=sz["headdim"], chunk_size=sz["chunk"])
    # the Mamba2 layer, training path (the fused split conv1d scan)
    torch.manual_seed(SEED)
    block = m2.Mamba2(d_model=sz["d_model"], layer_idx=0, **layer).to(device=device, dtype=dtype)
    g = torch.Generator().manual_seed(SEED + 1)
    x = torch.randn(sz["batch"], sz["block_L"], sz["d_model"], generator=g).to(device=device, dtype=dtype)
    dy = torch.randn(x.shape, generator=g).to(device=device, dtype=dtype)
    xl = x.clone().requires_grad_()
    y = block(xl)
    y.backward(dy)
    e2e.expect_calls("Mamba2 layer fwd+bwd", {"mamba_split_conv1d_scan_combined": 1}, problems)
    res["block.out"] = y.detach().float().cpu()
    res["block.dx"] = xl.grad.float().cpu()
    names = ["in_proj.weight", "conv1d.weight", "A_log", "dt_bias", "D", "norm.weight", "out_proj.weight"]
    res.update({f"block.{k}": v for k, v in e2e.grads_of(block, names).items()})
    with torch.no_grad():
        times.time("Mamba2 layer forward", lambda: block(x), device, sz["reps"])

    def block_step():
        block.zero_grad(set_to_none=True)
        block(xl).backward(dy)

    times.time("Mamba2 layer fwd+bwd", block_step, device, sz["reps"])
    if device == "cuda":
        times["Mamba2 layer fwd+bwd: peak memory above the inputs, MiB"] = peak_mib(block_step)
    e2e.CALLS.clear()
    # the language model: a next-token loss forward + backward, then greedy generation
    torch.manual_seed(SEED)
    cfg = MambaConfig(d_model=sz["d_model"], n_layer=sz["n_layer"], vocab_size=sz["vocab"],
                      ssm_cfg=dict(layer="Mamba2", **layer), rms_norm=True, fused_add_norm=True)
    model = MambaLMHeadModel(cfg).to(device=device, dtype=dtype)
    ids = torch.randint(0, sz["vocab"], (sz["batch"], sz["lm_L"]), generator=g).to(device)
    logits, loss = e2e.next_token_loss(model, ids)
    loss.backward()
    e2e.expect_calls("Mamba-2 LM fwd+bwd", {"mamba_split_conv1d_scan_combined": sz["n_layer"]}, problems)
    res["lm.logits"] = logits.detach().float().cpu()
    res["lm.loss"] = loss.detach().float().cpu().reshape(1)
    res.update({f"lm.{k}": v for k, v in e2e.grads_of(model, ["backbone.embedding.weight",
                                                              "backbone.layers.0.mixer.in_proj.weight",
                                                              "backbone.layers.0.mixer.A_log"]).items()})
    with torch.no_grad():
        times.time("LM forward", lambda: model(ids), device, sz["reps"])

    def lm_step():
        model.zero_grad(set_to_none=True)
        e2e.next_token_loss(model, ids)[1].backward()

    times.time("LM fwd+bwd", lm_step, device, sz["reps"])
    if device == "cuda":
        times["LM fwd+bwd: peak memory above the model, MiB"] = peak_mib(lm_step)
    model.eval()
    prompt = ids[:, : sz["prompt"]]
    max_length = sz["prompt"] + sz["new"]
    e2e.CALLS.clear()
    for cg in ((False, True) if device == "cuda" else (False,)):
        try:
            out = model.generate(prompt, max_length=max_length, top_k=1, cg=cg)
            tokens = out[:, sz["prompt"]:].cpu()
            if not cg:
                e2e.expect_calls("generate (decode steps)",
                                 {"selective_state_update": sz["n_layer"] * (sz["new"] - 1)}, problems)
                res["gen.tokens"] = tokens
            elif not torch.equal(tokens, res.get("gen.tokens", tokens)):
                problems.append("generate: the tokens with CUDA graphs differ from those without")
            key = f"generate{' (CUDA graphs)' if cg else ''}, tokens/s"
            times.rate(key, sz["batch"] * sz["new"],
                       lambda cg=cg: model.generate(prompt, max_length=max_length, top_k=1, cg=cg), device,
                       max(1, sz["reps"] // 3))
        except Exception as e:  # reported; the rest still runs
            problems.append(f"generate cg={cg}: {type(e).__name__}: {e}")
    return res, times


def cmd_run(a) -> int:
    import torch

    try:
        checked = prepare(a.label, a.ms_dir)
    except Exception as e:  # nothing is measured on modules we did not mean
        print(f"PROVENANCE FAILED ({a.label}): {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    for line in checked:
        print(f"provenance {a.label}: {line}", flush=True)
    sz = sizes(a.tiny)
    ssd = "mamba_ssm.ops.triton.ssd_combined"
    meta = {"stack": "mamba2", "label": a.label, "device": a.device, "sizes": sz,
            "torch": str(torch.__version__), "modules": {ssd: sys.modules[ssd].__file__},
            "gpu": torch.cuda.get_device_name() if a.device == "cuda" else "cpu", "provenance": checked}
    results, problems = {}, []
    for name in a.dtypes.split(","):
        try:
            res, times = run(a.label, sz, a.device, getattr(torch, name), problems)
            results[name] = {"tensors": res, "times": dict(times), "spread": times.spread}
        except Exception as e:
            import traceback

            traceback.print_exc()
            problems.append(f"{name}: {type(e).__name__}: {e}")
    meta["problems"] = problems
    out = Path(a.dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"meta": meta, "results": results}, out / f"mamba2-{a.label}.pt")
    print(json.dumps({"meta": meta, "times": {k: v["times"] for k, v in results.items()}}, indent=1))
    return 1 if problems else 0


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cmd", choices=["run"])
    p.add_argument("--label", choices=LABELS, required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--ms-dir", required=True, help="mamba_ssm's Python (pip install --target)")
    p.add_argument("--dtypes", default=None,
                   help="comma-separated (default bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes (CPU smoke run)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    a.dtypes = a.dtypes or ("bfloat16" if a.device == "cuda" else "float32")
    return cmd_run(a)


if __name__ == "__main__":
    sys.exit(main())
