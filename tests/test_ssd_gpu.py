"""The SSD on a CUDA device, by the PyTorch path (MAMBA_KERNELS_BACKEND=reference) and by the
dispatch's choice (auto: the compiled forward where built): results and gradients equal the CPU
computation of the same inputs (the device's matmuls may run TF32, hence the tolerances)."""

from __future__ import annotations

import math

import pytest
import torch

from selective_scan.ssd_combined import mamba_chunk_scan_combined, mamba_split_conv1d_scan_combined

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True, params=["reference", "auto"])
def backend(request, monkeypatch):
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", request.param)
    return request.param


def _inputs(device, dtype, batch=2, seqlen=300, nheads=8, headdim=16, ngroups=2, dstate=32):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(batch, seqlen, nheads, headdim, generator=g)
    dt = torch.randn(batch, seqlen, nheads, generator=g)
    A = -(torch.rand(nheads, generator=g) + 0.3)
    B = torch.randn(batch, seqlen, ngroups, dstate, generator=g)
    C = torch.randn(batch, seqlen, ngroups, dstate, generator=g)
    D = torch.randn(nheads, generator=g)
    z = torch.randn(x.shape, generator=g)
    bias = torch.randn(nheads, generator=g) * 0.5
    init = torch.randn(batch, nheads, headdim, dstate, generator=g)
    seq_idx = (torch.arange(seqlen)[None, :] >= torch.tensor([[120], [200]])).to(torch.int32)
    low = [t.to(dtype) for t in (x, dt, B, C, z)]
    full = [A, D, bias, init]
    return [t.to(device).requires_grad_() for t in low + full], seq_idx.to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunk_scan_on_cuda_matches_cpu(dtype):
    results = []
    for device in ("cpu", "cuda"):
        (x, dt, B, C, z, A, D, bias, init), seq_idx = _inputs(device, dtype)
        out, final = mamba_chunk_scan_combined(
            x, dt, A, B, C, 64, D=D, z=z, dt_bias=bias, initial_states=init, seq_idx=seq_idx,
            dt_softplus=True, dt_limit=(0.01, math.inf), return_final_states=True)
        w = torch.linspace(-1, 1, out.numel(), device=device).view(out.shape)
        grads = torch.autograd.grad((out.float() * w).sum() + final.sum(), [x, dt, A, B, C, D, z, bias, init])
        results.append([out, final, *grads])
    tol = 2e-2 if dtype == torch.bfloat16 else 5e-3
    for cpu, gpu in zip(*results):
        scale = cpu.float().abs().max().clamp(min=1)
        assert ((gpu.cpu().float() - cpu.float()).abs().max() / scale) < tol


def test_nan_stays_in_its_future_on_cuda():
    (x, dt, B, C, z, A, D, bias, init), _ = _inputs("cuda", torch.float32)
    x = x.detach().clone()
    x[:, 150] = math.nan
    out = mamba_chunk_scan_combined(x, dt.detach(), A.detach(), B.detach(), C.detach(), 64)
    assert torch.isfinite(out[:, :150]).all() and torch.isnan(out[:, 150:]).any()


def test_split_conv1d_on_cuda_matches_cpu():
    g = torch.Generator().manual_seed(6)
    nheads, headdim, ngroups, dstate = 4, 16, 1, 16
    dim = nheads * headdim
    conv_dim = dim + 2 * ngroups * dstate
    tensors = [torch.randn(2, 130, 2 * dim + 2 * ngroups * dstate + nheads, generator=g),
               torch.randn(conv_dim, 4, generator=g) * 0.5, torch.randn(conv_dim, generator=g),
               torch.randn(nheads, generator=g) * 0.5, -(torch.rand(nheads, generator=g) + 0.3),
               torch.randn(nheads, headdim, generator=g), torch.randn(dim, generator=g),
               torch.randn(24, dim, generator=g) * 0.2]
    outs = []
    for device in ("cpu", "cuda"):
        zxbcdt, w, b, dt_bias, A, D, rms, proj = [t.to(device) for t in tensors]
        outs.append(mamba_split_conv1d_scan_combined(zxbcdt, w, b, dt_bias, A, D, 64, rmsnorm_weight=rms,
                                                     outproj_weight=proj, ngroups=ngroups))
    torch.testing.assert_close(outs[1].cpu(), outs[0], rtol=5e-3, atol=5e-3)


def test_without_the_knob_cuda_tensors_take_the_pytorch_path(monkeypatch, backend):
    """MAMBA_KERNELS_MAMBA2_CUDA=0: neither Mamba-2 op launches a kernel of ours."""
    from torch.profiler import ProfilerActivity, profile

    from selective_scan.layernorm_gated import rmsnorm_fn

    monkeypatch.setenv("MAMBA_KERNELS_MAMBA2_CUDA", "0")
    (x, dt, B, C, z, A, D, bias, init), seq_idx = _inputs("cuda", torch.bfloat16)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        y = mamba_chunk_scan_combined(x, dt, A, B, C, 64, D=D, z=z, dt_bias=bias, dt_softplus=True)
        rmsnorm_fn(y.flatten(2), torch.ones(y.shape[2] * y.shape[3], device="cuda"), None, group_size=16)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert not [n for n in names if "mamba_kernels" in n], names
