"""Where mamba_ssm's Mamba block and LM spend their time, per kernel (torch.profiler), beside the
wall time the caller waits for, and the block's memory through a training step, in the order
the sections are given.

    PYTHONPATH=<mamba_ssm and the kernels to profile> python3 bench/experiments/profile_block.py \
        [--dtype bf16] [--what block-fwd,block-train,lm-fwd,lm-train,memory]

Run once per stack (ours: mamba_ssm's Python over our selective_scan_cuda; orig: mamba_ssm's
own wheel) and compare. The sizes are bench/e2e_mamba.py's: the block at d_model 768, batch 4,
length 2048; the LM at 4 layers, length 1024; the memory block (8, 8192, 2560). Each section
prints the median wall milliseconds per call (CUDA synchronised), the GPU time of its kernels per
call, and the kernels that took the most GPU time. A wall time well above the kernels' sum means
the call waits on the host (Python, launches), not on the GPU.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

WHAT = ("block-fwd", "block-train", "lm-fwd", "lm-train", "memory")


def wall_ms(fn, reps: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def profile(name: str, fn, rows: int, reps: int = 5, cpu: bool = False) -> None:
    ms = wall_ms(fn)
    acts = [torch.profiler.ProfilerActivity.CUDA] + ([torch.profiler.ProfilerActivity.CPU] if cpu else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    avg = prof.key_averages()
    key = "device_time_total" if hasattr(avg[0], "device_time_total") else "cuda_time_total"
    gpu_us = sum(getattr(e, key, 0.0) for e in avg
                 if e.device_type == torch.autograd.DeviceType.CUDA) / reps
    print(f"\n## {name}: wall {ms:.3f} ms per call, kernels {gpu_us / 1e3:.3f} ms per call")
    print(avg.table(sort_by=key, row_limit=rows, max_name_column_width=60))
    if cpu:  # what the host spends its time on, per op (Python-side ops and the CUDA runtime)
        print(avg.table(sort_by="cpu_time_total", row_limit=rows, max_name_column_width=60))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--what", default=",".join(WHAT))
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--cpu", action="store_true", help="also profile the host: ops by CPU time")
    a = ap.parse_args()
    what = a.what.split(",")
    unknown = sorted(set(what) - set(WHAT))
    if unknown:
        ap.error(f"--what: unknown sections {unknown}; choose from {', '.join(WHAT)}")
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    from mamba_ssm.models.config_mamba import MambaConfig
    from mamba_ssm.models.mixer_seq_simple import MambaLMHeadModel
    from mamba_ssm.modules.mamba_simple import Mamba

    import selective_scan_cuda

    print("selective_scan_cuda from", selective_scan_cuda.__file__)
    torch.manual_seed(0)
    block = Mamba(d_model=768, layer_idx=0).to(device="cuda", dtype=dtype)
    x = torch.randn(4, 2048, 768, device="cuda", dtype=dtype)
    lm = []

    def model():
        if not lm:
            cfg = MambaConfig(d_model=768, n_layer=4, vocab_size=1024, rms_norm=True, fused_add_norm=True)
            lm.append((MambaLMHeadModel(cfg).to(device="cuda", dtype=dtype),
                       torch.randint(0, 1024, (4, 1024), device="cuda")))
        return lm[0]

    for section in what:  # in the order given: what ran before can matter (the allocator's cache)
        if section == "block-fwd":
            with torch.no_grad():
                profile("block forward", lambda: block(x), a.rows, cpu=a.cpu)
        elif section == "block-train":
            xg = x.clone().requires_grad_()
            dy = torch.randn_like(x)
            profile("block fwd+bwd", lambda xg=xg, dy=dy: block(xg).backward(dy), a.rows, cpu=a.cpu)
        elif section == "lm-fwd":
            m, ids = model()
            with torch.no_grad():
                profile("LM forward", lambda m=m, ids=ids: m(ids), a.rows, cpu=a.cpu)
        elif section == "lm-train":
            m, ids = model()
            def step(m=m, ids=ids):
                m(ids).logits.float().sum().backward()

            profile("LM fwd+bwd", step, a.rows, cpu=a.cpu)
        elif section == "memory":
            memory(Mamba, dtype)


def memory(Mamba, dtype) -> None:
    mib = 2.0 ** 20
    big = Mamba(d_model=2560).to(device="cuda", dtype=dtype)
    xb = torch.randn(8, 8192, 2560, device="cuda", dtype=dtype).requires_grad_()
    dyb = torch.randn_like(xb)
    big(xb).backward(dyb)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y = big(xb)
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - base - y.numel() * y.element_size()
    fwd_peak = torch.cuda.max_memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    y.backward(dyb)
    torch.cuda.synchronize()
    bwd_peak = torch.cuda.max_memory_allocated() - base
    print(f"\n## memory, block (8, 8192, 2560): kept {kept / mib:.0f} MiB, "
          f"forward peak {fwd_peak / mib:.0f} MiB, backward peak {bwd_peak / mib:.0f} MiB "
          "(above the parameters and their gradients)")


if __name__ == "__main__":
    main()
