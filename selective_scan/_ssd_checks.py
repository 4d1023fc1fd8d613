"""Argument validation for the Mamba-2 SSD functions (``ssd_combined``): every rule is
checked before anything runs, each error naming the argument, the rule and the value seen, in
the scan's wording (``_checks``: ``name rule, got <what broke it>``)."""

from __future__ import annotations

import math
import operator
from typing import Tuple

import torch

from mamba_kernels.runtime import argchecks
from mamba_kernels.runtime.argchecks import dtype_of, error, shape_of

from ._checks import INPUT_DTYPES, require_bool, require_same_device, require_shape, require_tensor

Tensor = torch.Tensor

FLOAT_RULE = "must be float32, float16, bfloat16 or float64"
INDEX_DTYPES = (torch.int32, torch.int64)
INDEX_RULE = "must be int32 or int64"


def require_float(name: str, t: Tensor) -> None:
    argchecks.require_dtype_in(name, t, INPUT_DTYPES, FLOAT_RULE, seen=dtype_of)


def require_index(name: str, t: Tensor) -> None:
    argchecks.require_dtype_in(name, t, INDEX_DTYPES, INDEX_RULE, seen=dtype_of)


def chunk_size_of(chunk_size: object) -> int:
    """chunk_size as an int >= 1 (an int or numpy integer, not a bool)."""
    if isinstance(chunk_size, bool):
        raise error(TypeError, "chunk_size", "must be an int", argchecks.typed_repr(chunk_size))
    try:
        value = operator.index(chunk_size)  # type: ignore[arg-type]
    except TypeError:
        raise error(TypeError, "chunk_size", "must be an int", argchecks.typed_repr(chunk_size)) from None
    if value < 1:
        raise error(ValueError, "chunk_size", "must be >= 1", repr(value))
    return value


def dt_limit_of(dt_limit: object) -> Tuple[float, float]:
    """dt_limit as a pair of floats (lo, hi), lo <= hi, neither NaN."""
    rule = "must be a pair (min, max) of numbers with min <= max"
    if not isinstance(dt_limit, (tuple, list)) or len(dt_limit) != 2:
        raise error(TypeError, "dt_limit", rule, repr(dt_limit))
    for v in dt_limit:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise error(TypeError, "dt_limit", rule, repr(dt_limit))
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise error(ValueError, "dt_limit", rule, repr(dt_limit))
    return lo, hi


def _optional_float(name: str, t: object) -> None:
    require_tensor(name, t, optional=True)
    if t is not None:
        require_float(name, t)  # type: ignore[arg-type]


