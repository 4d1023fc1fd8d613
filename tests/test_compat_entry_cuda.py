"""GPU tests of the C entry for selective_scan_cuda's common case (csrc/selective_scan/classic/
compat_entry.cpp, stable/compat_entry.cpp). Once the compiled path has run, selective_scan_cuda.fwd
and .bwd are that entry's functions (a stable build's on a torch with DLPack's C exchange API):
they give bitwise what the Python functions they stand in for (selective_scan/cuda_compat.py)
give, answer the common case without them, and hand every other call back to them. Skipped
without a GPU."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _strict_backend(monkeypatch):
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "cuda")  # never a silent fallback here


def _armed_module():
    """The loaded extension, after one compiled call (which arms the entry where there is one)."""
    import selective_scan_cuda
    from mamba_kernels.runtime import dispatch

    args = _inputs(40, torch.float32, z=True, seed=9)
    selective_scan_cuda.fwd(*args, True)
    return dispatch.ready_module("selective_scan")


def _binding(module) -> str:
    return json.loads(module.BUILD_INFO)["binding"]


def _inputs(L, dtype, z=True, D=True, bias=True, b3=False, dstate=16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, d = 2, 40

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=g)

    bc_shape = (b, dstate, L) if b3 else (b, 1, dstate, L)
    return [
        rnd(b, d, L).to(dtype),
        (0.3 * torch.rand(b, d, L, device="cuda", generator=g)).to(dtype),
        -0.5 * torch.rand(d, dstate, device="cuda", generator=g) - 0.05,
        rnd(*bc_shape).to(dtype),
        rnd(*bc_shape).to(dtype),
        rnd(d) if D else None,
        rnd(b, d, L).to(dtype) if z else None,
        0.3 * torch.rand(d, device="cuda", generator=g) if bias else None,
    ]


def _same(a, b, what):
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b)):
        same = (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
        assert same, f"{what}[{i}]"


def _has_exchange_api() -> bool:
    return getattr(torch.Tensor, "__dlpack_c_exchange_api__", None) is not None


def test_entry_is_armed_where_the_build_can_read_tensors():
    import selective_scan_cuda
    from selective_scan import cuda_compat

    module = _armed_module()
    if _binding(module) == "classic" or _has_exchange_api():
        assert selective_scan_cuda.fwd is module.compat_fwd and selective_scan_cuda.bwd is module.compat_bwd
    else:  # a stable build on a torch without DLPack's C exchange API
        assert selective_scan_cuda.fwd is cuda_compat.fwd and selective_scan_cuda.bwd is cuda_compat.bwd


def _entry():
    import selective_scan_cuda

    module = _armed_module()
    if _binding(module) == "stable" and not _has_exchange_api():
        pytest.skip("a stable build reads tensors through DLPack's C exchange API, which this torch lacks")
    assert selective_scan_cuda.fwd is module.compat_fwd, "the entry was not armed by a compiled call"
    return module


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("z,D,bias,b3", [(True, True, True, False), (False, True, True, True),
                                         (True, False, False, True), (False, False, True, False)])
@pytest.mark.parametrize("L", [1, 1023, 2500])
@pytest.mark.parametrize("dout_fp32", [False, True])  # fp32: converted to u's dtype (stable: by Python)
def test_entry_gives_what_the_python_functions_give(dtype, z, D, bias, b3, L, dout_fp32):
    from selective_scan import cuda_compat

    entry = _entry()
    args = _inputs(L, dtype, z=z, D=D, bias=bias, b3=b3, seed=L)
    got = entry.compat_fwd(*args, True)
    want = cuda_compat.fwd(*args, True)
    _same(got, want, "fwd")
    out, x = want[:2]
    g = torch.Generator(device="cuda").manual_seed(3)
    dout = torch.randn(args[0].shape, device="cuda", generator=g)
    dout = dout if dout_fp32 else dout.to(dtype)
    for recompute_out_z in (False, True):
        for dz_given in (False, True):
            dzs = [torch.full_like(args[6], float("nan")) if z and dz_given else None for _ in range(2)]
            got = entry.compat_bwd(*args, dout, x, out if z else None, dzs[0], True, recompute_out_z)
            want = cuda_compat.bwd(*args, dout, x, out if z else None, dzs[1], True, recompute_out_z)
            _same(got, want, f"bwd recompute_out_z={recompute_out_z} dz_given={dz_given}")
            if z and dz_given:
                assert got[7] is dzs[0]


def test_entry_hands_other_calls_back(monkeypatch):
    from selective_scan import cuda_compat

    entry = _entry()
    args = _inputs(300, torch.bfloat16, seed=4)
    # keyword arguments, a tensor subclass, another states layout: each the Python function's answer
    _same(entry.compat_fwd(*args, delta_softplus=True), cuda_compat.fwd(*args, True), "keywords")

    class Sub(torch.Tensor):
        pass

    sub = [args[0].as_subclass(Sub)] + args[1:]
    _same(entry.compat_fwd(*sub, True), cuda_compat.fwd(*args, True), "subclass")
    monkeypatch.setenv("MAMBA_KERNELS_SCAN_STATES", "keep")
    kept = entry.compat_fwd(*args, True)
    assert kept[1].shape[2] == 3  # a state every 64 steps, two a row: ceil(ceil(300 / 64) / 2)
    _same(kept, cuda_compat.fwd(*args, True), "keep")
    monkeypatch.setenv("MAMBA_KERNELS_SCAN_STATES", "RECOMPUTE")  # another spelling: parsed in Python
    _same(entry.compat_fwd(*args, True), cuda_compat.fwd(*args, True), "spelling")
    # float64 (the op refuses it: the PyTorch path) and CPU tensors: outside the common case,
    # still the whole contract
    wide = [t.double() if t is not None and t.dtype == torch.bfloat16 else t for t in args]
    _same(entry.compat_fwd(*wide, True), cuda_compat.fwd(*wide, True), "float64")
    # a negative view (x.conj().imag) reads as its values only through the dispatcher: the entry
    # must hand it back, not read the memory under it
    bias = args[7]
    neg = torch.complex(torch.zeros_like(bias), -bias).conj().imag
    assert neg.is_neg() and torch.equal(neg, bias)
    negs = args[:7] + [neg]
    _same(entry.compat_fwd(*negs, True), cuda_compat.fwd(*args, True), "negative view")
    cpu = [t.cpu() if t is not None else None for t in args]
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "auto")
    _same(entry.compat_fwd(*cpu, True), cuda_compat.fwd(*cpu, True), "cpu")


def test_entry_answers_the_common_case_itself():
    # Armed with stand-ins for the Python functions, which record any call handed back: the
    # common case (bf16, z, D, delta_bias, dout in u's dtype, dz given or not) must not reach them.
    from selective_scan import cuda_compat

    entry = _entry()
    handed = []

    def fwd_py(*a, **k):
        handed.append("fwd")
        return cuda_compat.fwd(*a, **k)

    def bwd_py(*a, **k):
        handed.append("bwd")
        return cuda_compat.bwd(*a, **k)

    args = _inputs(1500, torch.bfloat16, seed=8)
    try:
        entry.compat_arm(*cuda_compat._entry_arm_args(fwd_py, bwd_py))
        out, x, out_z = entry.compat_fwd(*args, True)
        dout = torch.randn_like(args[0])
        entry.compat_bwd(*args, dout, x, out, None, True, False)
        entry.compat_bwd(*args, dout, x, out, torch.empty_like(args[6]), True, True)
        assert handed == []
        entry.compat_fwd(*args, delta_softplus=True)  # keywords: handed back
        assert handed == ["fwd"]
    finally:
        entry.compat_arm(*cuda_compat._entry_arm_args(cuda_compat.fwd, cuda_compat.bwd))


def test_entry_names_bad_arguments_like_the_python_functions():
    from selective_scan import cuda_compat

    entry = _entry()
    args = _inputs(64, torch.float32, seed=5)
    bad = list(args)
    bad[1] = bad[1][:, :, :10]  # delta shorter than u
    errors = []
    for fn in (entry.compat_fwd, cuda_compat.fwd):
        with pytest.raises(Exception) as info:
            fn(*bad, True)
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1] and "delta" in errors[0][1]


def test_entry_under_torch_compile():
    import selective_scan_cuda

    entry = _entry()
    args = _inputs(200, torch.bfloat16, seed=6)

    def f(*a):
        return selective_scan_cuda.fwd(*a, True)

    assert selective_scan_cuda.fwd is entry.compat_fwd
    eager = f(*args)
    # one graph: dynamo traces the Python function in the entry's place (the entry itself is a
    # builtin it cannot trace), and that function must reach the same op: every output, x's
    # states included, bitwise (torch 2.11 once traced it to the PyTorch path, whose x holds
    # only the last state: docs/notes/bench-passes.md, eighteenth pass)
    compiled = torch.compile(f, fullgraph=True)(*args)
    assert len(compiled) == len(eager) == 3
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
