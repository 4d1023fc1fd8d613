"""Argument validation for the selective scan: every rule is checked before anything runs,
and each error names the argument, the rule and the value given."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from mamba_kernels.runtime import argchecks
from mamba_kernels.runtime.argchecks import (
    dtype_of,
    error,
    require_one_device,
    shape_of,
    type_name,
    typed_repr,
)

Tensor = torch.Tensor

CONV_MIN_WIDTH, CONV_MAX_WIDTH = 2, 4  # causal_conv1d's widths (its _checks: MIN_WIDTH, MAX_WIDTH)
MAX_DSTATE = 256  # the compiled anchor's limit (state-spaces/mamba#120); kept for drop-in parity
INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
REAL_WEIGHT_DTYPES = (torch.float32, torch.float64)
COMPLEX_WEIGHT_DTYPES = (torch.complex64, torch.complex128)


# The scan's wording of argchecks' vocabulary: "name rule, got <the attribute that broke it>"
# (no function prefix; a tensor's type, shape or dtype rather than the whole value).

require_same_device = require_one_device


def require_tensor(name: str, t: object, optional: bool = False) -> None:
    argchecks.require_tensor(name, t, optional, seen=type_name)


def require_bool(name: str, value: object) -> bool:
    """A flag must be a bool (numpy's bool too): a string such as "no" would otherwise be true."""
    return argchecks.require_bool(
        name, value, numpy=True, rule="must be a bool (True or False)", seen=typed_repr
    )


def require_shape(name: str, t: Tensor, shape: Sequence[int], what: str) -> None:
    argchecks.require_shape(name, t, shape, what, seen=shape_of, form="must have shape {shape} ({what})")


def _require_dtype(name: str, t: Tensor, dtype: torch.dtype, whose: str) -> None:
    argchecks.require_dtype(name, t, dtype, whose, seen=dtype_of)


def compute_dtype(u: Tensor) -> torch.dtype:
    """The real dtype the scan runs in: float64 for float64 inputs, else float32."""
    return torch.float64 if u.dtype == torch.float64 else torch.float32


def _check_param_vector(name: str, t: Optional[Tensor], dim: int, u: Tensor) -> None:
    require_tensor(name, t, optional=True)
    if t is None:
        return
    allowed = (torch.float32, torch.float64) if u.dtype == torch.float64 else (torch.float32,)
    if t.dtype not in allowed:
        rule = f"must be {' or '.join(map(str, allowed))} (kept in full precision, like the original)"
        raise error(TypeError, name, rule, dtype_of(t))
    require_shape(name, t, (dim,), "(dim,)")


def _bc_groups(name: str, t: Tensor, batch: int, dstate: int, seqlen: int, is_complex: bool) -> int:
    """Validate a variable B or C; return its number of groups."""
    if t.dim() not in (3, 4):
        rule = (
            "must be 2-D (dim, dstate) fixed, or 3-D (batch, dstate, L) / 4-D "
            "(batch, ngroups, dstate, L) variable"
        )
        raise error(ValueError, name, rule, f"{t.dim()}-D {tuple(t.shape)}")
    groups = 1 if t.dim() == 3 else t.shape[1]
    want_len = 2 * seqlen if is_complex else seqlen
    expect = (batch, dstate, want_len) if t.dim() == 3 else (batch, groups, dstate, want_len)
    rule = (
        "last dim 2L, real/imag interleaved, for complex A" if is_complex else "(batch, [ngroups,] dstate, L)"
    )
    require_shape(name, t, expect, rule)
    if groups < 1:
        raise error(ValueError, name, "must have at least one group", f"ngroups={groups}")
    return groups


_WIDE_A = (torch.float64, torch.complex128)


def _quick_groups(u, delta, A, B, C, D, z, delta_bias, reference: bool) -> int:
    """ngroups when every rule of ``check_selective_scan`` holds, else 0 (the full check then
    names the rule that fails). Each attribute is read once and no message is built: this is
    the per-call path, and it accepts nothing the full check rejects (a test compares the two
    on random arguments)."""
    T = torch.Tensor
    if not (isinstance(u, T) and isinstance(delta, T) and isinstance(A, T) and isinstance(B, T)
            and isinstance(C, T)):
        return 0
    shape = u.shape
    if len(shape) != 3:
        return 0
    batch, dim, L = shape
    dt = u.dtype
    if dt not in INPUT_DTYPES or delta.dtype != dt or delta.shape != shape:
        return 0
    dev = u.device
    if delta.device != dev or A.device != dev or B.device != dev or C.device != dev:
        return 0
    ashape = A.shape
    if len(ashape) != 2 or ashape[0] != dim:
        return 0
    n = ashape[1]
    adt = A.dtype
    if not argchecks.DSTATE_MIN <= n <= MAX_DSTATE:
        return 0
    narrow = adt == torch.float32 or adt == torch.complex64
    if not narrow and not ((dt == torch.float64 or reference) and adt in _WIDE_A):
        return 0
    want = 2 * L if adt.is_complex else L
    groups = 0
    for t in (B, C):
        bs = t.shape
        nd = len(bs)
        if nd == 2:
            if bs[0] != dim or bs[1] != n or t.dtype != adt:
                return 0
            continue
        if nd == 4:
            g = bs[1]
            if g < 1 or bs[0] != batch or bs[2] != n or bs[3] != want:
                return 0
        elif nd == 3:
            g = 1
            if bs[0] != batch or bs[1] != n or bs[2] != want:
                return 0
        else:
            return 0
        if t.dtype != dt or (groups and g != groups):
            return 0
        groups = g
    groups = groups or 1
    if dim % groups:
        return 0
    wide = dt == torch.float64
    for t in (D, delta_bias):
        if t is not None:
            if not isinstance(t, T) or t.device != dev or t.shape != (dim,):
                return 0
            pdt = t.dtype
            if pdt != torch.float32 and not (wide and pdt == torch.float64):
                return 0
    if z is not None and (not isinstance(z, T) or z.device != dev or z.dtype != dt or z.shape != shape):
        return 0
    return groups


def check_selective_scan(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    z: Optional[Tensor],
    delta_bias: Optional[Tensor],
    reference: bool = False,
) -> int:
    """Validate selective_scan_fn / selective_scan_ref arguments; return ngroups."""
    return _quick_groups(u, delta, A, B, C, D, z, delta_bias, reference) or check_selective_scan_full(
        u, delta, A, B, C, D, z, delta_bias, reference
    )


def check_selective_scan_full(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    z: Optional[Tensor],
    delta_bias: Optional[Tensor],
    reference: bool = False,
) -> int:
    """Every rule, in order, each failure raising with its message; return ngroups."""
    for name, t in (("u", u), ("delta", delta), ("A", A), ("B", B), ("C", C)):
        require_tensor(name, t)
    require_tensor("z", z, optional=True)
    require_same_device(
        {"u": u, "delta": delta, "A": A, "B": B, "C": C, "D": D, "z": z, "delta_bias": delta_bias}
    )
    if u.dim() != 3:
        raise error(ValueError, "u", "must be 3-D (batch, dim, L)", f"{u.dim()}-D {tuple(u.shape)}")
    batch, dim, seqlen = u.shape
    rule = "must be float32, float16, bfloat16 or float64"
    argchecks.require_dtype_in("u", u, INPUT_DTYPES, rule, seen=dtype_of)
    require_shape("delta", delta, u.shape, "same as u: (batch, dim, L)")
    _require_dtype("delta", delta, u.dtype, "u's")
    if A.dim() != 2 or A.shape[0] != dim:
        raise error(ValueError, "A", f"must have shape (dim, dstate) with dim={dim}", shape_of(A))
    dstate = A.shape[1]
    argchecks.require_dstate("dstate (A.shape[1])", dstate, MAX_DSTATE)
    wide = u.dtype == torch.float64 or reference
    allowed_a = (torch.float32, torch.complex64) + ((torch.float64, torch.complex128) if wide else ())
    if A.dtype not in allowed_a:
        rule = "must be float32 or complex64 (float64/complex128 only with float64 u)"
        raise error(TypeError, "A", rule, f"{A.dtype} with u {u.dtype}")
    is_complex = A.is_complex()
    groups = []
    for name, t in (("B", B), ("C", C)):
        if t.dim() == 2:
            require_shape(name, t, (dim, dstate), "fixed: (dim, dstate)")
            _require_dtype(f"fixed {name}", t, A.dtype, "A's")
        else:
            groups.append((name, _bc_groups(name, t, batch, dstate, seqlen, is_complex)))
            _require_dtype(f"variable {name}", t, u.dtype, "u's")
    if len(groups) == 2 and groups[0][1] != groups[1][1]:
        seen = f"B with {groups[0][1]} and C with {groups[1][1]}"
        raise error(ValueError, "B and C", "must have the same ngroups", seen)
    ngroups = groups[0][1] if groups else 1
    if dim % ngroups != 0:
        raise ValueError(f"dim must be divisible by ngroups: dim={dim}, ngroups={ngroups}")
    _check_param_vector("D", D, dim, u)
    _check_param_vector("delta_bias", delta_bias, dim, u)
    if z is not None:
        require_shape("z", z, u.shape, "same as u: (batch, dim, L)")
        _require_dtype("z", z, u.dtype, "u's")
    return ngroups


def check_mamba_inner(
    xz: Tensor,
    conv1d_weight: Tensor,
    x_proj_weight: Tensor,
    delta_proj_weight: Tensor,
    out_proj_weight: Tensor,
    A: Tensor,
    B: Optional[Tensor],
    C: Optional[Tensor],
    checkpoint_lvl: int,
    rms_weights: dict,
    biases: Optional[dict] = None,
    eps: object = 1e-6,
    autocast: bool = False,
) -> None:
    """Validate mamba_inner_fn's own arguments (the scan checks D, delta_bias and the rest).

    ``biases``: conv1d_bias, out_proj_bias, B_proj_bias, C_proj_bias by name. Without
    ``autocast`` the projections run in xz's dtype, so their weights (and out_proj_bias) must
    have it; under autocast they are cast to the autocast dtype first.

    Long: one check per argument of mamba_inner_fn in its signature's order, each with its own message;
    helpers would scatter that order without shortening the checks.
    """
    biases = biases or {}
    for name, t in (
        ("xz", xz),
        ("conv1d_weight", conv1d_weight),
        ("x_proj_weight", x_proj_weight),
        ("delta_proj_weight", delta_proj_weight),
        ("out_proj_weight", out_proj_weight),
        ("A", A),
    ):
        require_tensor(name, t)
    named = {
        "xz": xz, "conv1d_weight": conv1d_weight, "x_proj_weight": x_proj_weight,
        "delta_proj_weight": delta_proj_weight, "out_proj_weight": out_proj_weight, "A": A, "B": B, "C": C,
    }
    require_same_device({**named, **rms_weights, **biases})
    if xz.dim() != 3 or xz.shape[1] % 2 != 0:
        rule = "must be 3-D (batch, 2*d_inner, L) with an even channel count"
        raise error(ValueError, "xz", rule, shape_of(xz))
    argchecks.require_dtype_in("xz", xz, INPUT_DTYPES, "must be float32, float16, bfloat16 or float64",
                               seen=dtype_of)
    d_inner = xz.shape[1] // 2
    if conv1d_weight.dim() != 3 or conv1d_weight.shape[:2] != (d_inner, 1):
        rule = f"must have shape (d_inner, 1, width) with d_inner={d_inner}"
        raise error(ValueError, "conv1d_weight", rule, shape_of(conv1d_weight))
    if not CONV_MIN_WIDTH <= conv1d_weight.shape[2] <= CONV_MAX_WIDTH:
        rule = f"width (its last size) must be between {CONV_MIN_WIDTH} and {CONV_MAX_WIDTH}"
        raise error(ValueError, "conv1d_weight", rule, shape_of(conv1d_weight))
    argchecks.require_dtype_in("conv1d_weight", conv1d_weight, INPUT_DTYPES,
                               "must be float32, float16, bfloat16 or float64", seen=dtype_of)
    conv1d_bias = biases.get("conv1d_bias")
    require_tensor("conv1d_bias", conv1d_bias, optional=True)
    if conv1d_bias is not None:
        require_shape("conv1d_bias", conv1d_bias, (d_inner,), "(d_inner,)")
        _require_dtype("conv1d_bias", conv1d_bias, conv1d_weight.dtype, "conv1d_weight's")
    if A.dim() != 2 or A.shape[0] != d_inner:
        raise error(ValueError, "A", f"must have shape (d_inner, dstate) with d_inner={d_inner}", shape_of(A))
    if delta_proj_weight.dim() != 2 or delta_proj_weight.shape[0] != d_inner:
        rule = f"must have shape (d_inner, dt_rank) with d_inner={d_inner}"
        raise error(ValueError, "delta_proj_weight", rule, shape_of(delta_proj_weight))
    dt_rank = delta_proj_weight.shape[1]
    d_state = A.shape[1] * (2 if A.is_complex() else 1)
    n_var = (B is None) + (C is None)
    rows = dt_rank + n_var * d_state
    if x_proj_weight.dim() != 2 or tuple(x_proj_weight.shape) != (rows, d_inner):
        rule = (
            f"must have shape (dt_rank + {n_var} * d_state, d_inner) = ({rows}, {d_inner}) "
            f"(dt_rank={dt_rank}, d_state={d_state} reals per step, {n_var} of B/C input-dependent)"
        )
        raise error(ValueError, "x_proj_weight", rule, shape_of(x_proj_weight))
    if out_proj_weight.dim() != 2 or out_proj_weight.shape[1] != d_inner:
        rule = f"must have shape (d_model, d_inner) with d_inner={d_inner}"
        raise error(ValueError, "out_proj_weight", rule, shape_of(out_proj_weight))
    d_model = out_proj_weight.shape[0]
    for name, size in (("out_proj_bias", d_model), ("B_proj_bias", d_state), ("C_proj_bias", d_state)):
        t = biases.get(name)
        require_tensor(name, t, optional=True)
        if t is not None:
            require_shape(name, t, (size,), "(d_model,)" if name == "out_proj_bias" else "(d_state,)")
    if not autocast:
        for name, t in (("x_proj_weight", x_proj_weight), ("delta_proj_weight", delta_proj_weight),
                        ("out_proj_weight", out_proj_weight), ("out_proj_bias", biases.get("out_proj_bias"))):
            if t is not None and t.dtype != xz.dtype:
                rule = f"must have xz's dtype {xz.dtype} (the projections run in it outside autocast)"
                raise error(TypeError, name, rule, dtype_of(t))
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise error(TypeError if not isinstance(eps, (int, float)) else ValueError, "b_c_dt_rms_eps",
                    "must be a number >= 0", repr(eps))
    if checkpoint_lvl not in (0, 1):
        raise error(ValueError, "checkpoint_lvl", "must be 0 or 1", repr(checkpoint_lvl))
    sizes = {"b_rms_weight": d_state, "c_rms_weight": d_state, "dt_rms_weight": d_inner}
    for name, t in rms_weights.items():
        require_tensor(name, t, optional=True)
        if t is not None:
            require_shape(name, t, (sizes[name],), "one weight per normalised feature")
    for name, t, var in (("B", B, "b_rms_weight"), ("C", C, "c_rms_weight")):
        if t is not None and rms_weights.get(var) is not None:
            raise ValueError(
                f"{var} normalises an input-dependent {name}; it cannot be used with a given {name}"
            )
