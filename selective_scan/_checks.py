"""Argument validation for the selective scan: every rule is checked before anything runs,
and each error names the argument, the rule and the value given."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

Tensor = torch.Tensor

MAX_DSTATE = 256  # the compiled anchor's limit (state-spaces/mamba#120); kept for drop-in parity
INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
REAL_WEIGHT_DTYPES = (torch.float32, torch.float64)
COMPLEX_WEIGHT_DTYPES = (torch.complex64, torch.complex128)


def _desc(t: Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


def require_tensor(name: str, t: object, optional: bool = False) -> None:
    if t is None and optional:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def require_bool(name: str, value: object) -> bool:
    """A flag must be a bool (numpy's bool too): a string such as "no" would otherwise be true."""
    if value is True or value is False:
        return value
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
    if isinstance(value, bool) or numpy_bool:
        return bool(value)
    raise TypeError(f"{name} must be a bool (True or False), got {type(value).__name__} {value!r}")


def require_shape(name: str, t: Tensor, shape: Sequence[int], what: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} ({what}), got {tuple(t.shape)}")


def require_same_device(named: dict) -> None:
    present = {k: v for k, v in named.items() if isinstance(v, torch.Tensor)}
    first_name, first = next(iter(present.items()))
    for k, v in present.items():
        if v.device != first.device:
            raise ValueError(
                f"all tensors must be on one device: {first_name} is on {first.device} "
                f"but {k} is on {v.device}"
            )


def compute_dtype(u: Tensor) -> torch.dtype:
    """The real dtype the scan runs in: float64 for float64 inputs, else float32."""
    return torch.float64 if u.dtype == torch.float64 else torch.float32


def _check_param_vector(name: str, t: Optional[Tensor], dim: int, u: Tensor) -> None:
    require_tensor(name, t, optional=True)
    if t is None:
        return
    allowed = (torch.float32, torch.float64) if u.dtype == torch.float64 else (torch.float32,)
    if t.dtype not in allowed:
        raise TypeError(
            f"{name} must be {' or '.join(map(str, allowed))} (kept in full precision, like the "
            f"original), got {t.dtype}"
        )
    require_shape(name, t, (dim,), "(dim,)")


def _bc_groups(name: str, t: Tensor, batch: int, dstate: int, seqlen: int, is_complex: bool) -> int:
    """Validate a variable B or C; return its number of groups."""
    if t.dim() not in (3, 4):
        raise ValueError(
            f"{name} must be 2-D (dim, dstate) fixed, or 3-D (batch, dstate, L) / 4-D "
            f"(batch, ngroups, dstate, L) variable, got {t.dim()}-D {tuple(t.shape)}"
        )
    groups = 1 if t.dim() == 3 else t.shape[1]
    want_len = 2 * seqlen if is_complex else seqlen
    expect = (batch, dstate, want_len) if t.dim() == 3 else (batch, groups, dstate, want_len)
    rule = (
        "last dim 2L, real/imag interleaved, for complex A" if is_complex else "(batch, [ngroups,] dstate, L)"
    )
    require_shape(name, t, expect, rule)
    if groups < 1:
        raise ValueError(f"{name} must have at least one group, got ngroups={groups}")
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
    if L < 1 or dt not in INPUT_DTYPES or delta.dtype != dt or delta.shape != shape:
        return 0
    dev = u.device
    if delta.device != dev or A.device != dev or B.device != dev or C.device != dev:
        return 0
    ashape = A.shape
    if len(ashape) != 2 or ashape[0] != dim:
        return 0
    n = ashape[1]
    adt = A.dtype
    if not 1 <= n <= MAX_DSTATE:
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
        raise ValueError(f"u must be 3-D (batch, dim, L), got {u.dim()}-D {tuple(u.shape)}")
    batch, dim, seqlen = u.shape
    if seqlen < 1:
        raise ValueError(f"u must have a sequence length L >= 1, got shape {tuple(u.shape)}")
    if u.dtype not in INPUT_DTYPES:
        raise TypeError(f"u must be float32, float16, bfloat16 or float64, got {u.dtype}")
    require_shape("delta", delta, u.shape, "same as u: (batch, dim, L)")
    if delta.dtype != u.dtype:
        raise TypeError(f"delta must have u's dtype {u.dtype}, got {delta.dtype}")
    if A.dim() != 2 or A.shape[0] != dim:
        raise ValueError(f"A must have shape (dim, dstate) with dim={dim}, got {tuple(A.shape)}")
    dstate = A.shape[1]
    if not 1 <= dstate <= MAX_DSTATE:
        raise ValueError(f"dstate (A.shape[1]) must be between 1 and {MAX_DSTATE}, got {dstate}")
    wide = u.dtype == torch.float64 or reference
    allowed_a = (torch.float32, torch.complex64) + ((torch.float64, torch.complex128) if wide else ())
    if A.dtype not in allowed_a:
        raise TypeError(
            f"A must be float32 or complex64 (float64/complex128 only with float64 u), got {A.dtype} "
            f"with u {u.dtype}"
        )
    is_complex = A.is_complex()
    groups = []
    for name, t in (("B", B), ("C", C)):
        if t.dim() == 2:
            require_shape(name, t, (dim, dstate), "fixed: (dim, dstate)")
            if t.dtype != A.dtype:
                raise TypeError(f"fixed {name} must have A's dtype {A.dtype}, got {t.dtype}")
        else:
            groups.append((name, _bc_groups(name, t, batch, dstate, seqlen, is_complex)))
            if t.dtype != u.dtype:
                raise TypeError(f"variable {name} must have u's dtype {u.dtype}, got {t.dtype}")
    if len(groups) == 2 and groups[0][1] != groups[1][1]:
        raise ValueError(
            f"B and C must have the same ngroups, got B with {groups[0][1]} and C with {groups[1][1]}"
        )
    ngroups = groups[0][1] if groups else 1
    if dim % ngroups != 0:
        raise ValueError(f"dim must be divisible by ngroups: dim={dim}, ngroups={ngroups}")
    _check_param_vector("D", D, dim, u)
    _check_param_vector("delta_bias", delta_bias, dim, u)
    if z is not None:
        require_shape("z", z, u.shape, "same as u: (batch, dim, L)")
        if z.dtype != u.dtype:
            raise TypeError(f"z must have u's dtype {u.dtype}, got {z.dtype}")
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
) -> None:
    """Validate mamba_inner_fn's own arguments (the conv and the scan check the rest)."""
    for name, t in (
        ("xz", xz),
        ("conv1d_weight", conv1d_weight),
        ("x_proj_weight", x_proj_weight),
        ("delta_proj_weight", delta_proj_weight),
        ("out_proj_weight", out_proj_weight),
        ("A", A),
    ):
        require_tensor(name, t)
    if xz.dim() != 3 or xz.shape[1] % 2 != 0:
        raise ValueError(
            f"xz must be 3-D (batch, 2*d_inner, L) with an even channel count, got {tuple(xz.shape)}"
        )
    d_inner = xz.shape[1] // 2
    if conv1d_weight.dim() != 3 or conv1d_weight.shape[:2] != (d_inner, 1):
        raise ValueError(
            f"conv1d_weight must have shape (d_inner, 1, width) with d_inner={d_inner}, got "
            f"{tuple(conv1d_weight.shape)}"
        )
    if A.dim() != 2 or A.shape[0] != d_inner:
        raise ValueError(f"A must have shape (d_inner, dstate) with d_inner={d_inner}, got {tuple(A.shape)}")
    if delta_proj_weight.dim() != 2 or delta_proj_weight.shape[0] != d_inner:
        raise ValueError(
            f"delta_proj_weight must have shape (d_inner, dt_rank) with d_inner={d_inner}, got "
            f"{tuple(delta_proj_weight.shape)}"
        )
    dt_rank = delta_proj_weight.shape[1]
    d_state = A.shape[1] * (2 if A.is_complex() else 1)
    n_var = (B is None) + (C is None)
    rows = dt_rank + n_var * d_state
    if x_proj_weight.dim() != 2 or tuple(x_proj_weight.shape) != (rows, d_inner):
        raise ValueError(
            f"x_proj_weight must have shape (dt_rank + {n_var} * d_state, d_inner) = ({rows}, {d_inner}) "
            f"(dt_rank={dt_rank}, d_state={d_state} reals per step, {n_var} of B/C input-dependent), got "
            f"{tuple(x_proj_weight.shape)}"
        )
    if out_proj_weight.dim() != 2 or out_proj_weight.shape[1] != d_inner:
        raise ValueError(
            f"out_proj_weight must have shape (d_model, d_inner) with d_inner={d_inner}, got "
            f"{tuple(out_proj_weight.shape)}"
        )
    if checkpoint_lvl not in (0, 1):
        raise ValueError(f"checkpoint_lvl must be 0 or 1, got {checkpoint_lvl!r}")
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
