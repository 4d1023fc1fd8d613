"""Bytes a Mamba-2 layer body (``mamba_split_conv1d_scan_combined``) keeps between its forward and
its backward, on the CPU: the tensors autograd saves (``torch.autograd.graph.saved_tensors_hooks``),
each storage counted once, with and without the layer's inputs and parameters (which exist anyway).

Compares what ran before ``MambaSplitConv1dScanCombinedFn``: the composed path
(``_split_composed``, each piece recorded by autograd) with autograd through ``ssd_forward``
itself for the SSD; the composed path as it is now (the SSD through ``MambaChunkScanCombinedFn``;
it runs under torch.compile); and the Function, for a small Mamba-2 layer:
d_model 256 (expand 2, headdim 64, d_state 128, ngroups 1, conv width 4, chunk 256), seqlen 512,
batch 2, float32; and the scan alone at the same sizes. ``PYTHONPATH=. python bench/ssd_saved_bytes.py``.
"""

from __future__ import annotations

import torch

from selective_scan import ssd_combined as sc


def layer(d_model=256, expand=2, headdim=64, d_state=128, ngroups=1, width=4, batch=2, seqlen=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    d_inner = expand * d_model
    nheads = d_inner // headdim
    conv_dim = d_inner + 2 * ngroups * d_state
    p = dict(
        zxbcdt=torch.randn(batch, seqlen, 2 * d_inner + 2 * ngroups * d_state + nheads, generator=g),
        conv1d_weight=torch.randn(conv_dim, width, generator=g) * 0.3,
        conv1d_bias=torch.randn(conv_dim, generator=g) * 0.1,
        dt_bias=torch.randn(nheads, generator=g) * 0.5,
        A=-(torch.rand(nheads, generator=g) + 0.5),
        D=torch.randn(nheads, generator=g),
        rmsnorm_weight=torch.randn(d_inner, generator=g),
        outproj_weight=torch.randn(d_model, d_inner, generator=g) * 0.05,
    )
    for t in p.values():
        t.requires_grad_()
    kw = dict(chunk_size=256, headdim=headdim, ngroups=ngroups, rmsnorm_eps=1e-5, norm_before_gate=False)
    return p, kw


def saved(fn):
    """(output, [(shape, dtype, nbytes, storage key)] of every tensor autograd saved during fn)."""
    rows = []

    def pack(t):
        rows.append((tuple(t.shape), t.dtype, t.untyped_storage().nbytes(), t.untyped_storage().data_ptr()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, rows


def total(rows, exclude=()):
    seen, n = set(), 0
    for _, _, nbytes, key in rows:
        if key not in seen and key not in exclude:
            seen.add(key)
            n += nbytes
    return n


def measure():
    p, kw = layer()
    inputs = {t.untyped_storage().data_ptr() for t in p.values()}
    meta = sc._ssd_checks.check_split(p["zxbcdt"], p["conv1d_weight"], p["conv1d_bias"], p["dt_bias"], p["A"],
                                      p["D"], "silu", p["rmsnorm_weight"], 1e-5, p["outproj_weight"], None,
                                      kw["headdim"], kw["ngroups"])

    def composed():
        return sc._split_composed(
            p["zxbcdt"], p["conv1d_weight"], p["conv1d_bias"], p["dt_bias"], p["A"], p["D"], kw["chunk_size"],
            None, None, (0.0, float("inf")), "silu", p["rmsnorm_weight"], kw["rmsnorm_eps"],
            p["outproj_weight"], None, kw["norm_before_gate"], meta)[0]

    def function():
        return sc.mamba_split_conv1d_scan_combined(
            p["zxbcdt"], p["conv1d_weight"], p["conv1d_bias"], p["dt_bias"], p["A"], p["D"], kw["chunk_size"],
            rmsnorm_weight=p["rmsnorm_weight"], rmsnorm_eps=kw["rmsnorm_eps"],
            outproj_weight=p["outproj_weight"],
            headdim=kw["headdim"], ngroups=kw["ngroups"], norm_before_gate=kw["norm_before_gate"])

    def before():  # the SSD by autograd through ssd_forward, as before the Functions
        def plain(x, dt, A, B, C, size, D, z, dt_bias, init, seq_idx, cu_seqlens, softplus, limit, *flags):
            res = sc.ssd_forward(x, dt, A, B, C, size, D, z, dt_bias, init, seq_idx, cu_seqlens, softplus,
                                 limit)
            return res[0], res[5], res[6]

        kept, sc._chunk_scan = sc._chunk_scan, plain
        try:
            return composed()
        finally:
            sc._chunk_scan = kept

    result = {}
    for name, fn in (("before: autograd through all", before), ("composed, SSD Function", composed),
                     ("MambaSplitConv1dScanCombinedFn", function)):
        out, rows = saved(fn)
        result[name] = (total(rows), total(rows, inputs), len(rows))
        del out
    return result


def measure_chunk_scan(batch=2, seqlen=512, nheads=8, headdim=64, dstate=128, seed=0):
    """The same for the scan alone (``mamba_chunk_scan_combined`` with D, z, softplus): autograd
    through ``ssd_forward`` against ``MambaChunkScanCombinedFn`` (recompute path)."""
    g = torch.Generator().manual_seed(seed)
    t = dict(
        x=torch.randn(batch, seqlen, nheads, headdim, generator=g),
        dt=torch.rand(batch, seqlen, nheads, generator=g),
        A=-(torch.rand(nheads, generator=g) + 0.5),
        B=torch.randn(batch, seqlen, 1, dstate, generator=g),
        C=torch.randn(batch, seqlen, 1, dstate, generator=g),
        D=torch.randn(nheads, generator=g),
        z=torch.randn(batch, seqlen, nheads, headdim, generator=g),
    )
    for v in t.values():
        v.requires_grad_()
    inputs = {v.untyped_storage().data_ptr() for v in t.values()}
    a = [t[k] for k in ("x", "dt", "A", "B", "C")]
    runs = (
        ("before: autograd through ssd_forward",
         lambda: sc.ssd_forward(*a, 256, t["D"], t["z"], None, None, None, None, True)[0]),
        ("MambaChunkScanCombinedFn",
         lambda: sc.mamba_chunk_scan_combined(*a, 256, t["D"], t["z"], dt_softplus=True)),
    )
    result = {}
    for name, fn in runs:
        out, rows = saved(fn)
        result[name] = (total(rows), total(rows, inputs), len(rows))
        del out
    return result


if __name__ == "__main__":
    for name, (all_bytes, own, count) in measure_chunk_scan().items():
        print(f"{name:36s} saved tensors {count:4d}  all {all_bytes / 2**20:8.2f} MiB  "
              f"beyond inputs/parameters {own / 2**20:8.2f} MiB ({own} bytes)")
    for name, (all_bytes, own, count) in measure().items():
        print(f"{name:36s} saved tensors {count:4d}  all {all_bytes / 2**20:8.2f} MiB  "
              f"beyond inputs/parameters {own / 2**20:8.2f} MiB ({own} bytes)")
