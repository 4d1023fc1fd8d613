"""The compatibility modules selective_scan_cuda and causal_conv1d_cuda on CPU: they import
without a GPU, keep the originals' positional contracts (arities, return lists, in-place
outputs), run the PyTorch path for CPU tensors and reject bad arguments by name. When the
mamba_ssm 2.3.2 sdist is at hand (MAMBA_SSM_SDIST, else fetched once from PyPI into build/ with
``pip download``), mamba_ssm's own Python runs on them."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types

import peer_sources
import pytest
import torch
import torch.nn.functional as F
from scan_standin import StandInKernel

import causal_conv1d_cuda
import selective_scan_cuda
from causal_conv1d.causal_conv1d_interface import causal_conv1d_ref, causal_conv1d_update_ref
from selective_scan import for_mamba_ssm, mamba_inner_fn, selective_scan_ref


@pytest.fixture(autouse=True)
def _reference(monkeypatch):
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "reference")


def scan_inputs(complex_a=False, z=True, variable=True, L=150, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    b, d, n = 2, 4, 3
    A = -0.5 * torch.rand(d, n, generator=g) - 0.1
    if complex_a:
        A = torch.complex(A, torch.randn(d, n, generator=g))
    lb = 2 * L if complex_a else L
    bc = (lambda: torch.randn(b, 1, n, lb, generator=g).to(dtype)) if variable else (
        lambda: torch.randn(d, n, generator=g).to(A.dtype))
    return [
        torch.randn(b, d, L, generator=g).to(dtype),
        (0.5 * torch.rand(b, d, L, generator=g)).to(dtype),
        A,
        bc(),
        bc(),
        torch.randn(d, generator=g),
        torch.randn(b, d, L, generator=g).to(dtype) if z else None,
        0.5 * torch.rand(d, generator=g),
    ]


def test_imports_as_mamba_ssm_does():
    # the import lines of mamba_ssm 2.3.2 and of its 2.2.x releases, on a machine without a GPU
    code = (
        "import selective_scan_cuda, causal_conv1d_cuda\n"
        "from causal_conv1d import causal_conv1d_fn, causal_conv1d_update\n"
        "from causal_conv1d.cpp_functions import causal_conv1d_fwd_function, "
        "causal_conv1d_bwd_function, causal_conv1d_update_function\n"
        "from causal_conv1d.causal_conv1d_varlen import causal_conv1d_varlen_states\n"
        "print(selective_scan_cuda.fwd.__module__, causal_conv1d_cuda.causal_conv1d_fwd.__module__)\n"
    )
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(peer_sources.ROOT))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["selective_scan.cuda_compat", "causal_conv1d.cuda_compat"]


@pytest.mark.parametrize("form", ["keep", "recompute"])
@pytest.mark.parametrize("complex_a", [False, True])
@pytest.mark.parametrize("z", [False, True])
@pytest.mark.parametrize("variable", [False, True])
def test_scan_fwd_bwd_contract(complex_a, z, variable, form, monkeypatch):
    monkeypatch.setenv("MAMBA_KERNELS_SCAN_STATES", form)
    args = scan_inputs(complex_a, z, variable)
    u, delta, A, B, C, D, zz, bias = args
    res = selective_scan_cuda.fwd(*args, True)
    assert isinstance(res, list) and len(res) == (3 if z else 2)
    out, x = res[:2]
    want, last = selective_scan_ref(u, delta, A, B, C, D, None, bias, True, True)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    assert x.dim() == 4 and x.shape[:2] == (2, 4) and x.shape[3] == 2 * A.shape[1] and x.dtype == A.dtype
    if form == "recompute":  # the original's shape: one row per 2048 steps
        assert x.shape[2] == 1 and (x[:, :, :, 0::2] == 0).all()
    torch.testing.assert_close(x[:, :, -1, 1::2], last, rtol=1e-4, atol=1e-4)  # what mamba_ssm reads
    if z:
        torch.testing.assert_close(res[2], (want * F.silu(zz)), rtol=1e-4, atol=1e-4)
    # gradients against autograd through the per-step reference
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    leaves = [t.clone().requires_grad_() if t is not None else None for t in args]
    selective_scan_ref(*leaves, delta_softplus=True).backward(dout)
    dz = torch.empty_like(zz) if z else None
    grads = selective_scan_cuda.bwd(*args, dout, x, out, dz, True, True)
    assert len(grads) == 7 + z + 1
    names = ["u", "delta", "A", "B", "C", "D"]
    for name, got, leaf in zip(names, grads, leaves):
        assert got.shape == leaf.shape and got.dtype == leaf.dtype, name
        scale = leaf.grad.abs().max().item()
        torch.testing.assert_close(got, leaf.grad, rtol=1e-3, atol=1e-3 * scale, msg=name)
    torch.testing.assert_close(grads[6], leaves[7].grad, rtol=1e-3, atol=1e-3)
    if z:
        assert grads[7] is dz  # written in place and returned
        torch.testing.assert_close(dz, leaves[6].grad, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(grads[8], res[2])  # recompute_out_z
    else:
        assert grads[7] is None  # recompute_out_z without z: nothing to recompute
    # without x the backward recomputes the states; the gradients are the same
    again = selective_scan_cuda.bwd(*args, dout, None, out, None, True, False)
    assert len(again) == 7 + z
    for got, exp in zip(again, grads):
        torch.testing.assert_close(got, exp)


@pytest.mark.parametrize("count", [1, 2, 5, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_scan_states_pack_two_per_row(count, dtype):
    from selective_scan import cuda_compat

    states = torch.randn(2, 3, count, 4, dtype=dtype)
    x = cuda_compat._pack(states)
    assert x.shape == (2, 3, (count + 1) // 2, 8) and x.dtype == dtype
    torch.testing.assert_close(x[:, :, -1, 1::2], states[:, :, -1], rtol=0, atol=0)  # what callers read
    torch.testing.assert_close(x[:, :, 0, 0::2], states[:, :, 0], rtol=0, atol=0)
    torch.testing.assert_close(cuda_compat._unpack(x, count), states, rtol=0, atol=0)
    strided = x.transpose(0, 1).contiguous().transpose(0, 1)  # a strided x reads the same
    torch.testing.assert_close(cuda_compat._unpack(strided, count), states, rtol=0, atol=0)


def test_scan_recompute_states_have_the_original_shape(monkeypatch):
    # 2049 steps: two rows of the original's 2048-step chunks; x is 4 times smaller than the
    # checkpoint form here, and both give the same gradients
    args = scan_inputs(L=2049, z=True)
    dout = torch.randn(2, 4, 2049, generator=torch.Generator().manual_seed(3))
    grads, sizes = {}, {}
    for form in ("keep", "recompute"):
        monkeypatch.setenv("MAMBA_KERNELS_SCAN_STATES", form)
        out, x, _ = selective_scan_cuda.fwd(*args, True)
        sizes[form] = x.shape
        grads[form] = selective_scan_cuda.bwd(*args, dout, x, out, None, True, False)
    assert sizes["recompute"] == (2, 4, 2, 6)
    assert sizes["keep"] == (2, 4, (2049 // 16 + 1 + 1) // 2, 6)
    # with two rows, the last state sits in the last row's odd slots and every other slot is 0
    monkeypatch.setenv("MAMBA_KERNELS_SCAN_STATES", "recompute")
    _, x, _ = selective_scan_cuda.fwd(*args, True)
    _, last = selective_scan_ref(*args[:6], None, args[7], True, True)
    torch.testing.assert_close(x[:, :, -1, 1::2], last, rtol=1e-4, atol=1e-4)
    rest = x.clone()
    rest[:, :, -1, 1::2] = 0
    assert (rest == 0).all()
    for a, b in zip(grads["keep"], grads["recompute"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_scan_states_form_knob_is_checked(monkeypatch):
    args = scan_inputs(L=40)
    monkeypatch.setenv("MAMBA_KERNELS_SCAN_STATES", "keep")
    out, x, _ = selective_scan_cuda.fwd(*args, True)
    monkeypatch.setenv("MAMBA_KERNELS_SCAN_STATES", "recompute")
    # an x made under the other form is refused by name, not misread
    with pytest.raises(ValueError, match=r"x must be the second .*MAMBA_KERNELS_SCAN_STATES=recompute"):
        selective_scan_cuda.bwd(*args, torch.ones_like(out), x, out, None, True, False)
    monkeypatch.setenv("MAMBA_KERNELS_SCAN_STATES", "small")
    with pytest.raises(ValueError, match=r"MAMBA_KERNELS_SCAN_STATES='small' is not .*keep, recompute"):
        selective_scan_cuda.fwd(*args, True)


@pytest.mark.parametrize("form", ["keep", "recompute"])
@pytest.mark.parametrize("complex_a", [False, True])
def test_scan_compiled_path_bookkeeping(form, complex_a, monkeypatch):
    # the compiled path with a stand-in for the kernels: x's rows, the last state callers read,
    # and that bwd hands the kernel exactly the states its forward kept (keep), x's states 1024
    # steps apart in pairs (recompute, real A: the kernel recomputes the rest), or makes it
    # recompute them with a forward scan (recompute, complex A)
    from selective_scan import cuda_compat

    kernel = StandInKernel.install(monkeypatch)
    monkeypatch.setattr(cuda_compat, "_compiled", lambda u, A: True)
    monkeypatch.setenv("MAMBA_KERNELS_SCAN_STATES", form)
    args = scan_inputs(complex_a=complex_a, L=150)  # 3 states: after 64, 128 and 150 steps
    out, x, out_z = selective_scan_cuda.fwd(*args, True)
    _, last = selective_scan_ref(*args[:6], None, args[7], True, True)
    assert x.shape == (2, 4, 1 if form == "recompute" else 2, 6) and x.dtype == args[2].dtype
    torch.testing.assert_close(x[:, :, -1, 1::2], last, rtol=1e-5, atol=1e-5)
    spaced = form == "recompute" and not complex_a
    layout = (1024, 2, True) if spaced else ()
    _, _, kept = StandInKernel().fwd(*args, True, True, *layout)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    grads = selective_scan_cuda.bwd(*args, dout, x, out, None, True, True)
    assert kernel.fwd_calls == (2 if form == "recompute" and complex_a else 1)
    assert kernel.bwd_layout == ((1024, True) if spaced else (64, False))
    torch.testing.assert_close(kernel.bwd_states, kept, rtol=0, atol=0)
    if spaced:  # x itself, its rows read as the state pairs
        assert kernel.bwd_states.flatten().tolist() == x.flatten().tolist()
    assert len(grads) == 9 and grads[7].shape == args[6].shape
    torch.testing.assert_close(grads[8], out_z)  # recompute_out_z


def test_scan_compiled_path_names_a_bad_x(monkeypatch):
    # recompute on the compiled path hands x to the op unchecked; whatever x the op refuses, or
    # a non-tensor, is still named as x
    from selective_scan import cuda_compat

    StandInKernel.install(monkeypatch)
    monkeypatch.setattr(cuda_compat, "_compiled", lambda u, A: True)
    monkeypatch.setenv("MAMBA_KERNELS_SCAN_STATES", "recompute")
    args = scan_inputs(L=150)
    out, x, _ = selective_scan_cuda.fwd(*args, True)
    dout = torch.ones_like(out)
    for bad in (x[..., :2], x.double(), "x", x.unsqueeze(0)):
        with pytest.raises(ValueError, match="x must be the second output of selective_scan_cuda.fwd"):
            selective_scan_cuda.bwd(*args, dout, bad, out, None, True, False)
    selective_scan_cuda.bwd(*args, dout, x, out, None, True, False)  # the right x still goes through


def test_scan_optional_gradients_are_none_and_dz_is_a_view():
    u, delta, A, B, C, _, z, _ = scan_inputs(L=40)
    out, x, _ = selective_scan_cuda.fwd(u, delta, A, B, C, None, z, None, False)
    dxz = torch.full((2, 8, 40), float("nan"))
    dz = dxz[:, 4:]  # a channel view, as mamba_ssm's MambaInnerFn passes
    dout = torch.ones_like(u)
    grads = selective_scan_cuda.bwd(u, delta, A, B, C, None, z, None, dout, x, out, dz, False, False)
    assert grads[5] is None and grads[6] is None and grads[7] is dz
    assert torch.isfinite(dxz[:, 4:]).all() and torch.isnan(dxz[:, :4]).all()


def test_scan_bad_arguments():
    args = scan_inputs(L=20)
    with pytest.raises(TypeError, match="delta_softplus must be a bool"):
        selective_scan_cuda.fwd(*args, "yes")
    with pytest.raises(TypeError):
        selective_scan_cuda.fwd(*args)  # positional contract: 9 arguments
    out, x, _ = selective_scan_cuda.fwd(*args, True)
    dout = torch.ones_like(out)
    with pytest.raises(ValueError, match=r"x must be the second output of selective_scan_cuda.fwd"):
        selective_scan_cuda.bwd(*args, dout, x[..., :2], out, None, True, False)
    with pytest.raises(ValueError, match="dz must have z's shape"):
        selective_scan_cuda.bwd(*args, dout, x, out, torch.empty(2, 4, 3), True, False)
    with pytest.raises(ValueError, match="dout must have u's shape"):
        selective_scan_cuda.bwd(*args, dout[:, :, :5], x, out, None, True, False)
    with pytest.raises(TypeError, match="recompute_out_z must be a bool"):
        selective_scan_cuda.bwd(*args, dout, x, out, None, True, None)
    bad = list(args)
    bad[1] = bad[1][:, :, :-1]
    with pytest.raises(ValueError, match="delta"):
        selective_scan_cuda.fwd(*bad, True)


def conv_inputs(seed=0, width=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 8, 20, generator=g), torch.randn(8, width, generator=g), torch.randn(8, generator=g)


def test_conv_fwd_forms():
    x, w, b = conv_inputs()
    want = causal_conv1d_ref(x, w, b, activation="silu")
    seq_idx = torch.zeros(2, 20, dtype=torch.int32)
    xl = x.transpose(1, 2).contiguous().transpose(1, 2)  # channel-last, which seq_idx needs
    forms = [
        causal_conv1d_cuda.causal_conv1d_fwd(x, w, b, True),
        causal_conv1d_cuda.causal_conv1d_fwd(xl, w, b, seq_idx, True),
        causal_conv1d_cuda.causal_conv1d_fwd(x, w, b, None, None, None, True),
    ]
    out = torch.full_like(x, float("nan"))
    assert causal_conv1d_cuda.causal_conv1d_fwd(x, w, b, None, None, out, None, True) is None
    for got in forms + [out]:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_conv_bwd_forms():
    x, w, b = conv_inputs(1)
    dout = torch.randn_like(x)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    causal_conv1d_ref(*leaves, activation="silu").backward(dout)
    want = [t.grad for t in leaves]
    dx = torch.empty_like(x)
    r6 = causal_conv1d_cuda.causal_conv1d_bwd(x, w, b, dout, dx, True)
    r7 = causal_conv1d_cuda.causal_conv1d_bwd(x, w, b, dout, None, None, True)
    r10 = causal_conv1d_cuda.causal_conv1d_bwd(x, w, b, dout, None, None, None, None, False, True)
    assert r6[0] is dx and len(r6) == len(r7) == 3 and len(r10) == 4 and r10[3] is None
    for r in (r6, r7, r10):
        for got, exp in zip(r, want):
            torch.testing.assert_close(got, exp, rtol=1e-4, atol=1e-4)
    # 12 arguments (1.5.1 on): dx written, the weight and bias gradients added into fp32 buffers
    dx12, dw, db = torch.empty_like(x), torch.ones(8, 4), torch.ones(8)
    args12 = (x, w, b, dout, None, None, None, dx12, dw, db, None, True)
    assert causal_conv1d_cuda.causal_conv1d_bwd(*args12) is None
    torch.testing.assert_close(dx12, want[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dw, want[1] + 1, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(db, want[2] + 1, rtol=1e-4, atol=1e-4)
    assert causal_conv1d_cuda.causal_conv1d_bwd(x, w, None, dout, dx, True)[2] is None


def test_conv_update_forms():
    x, w, b = conv_inputs(2)
    g = torch.Generator().manual_seed(3)
    state = torch.randn(2, 8, 4, generator=g)
    want_state = state.clone()
    want = causal_conv1d_update_ref(x[:, :, :1], want_state, w, b, "silu")
    for form in range(4):
        s = state.clone()
        step = x[:, :, 0] if form == 0 else x[:, :, :1]  # <= 1.3 took (batch, dim)
        extra = [(), (None,), (None, None)][form] if form < 3 else ()
        if form == 3:
            out = torch.empty_like(step)
            assert causal_conv1d_cuda.causal_conv1d_update(step, s, w, b, out, True, None, None) is None
        else:
            out = causal_conv1d_cuda.causal_conv1d_update(step, s, w, b, True, *extra)
        assert out.shape == step.shape
        torch.testing.assert_close(out.reshape(want.shape), want, rtol=1e-5, atol=1e-5)
        assert torch.equal(s, want_state)


def test_conv_bad_arities_and_arguments():
    x, w, b = conv_inputs()
    with pytest.raises(TypeError, match=r"causal_conv1d_fwd takes one of .*got 3 arguments"):
        causal_conv1d_cuda.causal_conv1d_fwd(x, w, b)
    with pytest.raises(TypeError, match=r"causal_conv1d_bwd takes one of .*12: \(x, weight"):
        causal_conv1d_cuda.causal_conv1d_bwd(x, w)
    with pytest.raises(TypeError, match=r"causal_conv1d_update takes one of .*got 9"):
        causal_conv1d_cuda.causal_conv1d_update(*([None] * 9))
    with pytest.raises(ValueError, match="out must be a tensor of shape"):
        causal_conv1d_cuda.causal_conv1d_fwd(x, w, b, None, None, torch.empty(3), None, True)
    with pytest.raises(ValueError, match="dx must be a tensor in the 12-argument form"):
        causal_conv1d_cuda.causal_conv1d_bwd(x, w, b, x, None, None, None, None, w, b, None, True)
    with pytest.raises(Exception, match="width"):  # the functional API's own validation
        causal_conv1d_cuda.causal_conv1d_fwd(x, torch.randn(8, 9), b, True)


def _mamba_ssm(tmp_path_factory):
    """mamba_ssm's ops package from its sdist (its Python only; the package __init__, which pulls
    in every model and huggingface_hub, is skipped). Where Triton cannot be imported, its
    Triton modules come from ours (selective_scan.for_mamba_ssm) for the time of the import."""
    pytest.importorskip("einops")
    src = peer_sources.mamba_ssm_src_or_skip(tmp_path_factory) / "mamba_ssm"
    saved = {k: v for k, v in sys.modules.items() if k == "mamba_ssm" or k.startswith("mamba_ssm.")}
    pkg = types.ModuleType("mamba_ssm")
    pkg.__path__ = [str(src)]
    sys.modules["mamba_ssm"] = pkg
    serve = importlib.util.find_spec("triton") is None and not for_mamba_ssm.installed()
    if serve:
        for_mamba_ssm.install()
    try:
        import mamba_ssm.ops.selective_scan_interface as ssi
    finally:
        if serve:
            for_mamba_ssm.uninstall()
        for k in [k for k in sys.modules if k == "mamba_ssm" or k.startswith("mamba_ssm.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    return ssi


@pytest.fixture(scope="module")
def mamba_ssm_ops(tmp_path_factory):
    return _mamba_ssm(tmp_path_factory)


def test_mamba_ssm_runs_on_the_compat_modules(mamba_ssm_ops):
    ssi = mamba_ssm_ops
    assert ssi.selective_scan_cuda is selective_scan_cuda
    assert ssi.causal_conv1d_fwd_function is not None  # our cpp_functions: its fast path is on
    # mamba_ssm's own SelectiveScanFn on our module, against its own reference
    args = scan_inputs(complex_a=False, z=True, variable=True, L=130, seed=4)
    leaves = [t.clone().requires_grad_() for t in args]
    out, last = ssi.selective_scan_fn(*leaves, delta_softplus=True, return_last_state=True)
    want, want_last = ssi.selective_scan_ref(*args, delta_softplus=True, return_last_state=True)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(last, want_last, rtol=1e-4, atol=1e-4)
    out.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves)


@pytest.mark.parametrize("fixed_b", [False, True])
def test_mamba_ssm_mamba_inner_fn_equals_ours(mamba_ssm_ops, fixed_b):
    # the same composition over the same scan: outputs bit for bit, gradients to float32 rounding
    g = torch.Generator().manual_seed(11)
    batch, d, L, n, rank = 2, 32, 40, 4, 6
    args = [
        torch.randn(batch, 2 * d, L, generator=g),
        torch.randn(d, 1, 3, generator=g),
        torch.randn(d, generator=g),
        torch.randn(rank + n * (1 if fixed_b else 2), d, generator=g),
        torch.randn(d, rank, generator=g),
        torch.randn(d // 2, d, generator=g),
        None,
        -0.5 * torch.rand(d, n, generator=g),
        torch.randn(d, n, generator=g) if fixed_b else None,
        None,
        torch.randn(d, generator=g),
        0.5 * torch.rand(d, generator=g),
    ]
    dout = torch.randn(batch, L, d // 2, generator=g)
    results = []
    for fn in (mamba_inner_fn, mamba_ssm_ops.mamba_inner_fn):
        leaves = [t.clone().requires_grad_() if t is not None else None for t in args]
        out = fn(*leaves)
        out.backward(dout)
        results.append((out.detach(), [t.grad for t in leaves if t is not None]))
    (ours, our_grads), (theirs, their_grads) = results
    assert torch.equal(ours, theirs)
    for got, exp in zip(our_grads, their_grads):
        torch.testing.assert_close(got, exp, rtol=1e-4, atol=1e-5 * exp.abs().max().item())


# ---- the C entry (csrc/selective_scan/{classic,stable}/compat_entry.cpp; its GPU tests:
# tests/test_compat_entry_cuda.py): what Python hands it and when it is armed

def test_entry_takes_only_the_spellings_that_mean_the_recompute_kernels():
    from selective_scan import cuda_compat

    rules = dict(cuda_compat._entry_env_rules())
    assert rules == {"MAMBA_KERNELS_BACKEND": ("auto", "cuda", ""),
                     "MAMBA_KERNELS_SCAN_STATES": ("auto", "recompute", "")}


def test_entry_is_not_armed_without_an_extension_that_has_one(monkeypatch):
    from mamba_kernels.runtime import dispatch
    from selective_scan import cuda_compat

    monkeypatch.setattr(cuda_compat, "_entry_tried", False)
    monkeypatch.setattr(dispatch, "ready_module", lambda kernel: None)  # first use not checked yet
    cuda_compat._arm_entry()
    assert not cuda_compat._entry_tried  # tried again at a later call
    assert selective_scan_cuda.fwd is cuda_compat.fwd and selective_scan_cuda.bwd is cuda_compat.bwd
    bare = types.ModuleType("selective_scan._cuda")  # a build without an entry in its module
    monkeypatch.setattr(dispatch, "ready_module", lambda kernel: bare)
    cuda_compat._arm_entry()
    assert cuda_compat._entry_tried  # for good
    assert selective_scan_cuda.fwd is cuda_compat.fwd and selective_scan_cuda.bwd is cuda_compat.bwd


def test_a_stable_entry_is_not_armed_on_a_torch_without_dlpacks_c_exchange_api(monkeypatch):
    from mamba_kernels.runtime import dispatch
    from selective_scan import cuda_compat

    armed = []

    def stable_arm(*args):  # as the stable module's compat_arm: no exchange API, no entry
        if args[6] is None:
            raise ValueError("PyCapsule_GetPointer called with invalid PyCapsule object")
        armed.append(args)

    stable = types.ModuleType("selective_scan._cuda")
    stable.compat_arm = stable_arm
    monkeypatch.setattr(dispatch, "ready_module", lambda kernel: stable)
    monkeypatch.delattr(torch.Tensor, "__dlpack_c_exchange_api__", raising=False)
    monkeypatch.setattr(cuda_compat, "_entry_tried", False)
    cuda_compat._arm_entry()
    assert cuda_compat._entry_tried and not armed
    assert selective_scan_cuda.fwd is cuda_compat.fwd and selective_scan_cuda.bwd is cuda_compat.bwd


def test_entry_arm_arguments():
    from selective_scan import cuda_compat

    args = cuda_compat._entry_arm_args(cuda_compat.fwd, cuda_compat.bwd)
    assert args[:2] == (cuda_compat.fwd, cuda_compat.bwd) and args[2] == cuda_compat._entry_env_rules()
    assert args[7] == (torch.Tensor, torch.nn.Parameter, torch.Tensor.is_neg)
    assert args[6] is getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
    assert args[8] is None or args[8]() == 0  # no dispatch mode active here
