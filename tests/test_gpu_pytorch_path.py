"""The PyTorch implementations on a CUDA device, and auto mode's fallback warning.

The compiled extensions are hidden from dispatch here (as if they were not installed), so on
CUDA tensors auto mode runs the PyTorch scan and warns once; results must equal the CPU
computation of the same inputs.
"""

import warnings

import pytest
import torch

from mamba_kernels.runtime import dispatch, knobs
from selective_scan import mamba_inner_fn, selective_scan_fn

pytestmark = pytest.mark.gpu


@pytest.fixture
def auto_mode(monkeypatch):
    monkeypatch.delenv(knobs.BACKEND_VAR, raising=False)
    monkeypatch.setattr(dispatch, "_warned", set())
    for kernel in dispatch.EXTENSIONS:  # as if not installed, whether or not they are
        monkeypatch.setitem(dispatch._status, kernel, dispatch.ExtensionStatus(None, "hidden by the test"))


def _scan_inputs(device, b=2, d=8, L=3000, n=16):
    g = torch.Generator().manual_seed(1)
    u = torch.randn(b, d, L, generator=g)
    delta = 0.5 * torch.rand(b, d, L, generator=g)
    A = -0.5 * torch.rand(d, n, generator=g)
    B = torch.randn(b, n, L, generator=g)
    C = torch.randn(b, n, L, generator=g)
    D = torch.randn(d, generator=g)
    z = torch.randn(b, d, L, generator=g)
    bias = 0.5 * torch.rand(d, generator=g)
    return [t.to(device).requires_grad_() for t in (u, delta, A, B, C, D, z, bias)]


def test_selective_scan_on_cuda_warns_once_and_matches_cpu(auto_mode):
    cpu, gpu = _scan_inputs("cpu"), _scan_inputs("cuda")
    kw = dict(delta_softplus=True, return_last_state=True)
    ref, last_ref = selective_scan_fn(*cpu[:7], delta_bias=cpu[7], **kw)
    with pytest.warns(RuntimeWarning, match="selective_scan on CUDA tensors with the slower PyTorch"):
        out, last = selective_scan_fn(*gpu[:7], delta_bias=gpu[7], **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only once
        selective_scan_fn(*gpu[:7], delta_bias=gpu[7], delta_softplus=True)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(last.cpu(), last_ref, rtol=1e-4, atol=1e-4)
    dout = torch.randn_like(ref)
    ref.backward(dout)
    out.backward(dout.cuda())
    for a, b in zip(gpu, cpu):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-3, atol=1e-3)


def test_mamba_inner_fn_on_cuda_matches_cpu(auto_mode):
    g = torch.Generator().manual_seed(2)
    b, d, L, n, r, w, dm = 2, 64, 257, 8, 4, 4, 32
    shapes = {
        "xz": (b, 2 * d, L), "conv_w": (d, 1, w), "conv_b": (d,), "x_proj": (r + 2 * n, d),
        "dt_proj": (d, r), "out_proj": (dm, d), "out_b": (dm,), "D": (d,), "dt_bias": (d,),
    }
    base = {k: 0.3 * torch.randn(s, generator=g) for k, s in shapes.items()}
    base["A"] = -torch.rand(d, n, generator=g)

    def run(device):
        t = {k: v.to(device).requires_grad_() for k, v in base.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the scan falls back: tested above
            out = mamba_inner_fn(
                t["xz"], t["conv_w"], t["conv_b"], t["x_proj"], t["dt_proj"], t["out_proj"], t["out_b"],
                t["A"], None, None, t["D"], t["dt_bias"], delta_softplus=True,
            )
            out.backward(torch.ones_like(out))
        return out, t

    out_gpu, t_gpu = run("cuda")
    out_cpu, t_cpu = run("cpu")
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, rtol=1e-3, atol=1e-3)
    for k in base:
        torch.testing.assert_close(t_gpu[k].grad.cpu(), t_cpu[k].grad, rtol=2e-3, atol=2e-3, msg=k)