def check_chunk_scan(
    x: object, dt: object, A: object, B: object, C: object, chunk_size: object,
    D: object = None, z: object = None, dt_bias: object = None, initial_states: object = None,
    seq_idx: object = None, dt_softplus: object = False, dt_limit: object = (0.0, math.inf),
) -> Tuple[int, Tuple[float, float], bool]:
    """Validate mamba_chunk_scan_combined's arguments (cu_seqlens apart: ``check_cu_seqlens``);
    return (chunk_size, dt_limit, dt_softplus) normalised."""
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        require_tensor(name, t)
    for name, t in (("D", D), ("z", z), ("dt_bias", dt_bias), ("initial_states", initial_states)):
        _optional_float(name, t)
    require_tensor("seq_idx", seq_idx, optional=True)
    require_same_device({"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "z": z, "dt_bias": dt_bias,
                         "initial_states": initial_states, "seq_idx": seq_idx})
    assert isinstance(x, Tensor) and isinstance(dt, Tensor) and isinstance(A, Tensor)
    assert isinstance(B, Tensor) and isinstance(C, Tensor)
    if x.dim() != 4:
        rule = "must be 4-D (batch, seqlen, nheads, headdim)"
        raise error(ValueError, "x", rule, f"{x.dim()}-D {shape_of(x)}")
    require_float("x", x)
    batch, seqlen, nheads, headdim = x.shape
    require_shape("dt", dt, (batch, seqlen, nheads), "(batch, seqlen, nheads)")
    require_float("dt", dt)
    require_shape("A", A, (nheads,), "(nheads,)")
    require_float("A", A)
    if B.dim() != 4 or B.shape[:2] != (batch, seqlen):
        rule = f"must have shape (batch, seqlen, ngroups, dstate) with batch={batch}, seqlen={seqlen}"
        raise error(ValueError, "B", rule, shape_of(B))
    require_float("B", B)
    ngroups, dstate = B.shape[2], B.shape[3]
    if ngroups < 1:
        raise error(ValueError, "ngroups (B.shape[2])", "must be >= 1", str(ngroups))
    argchecks.require_dstate("dstate (B.shape[3])", dstate)
    if nheads % ngroups:
        raise error(ValueError, "ngroups (B.shape[2])", f"must divide nheads={nheads}", str(ngroups))
    require_shape("C", C, B.shape, "same as B: (batch, seqlen, ngroups, dstate)")
    require_float("C", C)
    size = chunk_size_of(chunk_size)
    if D is not None:
        assert isinstance(D, Tensor)
        if D.shape != (nheads,) and D.shape != (nheads, headdim):
            rule = f"must have shape (nheads,) = ({nheads},) or (nheads, headdim) = ({nheads}, {headdim})"
            raise error(ValueError, "D", rule, shape_of(D))
    if z is not None:
        require_shape("z", z, x.shape, "same as x: (batch, seqlen, nheads, headdim)")  # type: ignore[arg-type]
    if dt_bias is not None:
        require_shape("dt_bias", dt_bias, (nheads,), "(nheads,)")  # type: ignore[arg-type]
    if initial_states is not None:
        require_shape("initial_states", initial_states, (batch, nheads, headdim, dstate),  # type: ignore[arg-type]
                      "(batch, nheads, headdim, dstate)")
    if seq_idx is not None:
        require_shape("seq_idx", seq_idx, (batch, seqlen), "(batch, seqlen)")  # type: ignore[arg-type]
        require_index("seq_idx", seq_idx)  # type: ignore[arg-type]
    softplus = require_bool("dt_softplus", dt_softplus)
    return size, dt_limit_of(dt_limit), softplus


def check_cu_seqlens(cu_seqlens: object, x: Tensor) -> None:
    """cu_seqlens for the varlen states: 1-D int32/int64 on x's device, starting at 0,
    non-decreasing, ending at seqlen; x's batch must be 1."""
    if cu_seqlens is None:
        raise error(ValueError, "cu_seqlens", "must be given when return_varlen_states is True", "None")
    require_tensor("cu_seqlens", cu_seqlens)
    assert isinstance(cu_seqlens, Tensor)
    require_same_device({"x": x, "cu_seqlens": cu_seqlens})
    require_index("cu_seqlens", cu_seqlens)
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
        raise error(ValueError, "cu_seqlens", "must be 1-D (num_seqs + 1,)", shape_of(cu_seqlens))
    batch, seqlen = x.shape[0], x.shape[1]
    if batch != 1:
        rule = "must have batch 1 with cu_seqlens (the sequences are packed along seqlen)"
        raise error(ValueError, "x", rule, shape_of(x))
    values = cu_seqlens.tolist()
    if values[0] != 0 or values[-1] != seqlen or any(a > b for a, b in zip(values, values[1:])):
        rule = f"must be non-decreasing from 0 to seqlen={seqlen}"
        shown = values if len(values) <= 8 else values[:4] + ["..."] + values[-3:]
        raise error(ValueError, "cu_seqlens", rule, repr(shown))


def check_flags(**flags: object) -> Tuple[bool, ...]:
    """Each flag a bool (numpy's too); returned in order."""
    return tuple(require_bool(name, value) for name, value in flags.items())


