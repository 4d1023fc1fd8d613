"""The error surface of selective_scan_fn / selective_scan_ref: every rule gives a clear
ValueError or TypeError naming the argument, the rule and the value."""

from __future__ import annotations

import pytest
import torch

from selective_scan import selective_scan_fn, selective_scan_ref

F32, F16 = torch.float32, torch.float16


def base(batch=2, dim=4, n=3, L=7):
    return dict(
        u=torch.randn(batch, dim, L),
        delta=torch.rand(batch, dim, L),
        A=-torch.rand(dim, n),
        B=torch.randn(batch, n, L),
        C=torch.randn(batch, n, L),
        D=torch.randn(dim),
        z=torch.randn(batch, dim, L),
        delta_bias=torch.rand(dim),
    )


CASES = [
    ("u 2-D", dict(u=torch.randn(4, 7)), ValueError, r"u must be 3-D .* got 2-D \(4, 7\)"),
    ("u int", dict(u=torch.ones(2, 4, 7, dtype=torch.int32)), TypeError, "u must be float32.*int32"),
    ("u list", dict(u=[[1.0]]), TypeError, "u must be a torch.Tensor, got list"),
    (
        "delta shape",
        dict(delta=torch.rand(2, 4, 6)),
        ValueError,
        r"delta must have shape \(2, 4, 7\).*\(2, 4, 6\)",
    ),
    ("delta dtype", dict(delta=torch.rand(2, 4, 7, dtype=F16)), TypeError, "delta must have u's dtype"),
    (
        "A shape",
        dict(A=-torch.rand(5, 3)),
        ValueError,
        r"A must have shape \(dim, dstate\) with dim=4.*\(5, 3\)",
    ),
    ("A half", dict(A=-torch.rand(4, 3, dtype=F16)), TypeError, "A must be float32 or complex64.*float16"),
    ("A double with fp32 u", dict(A=-torch.rand(4, 3, dtype=torch.float64)), TypeError, "A must be float32"),
    (
        "dstate 257",
        dict(A=-torch.rand(4, 257), B=torch.randn(4, 257), C=torch.randn(4, 257)),
        ValueError,
        "dstate .* between 1 and 256, got 257",
    ),
    ("B 5-D", dict(B=torch.randn(2, 1, 1, 3, 7)), ValueError, "B must be 2-D .* got 5-D"),
    ("B length", dict(B=torch.randn(2, 3, 8)), ValueError, r"B must have shape \(2, 3, 7\)"),
    ("fixed B shape", dict(B=torch.randn(4, 2)), ValueError, r"B must have shape \(4, 3\)"),
    (
        "fixed B dtype",
        dict(B=torch.randn(4, 3, dtype=torch.float64)),
        TypeError,
        "fixed B must have A's dtype",
    ),
    (
        "variable C dtype",
        dict(C=torch.randn(2, 3, 7, dtype=F16)),
        TypeError,
        "variable C must have u's dtype",
    ),
    (
        "groups mismatch",
        dict(B=torch.randn(2, 2, 3, 7), C=torch.randn(2, 1, 3, 7)),
        ValueError,
        "same ngroups.*2.*1",
    ),
    (
        "dim % groups",
        dict(B=torch.randn(2, 3, 3, 7), C=torch.randn(2, 3, 3, 7)),
        ValueError,
        "dim must be divisible by ngroups: dim=4, ngroups=3",
    ),
    (
        "complex B length",
        dict(A=torch.complex(-torch.rand(4, 3), torch.rand(4, 3))),
        ValueError,
        r"B must have shape \(2, 3, 14\) \(last dim 2L",
    ),
    ("D dtype", dict(D=torch.randn(4, dtype=F16)), TypeError, "D must be torch.float32.*float16"),
    ("D shape", dict(D=torch.randn(5)), ValueError, r"D must have shape \(4,\)"),
    (
        "delta_bias shape",
        dict(delta_bias=torch.randn(2, 4)),
        ValueError,
        r"delta_bias must have shape \(4,\)",
    ),
    ("z shape", dict(z=torch.randn(2, 4, 8)), ValueError, r"z must have shape \(2, 4, 7\)"),
    ("z dtype", dict(z=torch.randn(2, 4, 7, dtype=F16)), TypeError, "z must have u's dtype"),
    (
        "dstate 0",
        dict(A=-torch.rand(4, 0), B=torch.randn(2, 0, 7), C=torch.randn(2, 0, 7)),
        ValueError,
        r"dstate \(A.shape\[1\]\) must be between 1 and 256, got 0",
    ),
    (
        "mixed devices",
        dict(D=torch.randn(4, device="meta")),
        ValueError,
        "one device: u is on cpu but D is on meta",
    ),
]


@pytest.mark.parametrize("fn", [selective_scan_fn, selective_scan_ref], ids=["fn", "ref"])
@pytest.mark.parametrize("label,change,exc,match", CASES, ids=[c[0] for c in CASES])
def test_error(fn, label, change, exc, match):
    kwargs = base()
    kwargs.update(change)
    if fn is selective_scan_ref and label == "A double with fp32 u":
        fn(**kwargs)  # the reference accepts double-precision A
        return
    with pytest.raises(exc, match=match):
        fn(**kwargs)


def test_valid_base_runs():
    out = selective_scan_fn(**base())
    assert out.shape == (2, 4, 7)


@pytest.mark.parametrize("fn", [selective_scan_fn, selective_scan_ref], ids=["fn", "ref"])
@pytest.mark.parametrize("flag", ["delta_softplus", "return_last_state"])
@pytest.mark.parametrize("value", ["no", 0, 1.0, None, torch.tensor(True)], ids=repr)
def test_flags_must_be_bools(fn, flag, value):
    # "no" would otherwise be taken as True
    rule = rf"{flag} must be a bool \(True or False\), got {type(value).__name__}"
    with pytest.raises(TypeError, match=rule):
        fn(**base(), **{flag: value})


@pytest.mark.parametrize("fn", [selective_scan_fn, selective_scan_ref], ids=["fn", "ref"])
def test_numpy_bools_are_bools(fn):
    np = pytest.importorskip("numpy")
    kwargs = base()
    out, last = fn(**kwargs, delta_softplus=np.bool_(True), return_last_state=np.bool_(True))
    want, want_last = fn(**kwargs, delta_softplus=True, return_last_state=True)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(last, want_last)


@pytest.mark.parametrize("fn", [selective_scan_fn, selective_scan_ref], ids=["fn", "ref"])
def test_dim_zero_gives_empty_results(fn):
    kwargs = base(dim=0)
    out, last = fn(**kwargs, delta_softplus=True, return_last_state=True)
    assert out.shape == (2, 0, 7) and last.shape == (2, 0, 3)
