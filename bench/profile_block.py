"""Where a mamba_ssm Mamba block's forward spends its GPU time, per kernel (torch.profiler).

    PYTHONPATH=<mamba_ssm and the kernels to profile> python3 bench/profile_block.py [--dtype bf16]

Run once per stack (ours: mamba_ssm's Python over our selective_scan_cuda; orig: mamba_ssm's
own wheel) and compare the tables: the block is bench/e2e_mamba.py's (d_model 768, batch 4,
length 2048), weights in the given dtype, forward only, after warm-up.
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--rows", type=int, default=12)
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    from mamba_ssm.modules.mamba_simple import Mamba

    import selective_scan_cuda

    print("selective_scan_cuda from", selective_scan_cuda.__file__)
    torch.manual_seed(0)
    block = Mamba(d_model=768, layer_idx=0).to(device="cuda", dtype=dtype)
    x = torch.randn(4, 2048, 768, device="cuda", dtype=dtype)
    with torch.no_grad():
        for _ in range(3):
            block(x)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                block(x)
            torch.cuda.synchronize()
    avg = prof.key_averages()
    try:
        print(avg.table(sort_by="device_time_total", row_limit=a.rows, max_name_column_width=70))
    except (KeyError, AttributeError, ValueError):  # older torch names the key after CUDA
        print(avg.table(sort_by="cuda_time_total", row_limit=a.rows, max_name_column_width=70))


if __name__ == "__main__":
    main()