def positive_int(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise error(TypeError, name, "must be an int", argchecks.typed_repr(value))
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise error(TypeError, name, "must be an int", argchecks.typed_repr(value)) from None
    if number < 1:
        raise error(ValueError, name, "must be >= 1", repr(number))
    return number


def check_split(
    zxbcdt: object, conv1d_weight: object, conv1d_bias: object, dt_bias: object, A: object, D: object,
    activation: object, rmsnorm_weight: object, rmsnorm_eps: object, outproj_weight: object,
    outproj_bias: object, headdim: object, ngroups: object, nonssm: bool = True,
) -> Tuple[int, int, int, int, int]:
    """Validate mamba_split_conv1d_scan_combined's own arguments (the scan's are checked by
    ``check_chunk_scan`` on the parts); return (nheads, headdim, ngroups, dstate, d_nonssm).
    Without ``nonssm`` (the reference), zxbcdt has no leading non-SSM channels."""
    if activation not in (None, "silu", "swish"):
        rule = 'must be None, "silu" or "swish"'
        raise error(NotImplementedError, "activation", rule, argchecks.typed_repr(activation))
    for name, t in (("zxbcdt", zxbcdt), ("conv1d_weight", conv1d_weight), ("dt_bias", dt_bias), ("A", A),
                    ("D", D)):
        require_tensor(name, t)
    for name, t in (("conv1d_bias", conv1d_bias), ("rmsnorm_weight", rmsnorm_weight),
                    ("outproj_weight", outproj_weight), ("outproj_bias", outproj_bias)):
        _optional_float(name, t)
    require_same_device({"zxbcdt": zxbcdt, "conv1d_weight": conv1d_weight, "conv1d_bias": conv1d_bias,
                         "dt_bias": dt_bias, "A": A, "D": D, "rmsnorm_weight": rmsnorm_weight,
                         "outproj_weight": outproj_weight, "outproj_bias": outproj_bias})
    assert isinstance(zxbcdt, Tensor) and isinstance(conv1d_weight, Tensor) and isinstance(D, Tensor)
    if zxbcdt.dim() != 3:
        raise error(ValueError, "zxbcdt", "must be 3-D (batch, seqlen, channels)", shape_of(zxbcdt))
    require_float("zxbcdt", zxbcdt)
    for name, t in (("conv1d_weight", conv1d_weight), ("dt_bias", dt_bias), ("A", A), ("D", D)):
        require_float(name, t)  # type: ignore[arg-type]
    if D.dim() == 1:
        if headdim is None:
            raise error(ValueError, "headdim", "must be given when D is (nheads,)", "None")
        nheads, hd = D.shape[0], positive_int("headdim", headdim)
    elif D.dim() == 2:
        nheads, hd = D.shape
    else:
        raise error(ValueError, "D", "must be (nheads,) or (nheads, headdim)", shape_of(D))
    groups = positive_int("ngroups", ngroups)
    if nheads % groups:
        raise error(ValueError, "ngroups", f"must divide nheads={nheads}", repr(groups))
    dim = nheads * hd
    if conv1d_weight.dim() != 2:
        raise error(ValueError, "conv1d_weight", "must be 2-D (dim + 2 * ngroups * dstate, width)",
                    shape_of(conv1d_weight))
    conv_dim = conv1d_weight.shape[0]
    if conv_dim <= dim or (conv_dim - dim) % (2 * groups):
        rule = (f"must have dim + 2 * ngroups * dstate rows with dim={dim}, ngroups={groups} and "
                "dstate >= 1")
        raise error(ValueError, "conv1d_weight", rule, shape_of(conv1d_weight))
    dstate = (conv_dim - dim) // (2 * groups)
    channels = zxbcdt.shape[-1]
    extra = channels - 2 * dim - 2 * groups * dstate - nheads
    if extra < 0 or extra % 2 or (extra and not nonssm):
        what = "2 * d_nonssm + " if nonssm else ""
        rule = (f"must have {what}2 * dim + 2 * ngroups * dstate + nheads channels with dim={dim}, "
                f"ngroups={groups}, dstate={dstate}, nheads={nheads}")
        raise error(ValueError, "zxbcdt", rule, shape_of(zxbcdt))
    if conv1d_bias is not None:
        require_shape("conv1d_bias", conv1d_bias, (conv_dim,), "(dim + 2 * ngroups * dstate,)")  # type: ignore
    require_shape("dt_bias", dt_bias, (nheads,), "(nheads,)")  # type: ignore[arg-type]
    require_shape("A", A, (nheads,), "(nheads,)")  # type: ignore[arg-type]
    if rmsnorm_weight is not None:
        require_shape("rmsnorm_weight", rmsnorm_weight, (dim,), "(dim,)")  # type: ignore[arg-type]
    if isinstance(rmsnorm_eps, bool) or not isinstance(rmsnorm_eps, (int, float)):
        raise error(TypeError, "rmsnorm_eps", "must be a number >= 0", repr(rmsnorm_eps))
    if not rmsnorm_eps >= 0:
        raise error(ValueError, "rmsnorm_eps", "must be a number >= 0", repr(rmsnorm_eps))
    d_nonssm = extra // 2
    if outproj_weight is not None:
        assert isinstance(outproj_weight, Tensor)
        if outproj_weight.dim() != 2 or outproj_weight.shape[1] != d_nonssm + dim:
            rule = f"must have shape (out_dim, d_nonssm + dim) with d_nonssm + dim={d_nonssm + dim}"
            raise error(ValueError, "outproj_weight", rule, shape_of(outproj_weight))
        if outproj_bias is not None:
            require_shape("outproj_bias", outproj_bias, (outproj_weight.shape[0],), "(out_dim,)")  # type: ignore
    elif outproj_bias is not None:
        raise error(ValueError, "outproj_bias", "must be None without outproj_weight", shape_of(outproj_bias))
    return nheads, hd, groups, dstate, d_nonssm


def check_selective(
    x: object, dt: object, A: object, B: object, C: object, D: object, z: object, dt_bias: object,
    dt_softplus: object, dt_limit: object,
) -> Tuple[bool, Tuple[float, float]]:
    """Validate ssd_selective_scan's arguments, whose dt, A and dt_bias may also be per (head,
    dim); return (dt_softplus, dt_limit) normalised."""
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        require_tensor(name, t)
    for name, t in (("D", D), ("z", z), ("dt_bias", dt_bias)):
        _optional_float(name, t)
    require_same_device({"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "z": z, "dt_bias": dt_bias})
    assert isinstance(x, Tensor) and isinstance(dt, Tensor) and isinstance(A, Tensor)
    assert isinstance(B, Tensor) and isinstance(C, Tensor)
    if x.dim() != 4:
        raise error(ValueError, "x", "must be 4-D (batch, seqlen, nheads, headdim)", shape_of(x))
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        require_float(name, t)
    batch, seqlen, nheads, headdim = x.shape
    if dt.shape != (batch, seqlen, nheads) and dt.shape != x.shape:
        raise error(ValueError, "dt", "must be (batch, seqlen, nheads) or x's shape", shape_of(dt))
    if B.dim() != 4 or B.shape[:2] != (batch, seqlen) or B.shape[2] < 1 or nheads % B.shape[2]:
        rule = "must be (batch, seqlen, ngroups, dstate) with ngroups dividing nheads"
        raise error(ValueError, "B", rule, shape_of(B))
    argchecks.require_dstate("dstate (B.shape[3])", B.shape[3])
    require_shape("C", C, B.shape, "same as B: (batch, seqlen, ngroups, dstate)")
    if A.shape != (nheads,) and A.shape != (nheads * headdim, B.shape[3]):
        raise error(ValueError, "A", "must be (nheads,) or (nheads * headdim, dstate)", shape_of(A))
    for name, t in (("D", D), ("dt_bias", dt_bias)):
        if t is not None and t.shape != (nheads,) and t.shape != (nheads, headdim):  # type: ignore[union-attr]
            raise error(ValueError, name, "must be (nheads,) or (nheads, headdim)", shape_of(t))
    if z is not None:
        require_shape("z", z, x.shape, "same as x: (batch, seqlen, nheads, headdim)")  # type: ignore[arg-type]
    return require_bool("dt_softplus", dt_softplus), dt_limit_of(dt_limit)
