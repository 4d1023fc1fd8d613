"""The PyTorch selective scan (selective_scan/chunked.py, pytorch_scan.py) on CPU: agreement with
the per-step loop, causality of NaN and Inf, A = -inf, block splits and memory.

"Exactly as the loop" is checked three ways: the outputs before the step holding a non-finite
value are bitwise those of the clean input; NaN and Inf sit exactly where the loop
(``selective_scan_ref``, float64) puts them; finite values agree to float64 rounding.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from selective_scan import chunked, pytorch_scan, selective_scan_fn, selective_scan_ref

F64, C128 = torch.float64, torch.complex128
NAN, INF = float("nan"), float("inf")
L_MAIN = 700  # > 32 chunks of 16: two levels of chunking, with a partial chunk at each level


def loop(m, x, h0=None, reverse=False):
    """The recurrence step by step, for chunked.scan_."""
    h = torch.zeros_like(x[0]) if h0 is None else h0
    out = torch.empty_like(x)
    for i in range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0]):
        h = m[i] * h + x[i]
        out[i] = h
    return out


def assert_like_loop(got, want, rtol=1e-9, atol=1e-12):
    """NaN and Inf (with sign) exactly where ``want`` has them; finite values close."""
    assert torch.equal(torch.isnan(got), torch.isnan(want)), "NaN pattern differs"
    inf = torch.isinf(want)
    assert torch.equal(torch.isinf(got), inf), "Inf pattern differs"
    assert torch.equal(got[inf], want[inf]), "Inf signs differ"
    fin = torch.isfinite(want)
    torch.testing.assert_close(got[fin], want[fin], rtol=rtol, atol=atol)


def boundaries(L):
    """Steps around the chunk boundaries of a scan over L steps, plus the ends."""
    r, c = L % chunked.CHUNK, chunked.CHUNK
    return sorted({0, 1, max(r - 1, 0), r, r + c - 1, r + c, L // 2, L - 2, L - 1})


# ---- chunked.scan_ against the step-by-step recurrence ----


@pytest.mark.parametrize("L", [1, 2, 31, 32, 33, 34, 47, 512, 529, 1000])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [F64, C128])
def test_scan_matches_loop(L, reverse, dtype):
    g = torch.Generator().manual_seed(L)
    m = torch.rand(L, 3, 5, generator=g, dtype=F64).to(dtype)
    x = torch.randn(L, 3, 5, generator=g, dtype=F64).to(dtype)
    h0 = None if L % 2 else torch.randn(3, 5, generator=g, dtype=F64).to(dtype)
    want = loop(m, x, h0, reverse)
    got = x.clone()
    last = chunked.scan_(m, got, h0, reverse)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(last, want[0] if reverse else want[-1])


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("where,value", [("x", NAN), ("x", INF), ("x", -INF), ("m", NAN), ("m", 0.0)])
def test_scan_nonfinite_is_causal(where, value, reverse):
    L = 600
    for t in boundaries(L):
        g = torch.Generator().manual_seed(t)
        m = 0.3 + 0.6 * torch.rand(L, 4, generator=g, dtype=F64)
        x = torch.randn(L, 4, generator=g, dtype=F64)
        clean = x.clone()
        chunked.scan_(m, clean, reverse=reverse)
        (m if where == "m" else x)[t, 1] = value
        got = x.clone()
        chunked.scan_(m, got, reverse=reverse)
        before = slice(t + 1, None) if reverse else slice(0, t)
        assert torch.equal(got[before], clean[before]), f"step {t} leaked into earlier steps"
        assert_like_loop(got, loop(m, x, reverse=reverse))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_scan_infinite_state_survives_underflowing_chunks(dtype):
    # decays whose chunk products underflow to 0: the loop keeps +-inf (inf * tiny = inf), and
    # turns it into NaN only at an exact 0 decay (0 * inf)
    L = 400
    small = 1e-5 if dtype == torch.float32 else 1e-30
    m = torch.full((L, 3), small, dtype=dtype)
    x = torch.randn(L, 3, dtype=dtype)
    x[3, 0], x[3, 1], x[3, 2] = INF, -INF, INF
    m[200, 2] = 0.0
    got = x.clone()
    chunked.scan_(m, got)
    want = loop(m, x)
    assert torch.isinf(want[-1, :2]).all() and torch.isnan(want[-1, 2])
    assert_like_loop(got, want, rtol=1e-5, atol=1e-30)


@pytest.mark.parametrize("L", [1, 31, 32, 47, 529])
def test_resume_recomputes_the_states_bit_for_bit(L):
    g = torch.Generator().manual_seed(L)
    m = torch.rand(L, 3, 4, generator=g, dtype=F64)
    x = torch.randn(L, 3, 4, generator=g, dtype=F64)
    ends = torch.empty(chunked.checkpoint_count(L), 3, 4, dtype=F64)
    want = x.clone()
    chunked.scan_(m, want, ends=ends)
    got = x.clone()
    chunked.resume_(m, got, ends)
    assert torch.equal(got, want)


def test_scan_rejects_mismatched_multipliers():
    with pytest.raises(ValueError, match=r"m must have x's shape \(4, 2\), got \(4, 1\)"):
        chunked.scan_(torch.ones(4, 1), torch.ones(4, 2))


# ---- selective_scan_fn: non-finite inputs, A = -inf ----


def make(batch=2, dim=3, n=4, L=L_MAIN, seed=0, complex_a=False, groups=1):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=F64)

    A = -0.2 - torch.rand(dim, n, generator=g, dtype=F64)
    if complex_a:
        A = torch.complex(A, rnd(dim, n))
    Lbc = 2 * L if complex_a else L
    bc = (batch, n, Lbc) if groups == 1 else (batch, groups, n, Lbc)
    return dict(
        u=rnd(batch, dim, L),
        delta=rnd(batch, dim, L),
        A=A,
        B=rnd(*bc),
        C=rnd(*bc),
        D=rnd(dim),
        z=rnd(batch, dim, L),
        delta_bias=0.5 * torch.rand(dim, generator=g, dtype=F64),
    )


POISON = {  # where a value goes at step t: u and delta of (batch 0, channel 1), B/C of state 2
    "u": lambda kw, t: (kw["u"], (0, 1, t)),
    "delta": lambda kw, t: (kw["delta"], (0, 1, t)),
    "B": lambda kw, t: (kw["B"], (0, 2, t)),
    "C": lambda kw, t: (kw["C"], (0, 2, t)),
}


@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", list(POISON))
def test_nonfinite_input_affects_only_its_step_and_later(name, value):
    kw = make()
    clean, _ = selective_scan_fn(**kw, delta_softplus=True, return_last_state=True)
    for t in boundaries(L_MAIN):
        poisoned = {k: v.clone() for k, v in kw.items()}
        tensor, index = POISON[name](poisoned, t)
        tensor[index] = value
        out, last = selective_scan_fn(**poisoned, delta_softplus=True, return_last_state=True)
        assert torch.equal(out[..., :t], clean[..., :t]), f"{name}[{t}] leaked into earlier steps"
        want, want_last = selective_scan_ref(**poisoned, delta_softplus=True, return_last_state=True)
        assert_like_loop(out, want)
        assert_like_loop(last, want_last)
        if not (name == "delta" and value == -INF):  # softplus(-inf) = 0: a step that does nothing
            assert not torch.isfinite(out[0, :, t:]).all(), "the poisoned step must show"


def test_nan_with_complex_a_affects_only_its_step_and_later():
    kw = make(complex_a=True, L=300)
    clean = selective_scan_fn(**kw, delta_softplus=True)
    for t in (0, 17, 150, 299):
        poisoned = {k: v.clone() for k, v in kw.items()}
        poisoned["u"][1, 0, t] = NAN
        out = selective_scan_fn(**poisoned, delta_softplus=True)
        assert torch.equal(out[..., :t], clean[..., :t])
        assert torch.isnan(out[1, 0, t:]).all()
        assert_like_loop(out, selective_scan_ref(**poisoned, delta_softplus=True))


def test_a_minus_inf_decays_to_zero_like_the_loop():
    kw = make()
    kw["A"][0, :] = -INF  # a whole channel, and single states of others
    kw["A"][2, 1] = -INF
    out, last = selective_scan_fn(**kw, delta_softplus=True, return_last_state=True)
    want, want_last = selective_scan_ref(**kw, delta_softplus=True, return_last_state=True)
    assert torch.isfinite(want).all()
    assert_like_loop(out, want)
    assert_like_loop(last, want_last)


def test_a_minus_inf_with_dt_zero_is_nan_from_that_step_like_the_loop():
    # dt = softplus(-inf) = 0 and A = -inf: dt * A = NaN in the loop too, from that step on
    kw = make()
    kw["A"][1, 3] = -INF
    kw["delta"][0, 1, 400] = -INF
    out = selective_scan_fn(**kw, delta_softplus=True)
    want = selective_scan_ref(**kw, delta_softplus=True)
    assert torch.isnan(want[0, 1, 400:]).all() and torch.isfinite(want[0, 1, :400]).all()
    assert_like_loop(out, want)


def test_a_from_overflowing_a_log_in_float32():
    # -exp(A_log) overflows to -inf in float32; the loop (in float32 too) stays finite
    kw = {k: v.float() for k, v in make(L=300).items()}
    A_log = torch.log(-kw["A"])
    A_log[0, 0] = A_log[2, 3] = 100.0
    kw["A"] = -torch.exp(A_log)
    assert torch.isinf(kw["A"]).sum() == 2
    out = selective_scan_fn(**kw, delta_softplus=True)
    want = selective_scan_ref(**kw, delta_softplus=True)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


# ---- gradients ----


def grads(fn, kw, dout):
    leaves = {k: v.detach().clone().requires_grad_() for k, v in kw.items()}
    out = fn(**leaves, delta_softplus=True)
    out.backward(dout)
    return {k: v.grad for k, v in leaves.items()}


def test_gradients_with_a_minus_inf_match_the_loop():
    kw = make(L=200)
    kw["A"][0, :] = -INF
    kw["A"][2, 1] = -INF
    dout = torch.randn(kw["u"].shape, dtype=F64, generator=torch.Generator().manual_seed(3))
    got, want = grads(selective_scan_fn, kw, dout), grads(selective_scan_ref, kw, dout)
    # the loop's ddelta (and so ddelta_bias) is NaN on those channels (d exp(dt A) / d dt =
    # A exp(dt A) = -inf * 0); every other gradient is finite
    assert torch.isnan(want["delta"][:, [0, 2]]).all() and torch.isfinite(want["delta"][:, 1]).all()
    assert all(torch.isfinite(want[name]).all() for name in kw if name not in ("delta", "delta_bias"))
    for name in kw:
        assert_like_loop(got[name], want[name], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("t", [0, 15, 100, 199])
def test_nan_in_dout_reaches_only_its_step_and_earlier(t):
    kw = make(L=200)
    dout = torch.randn(kw["u"].shape, dtype=F64, generator=torch.Generator().manual_seed(4))
    clean = grads(selective_scan_fn, kw, dout)
    dout[0, 2, t] = NAN
    got, want = grads(selective_scan_fn, kw, dout), grads(selective_scan_ref, kw, dout)
    for name in ("u", "delta", "z", "B", "C"):  # per-step gradients
        assert torch.equal(got[name][..., t + 1 :], clean[name][..., t + 1 :]), name
    for name in kw:
        assert_like_loop(got[name], want[name], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name", ["u", "B", "C"])
def test_gradients_with_a_nan_input_match_the_loop(name):
    # the loop's autograd leaves some gradients finite on either side of the NaN: so do we
    kw = make(L=200)
    tensor, index = POISON[name](kw, 120)
    tensor[index] = NAN
    dout = torch.randn(kw["u"].shape, dtype=F64, generator=torch.Generator().manual_seed(5))
    got, want = grads(selective_scan_fn, kw, dout), grads(selective_scan_ref, kw, dout)
    for key in kw:
        assert_like_loop(got[key], want[key], rtol=1e-8, atol=1e-10)


# ---- lengths, blocks, groups ----


@pytest.mark.parametrize("L", [1, 2, 33, 34, 529])
@pytest.mark.parametrize("complex_a", [False, True])
def test_float64_forward_and_gradients_match_the_loop(L, complex_a):
    kw = make(L=L, seed=L, complex_a=complex_a)
    out, last = selective_scan_fn(**kw, delta_softplus=True, return_last_state=True)
    want, want_last = selective_scan_ref(**kw, delta_softplus=True, return_last_state=True)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(last, want_last, rtol=1e-10, atol=1e-12)
    dout = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(6))
    got, ref = grads(selective_scan_fn, kw, dout), grads(selective_scan_ref, kw, dout)
    for name in kw:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-9, atol=1e-10, msg=name)


@pytest.mark.parametrize(
    "batch,dim,groups,limit",
    [(3, 8, 1, 2 * 4 * 50), (3, 8, 2, 3 * 4 * 50), (2, 6, 2, 4 * 4 * 50), (4, 4, 1, 8 * 4 * 50)],
    ids=["channel-split", "groups-split", "uneven-split", "batches-together"],
)
def test_blocks_cover_the_problem(monkeypatch, batch, dim, groups, limit):
    # small buffers force several blocks: channel pieces, groups, several batches per block
    monkeypatch.setattr(pytorch_scan, "CPU_BLOCK_ELEMENTS", limit)
    kw = make(batch=batch, dim=dim, L=50, groups=groups, seed=dim)
    p = pytorch_scan.make_problem(*kw.values(), True, groups)
    assert len(list(pytorch_scan._blocks(p, limit))) > groups
    out, last = selective_scan_fn(**kw, delta_softplus=True, return_last_state=True)
    want, want_last = selective_scan_ref(**kw, delta_softplus=True, return_last_state=True)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(last, want_last, rtol=1e-10, atol=1e-12)
    dout = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(7))
    got, ref = grads(selective_scan_fn, kw, dout), grads(selective_scan_ref, kw, dout)
    for name in kw:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-9, atol=1e-10, msg=name)


@pytest.mark.parametrize("complex_a", [False, True])
def test_backward_from_checkpoints_and_y_matches(monkeypatch, complex_a):
    # the forward's chunk-end states (taken with other blocks than the backward's) and its
    # un-gated output stand in for their recomputation; NaN stays causal through them
    monkeypatch.setattr(pytorch_scan, "CPU_BLOCK_ELEMENTS", 2 * 4 * 300)
    monkeypatch.setattr(pytorch_scan, "MIN_BLOCK_ELEMENTS", 1)
    kw = make(batch=2, dim=6, L=300, seed=9, complex_a=complex_a)
    kw["u"][1, 2, 140] = NAN
    p = pytorch_scan.make_problem(*kw.values(), True, 1)
    out, out_z, last, ckpt = pytorch_scan.forward(p, True, checkpoints=True)
    assert ckpt.shape == (chunked.checkpoint_count(300), 2, 6, 4)
    want_out = selective_scan_ref(**kw, delta_softplus=True)
    assert_like_loop(out_z, want_out)
    dout = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(8))
    got = pytorch_scan.backward(p, dout, checkpoints=ckpt, y=out, recompute_out_z=True)
    want = pytorch_scan.backward(p, dout, recompute_out_z=True)
    torch.testing.assert_close(got[8], out_z, rtol=0, atol=0, equal_nan=True)
    assert torch.isnan(want[1]).any() and torch.isfinite(want[1]).any()  # ddelta: NaN from step 140
    for name, a, b in zip(("du", "ddelta", "dA", "dB", "dC", "dD", "ddelta_bias", "dz"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, equal_nan=True, msg=name)


def test_every_block_is_visited_once():
    kw = make(batch=3, dim=10, L=40, groups=2)
    p = pytorch_scan.make_problem(*kw.values(), True, 2)
    for limit in (1, 4 * 40 * 3, 4 * 40 * 7, 10**9):
        seen = torch.zeros(3, 10, dtype=torch.int64)
        for bs, ds, g in pytorch_scan._blocks(p, limit):
            assert ds.start // 5 == g == (ds.stop - 1) // 5  # within one group
            seen[bs, ds] += 1
        assert (seen == 1).all(), limit


# ---- memory: the call's extra memory stays below twice its inputs ----

_MEMORY_PROBE = textwrap.dedent(
    """
    import json, resource
    import torch
    from selective_scan import pytorch_scan, selective_scan_fn
    pytorch_scan.CPU_BLOCK_ELEMENTS = 1 << 40  # only the memory rule bounds the blocks
    torch.set_num_threads(1)

    def inputs(b, d, n, L):
        g = torch.Generator().manual_seed(0)
        return [torch.randn(b, d, L, generator=g), torch.rand(b, d, L, generator=g),
                -torch.rand(d, n, generator=g), torch.randn(b, n, L, generator=g),
                torch.randn(b, n, L, generator=g), torch.randn(d, generator=g),
                torch.randn(b, d, L, generator=g), torch.rand(d, generator=g)]

    small = [a.requires_grad_() for a in inputs(2, 4, 16, 64)]
    selective_scan_fn(*small, delta_softplus=True).sum().backward()  # torch's own set-up
    args = [a.requires_grad_() for a in inputs(2, 128, 16, 4096)]
    dout = torch.randn(2, 128, 4096)
    peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    base = peak()
    with torch.no_grad():
        selective_scan_fn(*args, delta_softplus=True)
    forward = peak() - base
    selective_scan_fn(*args, delta_softplus=True).backward(dout)
    total = peak() - base
    nbytes = sum(a.numel() * a.element_size() for a in args)
    print(json.dumps({"inputs": nbytes, "forward": forward, "forward_backward": total}))
    """
)


def test_extra_memory_within_twice_the_inputs():
    # the peak resident memory of a fresh process over what it held before the call: the extra
    # memory, plus the results (the output; in the backward also one gradient per input)
    res = subprocess.run([sys.executable, "-c", _MEMORY_PROBE], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout.strip().splitlines()[-1])
    out_bytes = 2 * 128 * 4096 * 4
    assert r["forward"] <= 2 * r["inputs"] + out_bytes, r
    assert r["forward_backward"] <= 2 * r["inputs"] + out_bytes + r["inputs"], r


def test_dim_zero_gives_empty_results_and_gradients():
    kw = make(dim=0, L=5)
    leaves = {k: v.requires_grad_() for k, v in kw.items()}
    out, last = selective_scan_fn(**leaves, delta_softplus=True, return_last_state=True)
    assert out.shape == (2, 0, 5) and last.shape == (2, 0, 4)
    out.sum().backward()
    for name, t in leaves.items():
        assert t.grad.shape == t.shape, name
    assert torch.equal(leaves["B"].grad, torch.zeros_like(leaves["B"]))


def test_unused_parameters_combinations_run():
    # the cheap smoke grid of optional arguments on the chunked path (values: test_selective_scan_fn)
    kw = make(L=40)
    for drop in itertools.product([False, True], repeat=3):
        args = dict(kw)
        for key, off in zip(("D", "z", "delta_bias"), drop):
            if off:
                args[key] = None
        out = selective_scan_fn(**args, delta_softplus=True)
        want = selective_scan_ref(**args, delta_softplus=True)
        torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
