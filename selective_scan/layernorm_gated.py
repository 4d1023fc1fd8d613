"""Drop-in for ``mamba_ssm.ops.triton.layernorm_gated``: the gated RMSNorm / LayerNorm of Mamba-2.

Over the last dim of x (N channels), in groups of ``group_size`` consecutive channels (None:
one group of N), each group normalised on its own:

    rms:   y = x / sqrt(mean(x^2) + eps) * weight (+ bias)
    layer: y = (x - mean(x)) / sqrt(var(x) + eps) * weight (+ bias)

and with a gate z (x's shape): ``norm(x) * silu(z)`` when ``norm_before_gate`` (the default),
else ``norm(x * silu(z))``. The arithmetic runs in float32 (float64 when x is float64); the
output has x's dtype, the gradients those of x, z, weight and bias.

Public names as the original's: ``rmsnorm_fn``, ``layernorm_fn``, ``LayerNormFn``,
``RMSNorm`` and ``LayerNorm`` (nn.Modules with the same parameters and initialisation, so
state dicts load), the reference ``rms_norm_ref``, and the helpers Mamba-2's fused layer
calls, ``_layer_norm_fwd`` (returns out, mean, rstd; mean and rstd are (ngroups * rows,),
group-major) and ``_layer_norm_bwd`` (writes into given ``dz`` / ``out``). ``layer_norm_ref``
is ours: the LayerNorm counterpart of ``rms_norm_ref``.

On CUDA tensors the compiled kernels (csrc/layernorm_gated/) run when the extension is
available, x and z are float32, float16 or bfloat16 of one dtype (weight and bias any of the
three), and a group holds at most 16 KiB of x (8192 16-bit channels; the original's Triton
takes up to 64 KiB); anything else runs the PyTorch path, on any device.
"""

from __future__ import annotations

import math
import operator
import sys
from types import ModuleType
from typing import Optional

import torch
import torch.nn.functional as F

from mamba_kernels.runtime import argchecks, dispatch, knobs
from mamba_kernels.runtime.library import is_compiling, pick

from . import _checks

Tensor = torch.Tensor
KERNEL = "selective_scan"  # the extension family (selective_scan._cuda) the norm kernels ship in
KERNEL_GROUP_BYTES = 16384  # the largest group the kernels hold (csrc/layernorm_gated/norm_gated.h)

_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_FLOAT64 = torch.float64
_PACKAGE = sys.modules[__package__]


# --- references --------------------------------------------------------------------------------


def _ref(x, weight, bias, z, eps, group_size, norm_before_gate, upcast, is_rms_norm):
    dtype = x.dtype
    wide = torch.float64 if torch.float64 in (x.dtype, weight.dtype) else torch.float32
    w = weight.to(wide)
    b = bias.to(wide) if bias is not None else None
    if upcast:
        x = x.to(wide)
        z = z.to(wide) if z is not None else None
    if z is not None and not norm_before_gate:
        x = x * F.silu(z)
    n = x.shape[-1]
    g = n if group_size is None else group_size
    xg = x.reshape(*x.shape[:-1], n // g if g else 0, g)
    if not is_rms_norm:
        xg = xg - xg.mean(dim=-1, keepdim=True)
    xg = xg * torch.rsqrt(xg.square().mean(dim=-1, keepdim=True) + eps)
    out = xg.reshape(x.shape) * w
    if b is not None:
        out = out + b
    if z is not None and norm_before_gate:
        out = out * F.silu(z)
    return out.to(dtype)


def rms_norm_ref(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True, upcast=True):
    """The gated RMSNorm written with torch ops (float32, float64 for float64; ``upcast=False``
    computes in x's dtype); returns x's dtype."""
    _check(x, weight, bias, z, eps, group_size)
    return _ref(x, weight, bias, z, eps, group_size, norm_before_gate, upcast, True)


def layer_norm_ref(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True, upcast=True):
    """``rms_norm_ref`` for the LayerNorm (mean subtracted before the scale)."""
    _check(x, weight, bias, z, eps, group_size)
    return _ref(x, weight, bias, z, eps, group_size, norm_before_gate, upcast, False)


# --- argument checks ---------------------------------------------------------------------------


def _dtype_error(name: str, t: Tensor) -> Exception:
    return argchecks.error(TypeError, name, "must be float32, float16, bfloat16 or float64", str(t.dtype))


def _check(x, weight, bias, z, eps, group_size) -> int:
    """Validate the operands; return the group size (N for None; 0 when N is 0)."""
    _checks.require_tensor("x", x)
    _checks.require_tensor("weight", weight)
    _checks.require_tensor("bias", bias, optional=True)
    _checks.require_tensor("z", z, optional=True)
    named = {"x": x, "weight": weight, "bias": bias, "z": z}
    for name, t in named.items():
        if t is not None and t.dtype not in _FLOATS:
            raise _dtype_error(name, t)
    if x.dim() < 1:
        raise argchecks.error(ValueError, "x", "must have at least one dimension (the channels)", "shape ()")
    n = x.shape[-1]
    _checks.require_shape("weight", weight, (n,), "x.shape[-1] channels")
    if bias is not None:
        _checks.require_shape("bias", bias, (n,), "x.shape[-1] channels")
    if z is not None and z.shape != x.shape:
        _checks.require_shape("z", z, tuple(x.shape), "same as x")
    _checks.require_same_device(named)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise argchecks.error(TypeError, "eps", "must be a real number", argchecks.typed_repr(eps))
    if not (math.isfinite(eps) and eps >= 0):
        raise argchecks.error(ValueError, "eps", "must be finite and >= 0", repr(eps))
    if group_size is None:
        return n
    try:  # an int, or what indexes like one (numpy's); not a bool, which would read as 0 or 1
        if isinstance(group_size, bool):
            raise TypeError
        group_size = operator.index(group_size)
    except TypeError:
        raise argchecks.error(
            TypeError, "group_size", "must be None or an int", argchecks.typed_repr(group_size)
        ) from None
    if group_size < 1 or n % group_size != 0:
        raise argchecks.error(
            ValueError, "group_size", f"must be >= 1 and divide x.shape[-1] = {n}", repr(group_size)
        )
    return group_size


def _require_2d_rows(name: str, t: Tensor, x: Tensor) -> None:
    if t.shape != x.shape:
        _checks.require_shape(name, t, tuple(x.shape), "same as x")


# --- dispatch ----------------------------------------------------------------------------------


def _kernel_covers(x: Tensor, weight: Tensor, bias: Optional[Tensor], z: Optional[Tensor], g: int) -> bool:
    """The compiled kernels cover these operands: x and z of one 32/16-bit float dtype,
    weight and bias 32/16-bit, a group of at most KERNEL_GROUP_BYTES, something to do."""
    return (
        x.dtype in _KERNEL_DTYPES
        and weight.dtype in _KERNEL_DTYPES
        and (bias is None or bias.dtype in _KERNEL_DTYPES)
        and (z is None or z.dtype == x.dtype)
        and g * x.element_size() <= KERNEL_GROUP_BYTES
        and not argchecks.is_empty(x)
    )


def _use_cuda(x, weight, bias, z, g) -> bool:
    """The compiled kernels run for covered CUDA operands when dispatch allows and
    MAMBA_KERNELS_MAMBA2_CUDA leaves them on (0: the PyTorch path)."""
    if x.is_cuda and not knobs.mamba2_cuda():
        return False
    return _kernel_covers(x, weight, bias, z, g) and dispatch.use_cuda(
        KERNEL, "cuda" if x.is_cuda else x.device.type
    )


def _ops() -> ModuleType:
    """``selective_scan._norm_ops``, imported on first use (importing it loads the extension)."""
    ops = getattr(_PACKAGE, "_norm_ops", None)
    if ops is None:
        from . import _norm_ops as ops
    return ops


def _wide(*tensors: Optional[Tensor]) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == _FLOAT64 for t in tensors) else torch.float32


def _unit_last(t: Optional[Tensor]) -> Optional[Tensor]:
    """t with unit stride along the channels (the kernels' layout; rows may have any stride)."""
    if t is None or t.stride(-1) == 1 or t.shape[-1] <= 1:
        return t
    return t.contiguous()


# --- forward and backward on 2-D (rows, N) ---------------------------------------------------


def _fwd_torch(x, weight, bias, z, eps, g, norm_before_gate, is_rms_norm):
    cd = _wide(x, weight)
    m, n = x.shape
    ng = n // g if g else 0
    xf = x.to(cd)
    if z is not None and not norm_before_gate:
        xf = xf * F.silu(z.to(cd))
    xg = xf.reshape(m, ng, g)
    mean = None
    if not is_rms_norm:
        mean = xg.mean(dim=-1)
        xg = xg - mean.unsqueeze(-1)
    rstd = torch.rsqrt(xg.square().mean(dim=-1) + eps)
    y = (xg * rstd.unsqueeze(-1)).reshape(m, n) * weight.to(cd)
    if bias is not None:
        y = y + bias.to(cd)
    if z is not None and norm_before_gate:
        y = y * F.silu(z.to(cd))
    stat = cd if cd == _FLOAT64 else torch.float32
    # (ngroups * rows,), group-major: the original's layout
    rstd = rstd.t().reshape(-1).to(stat)
    mean = mean.t().reshape(-1).to(stat) if mean is not None else None
    return y.to(x.dtype), mean, rstd


def _bwd_torch(dy, x, weight, bias, z, mean, rstd, g, norm_before_gate, is_rms_norm):
    """(dx, dw, db, dz, out): the gradients and the recomputed output, in the compute dtype."""
    cd = _wide(x, weight)
    m, n = x.shape
    ng = n // g if g else 0
    xf = x.to(cd).reshape(m, ng, g)
    dyf = dy.to(cd).reshape(m, ng, g)
    zf = z.to(cd).reshape(m, ng, g) if z is not None else None
    w = weight.to(cd).reshape(ng, g)
    r = rstd.to(cd).reshape(ng, m).t().unsqueeze(-1)
    xin = xf * F.silu(zf) if zf is not None and not norm_before_gate else xf
    xhat = xin * r if is_rms_norm else (xin - mean.to(cd).reshape(ng, m).t().unsqueeze(-1)) * r
    y = xhat * w
    if bias is not None:
        y = y + bias.to(cd).reshape(ng, g)
    dz = None
    out = y
    if zf is not None and norm_before_gate:
        s = torch.sigmoid(zf)
        dz = dyf * y * s * (1 + zf * (1 - s))
        out = y * zf * s
        dyf = dyf * zf * s
    wdy = w * dyf
    dx = wdy - xhat * (xhat * wdy).mean(dim=-1, keepdim=True)
    if not is_rms_norm:
        dx = dx - wdy.mean(dim=-1, keepdim=True)
    dx = dx * r
    dw = (dyf * xhat).sum(dim=0).reshape(n)
    db = dyf.sum(dim=0).reshape(n)
    if zf is not None and not norm_before_gate:
        s = torch.sigmoid(zf)
        dz = dx * xf * s * (1 + zf * (1 - s))
        dx = dx * zf * s

    def flat(t):
        return t.reshape(m, n) if t is not None else None

    return flat(dx), dw, db, flat(dz), flat(out)


def _layer_norm_fwd(
    x, weight, bias, eps, z=None, out=None, group_size=None, norm_before_gate=True, is_rms_norm=False
):
    """Forward on 2-D x (rows, N): (out, mean or None for RMS, rstd). ``out``, when given (x's
    shape; any strides), is written and returned."""
    norm_before_gate = _checks.require_bool("norm_before_gate", norm_before_gate)
    is_rms_norm = _checks.require_bool("is_rms_norm", is_rms_norm)
    g = _check(x, weight, bias, z, eps, group_size)
    if x.dim() != 2:
        raise argchecks.error(ValueError, "x", "must be 2-D (rows, channels)", f"shape {tuple(x.shape)}")
    if out is not None:
        _checks.require_tensor("out", out)
        _require_2d_rows("out", out, x)
        argchecks.require_writable("out", out, seen=argchecks.with_strides)
    if (out is None or out.dtype == x.dtype) and _use_cuda(x, weight, bias, z, g):
        return _fwd_cuda(x, weight, bias, z, out, eps, g, norm_before_gate, is_rms_norm)
    y, mean, rstd = _fwd_torch(x, weight, bias, z, eps, g, norm_before_gate, is_rms_norm)
    if out is None:
        return y, mean, rstd
    with torch.no_grad():
        out.copy_(y)
    return out, mean, rstd


def _fwd_cuda(x, weight, bias, z, out, eps, g, norm_before_gate, is_rms_norm):
    m, n = x.shape
    x, z = _unit_last(x), _unit_last(z)
    ops = _ops()
    target = out if out is not None and (out.stride(-1) == 1 or n <= 1) else torch.empty_like(x)
    rows = (n // g) * m
    mean = None if is_rms_norm else x.new_empty((rows,), dtype=torch.float32)
    rstd = x.new_empty((rows,), dtype=torch.float32)
    pick(ops.fwd, ops.fwd_entry)(
        x,
        weight.contiguous(),
        bias.contiguous() if bias is not None else None,
        z,
        target,
        mean,
        rstd,
        float(eps),
        g,
        norm_before_gate,
        is_rms_norm,
    )
    if out is not None and target is not out:
        out.copy_(target)
        target = out
    return target, mean, rstd


def _layer_norm_bwd(
    dy,
    x,
    weight,
    bias,
    eps,
    mean,
    rstd,
    z=None,
    group_size=None,
    norm_before_gate=True,
    is_rms_norm=False,
    recompute_output=False,
    dz=None,
    out=None,
):
    """Backward on 2-D operands: (dx, dw, db, dz) and, with ``recompute_output``, the forward's
    output. ``dz`` and ``out``, when given, are written and returned; dw and db have weight's
    and bias's dtypes, db None without bias, dz None without z."""
    norm_before_gate = _checks.require_bool("norm_before_gate", norm_before_gate)
    is_rms_norm = _checks.require_bool("is_rms_norm", is_rms_norm)
    recompute_output = _checks.require_bool("recompute_output", recompute_output)
    g = _check(x, weight, bias, z, eps, group_size)
    if x.dim() != 2:
        raise argchecks.error(ValueError, "x", "must be 2-D (rows, channels)", f"shape {tuple(x.shape)}")
    _checks.require_tensor("dy", dy)
    _require_2d_rows("dy", dy, x)
    if dy.dtype not in _FLOATS:
        raise _dtype_error("dy", dy)
    m, n = x.shape
    rows = (n // g if g else 0) * m
    _checks.require_tensor("rstd", rstd)
    _checks.require_shape("rstd", rstd, (rows,), "(ngroups * rows,)")
    if not is_rms_norm:
        _checks.require_tensor("mean", mean)
        _checks.require_shape("mean", mean, (rows,), "(ngroups * rows,)")
    if dz is not None:
        _checks.require_tensor("dz", dz)
        if z is None:
            raise argchecks.error(ValueError, "dz", "must be None without z", argchecks.describe(dz))
        _require_2d_rows("dz", dz, x)
        argchecks.require_writable("dz", dz, seen=argchecks.with_strides)
    if out is not None:
        _checks.require_tensor("out", out)
        _require_2d_rows("out", out, x)
        argchecks.require_writable("out", out, seen=argchecks.with_strides)
    _checks.require_same_device({"x": x, "dy": dy, "mean": mean, "rstd": rstd, "dz": dz, "out": out})
    if (
        _use_cuda(x, weight, bias, z, g)
        and dy.dtype == x.dtype
        and (dz is None or dz.dtype == x.dtype)
        and (out is None or out.dtype == x.dtype)
        and rstd.dtype == torch.float32
        and (mean is None or is_rms_norm or mean.dtype == torch.float32)
    ):
        return _bwd_cuda(
            dy,
            x,
            weight,
            bias,
            z,
            mean,
            rstd,
            g,
            norm_before_gate,
            is_rms_norm,
            recompute_output,
            dz,
            out,
            eps,
        )
    dx, dw, db, dz_, y = _bwd_torch(dy, x, weight, bias, z, mean, rstd, g, norm_before_gate, is_rms_norm)
    dx = dx.to(x.dtype)
    dw = dw.to(weight.dtype)
    db = db.to(bias.dtype) if bias is not None else None
    if z is not None:
        dz = _into(dz, dz_, z.dtype)
    if not recompute_output:
        return dx, dw, db, dz
    return dx, dw, db, dz, _into(out, y, x.dtype)


def _into(target: Optional[Tensor], value: Tensor, dtype: torch.dtype) -> Tensor:
    if target is None:
        return value.to(dtype)
    with torch.no_grad():
        target.copy_(value)
    return target


def _bwd_cuda(
    dy, x, weight, bias, z, mean, rstd, g, norm_before_gate, is_rms_norm, recompute_output, dz, out, eps
):
    n = x.shape[1]
    x, z, dy = _unit_last(x), _unit_last(z), _unit_last(dy)
    ops = _ops()

    def unit(t):
        return t is not None and (t.stride(-1) == 1 or n <= 1)

    dx = torch.empty_like(x)
    dz_t = None
    if z is not None:
        dz_t = dz if unit(dz) else torch.empty_like(z)
    out_t = None
    if recompute_output:
        out_t = out if unit(out) else torch.empty_like(x)
    dw = torch.empty_like(weight, memory_format=torch.contiguous_format)
    db = torch.empty_like(bias, memory_format=torch.contiguous_format) if bias is not None else None
    pick(ops.bwd, ops.bwd_entry)(
        dy,
        x,
        weight.contiguous(),
        bias.contiguous() if bias is not None else None,
        z,
        None if is_rms_norm else mean.contiguous(),
        rstd.contiguous(),
        dx,
        dz_t,
        out_t,
        dw,
        db,
        float(eps),
        g,
        norm_before_gate,
        is_rms_norm,
    )
    if dz is not None and dz_t is not dz:
        dz.copy_(dz_t)
        dz_t = dz
    if not recompute_output:
        return dx, dw, db, dz_t
    if out is not None and out_t is not out:
        out.copy_(out_t)
        out_t = out
    return dx, dw, db, dz_t, out_t


# --- autograd and the public functions ---------------------------------------------------------


class LayerNormFn(torch.autograd.Function):
    """The gated norm with its backward; ``apply(x, weight, bias, z, eps, group_size,
    norm_before_gate, is_rms_norm)``. x (..., N); z None or x's shape."""

    @staticmethod
    def forward(
        ctx, x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True, is_rms_norm=False
    ):
        shape = x.shape
        rows = math.prod(shape[:-1])  # not -1: ambiguous when the channels are 0
        x2 = x.reshape(rows, shape[-1]) if x.dim() >= 1 else x
        z2 = z.reshape(rows, shape[-1]) if isinstance(z, Tensor) and z.shape == shape and x.dim() >= 1 else z
        y, mean, rstd = _layer_norm_fwd(
            x2,
            weight,
            bias,
            eps,
            z=z2,
            group_size=group_size,
            norm_before_gate=norm_before_gate,
            is_rms_norm=is_rms_norm,
        )
        ctx.save_for_backward(x2, weight, bias, mean, rstd, z2)
        ctx.shape = shape
        ctx.eps = eps
        ctx.group_size = group_size
        ctx.norm_before_gate = bool(norm_before_gate)
        ctx.is_rms_norm = bool(is_rms_norm)
        return y.reshape(shape)

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, mean, rstd, z = ctx.saved_tensors
        dy = dy.reshape(x.shape)
        dx, dw, db, dz = _layer_norm_bwd(
            dy, x, weight, bias, ctx.eps, mean, rstd, z, ctx.group_size, ctx.norm_before_gate, ctx.is_rms_norm
        )
        shape = ctx.shape
        return (
            dx.reshape(shape),
            dw,
            db,
            dz.reshape(shape) if dz is not None else None,
            None,
            None,
            None,
            None,
        )


def _checked_call(x, weight, bias, z, eps, group_size, norm_before_gate, is_rms_norm) -> Tensor:
    # checks before autograd records anything (the Function checks again on its 2-D view)
    if not is_compiling():
        norm_before_gate = _checks.require_bool("norm_before_gate", norm_before_gate)
        is_rms_norm = _checks.require_bool("is_rms_norm", is_rms_norm)
        _check(x, weight, bias, z, eps, group_size)
    return LayerNormFn.apply(x, weight, bias, z, eps, group_size, norm_before_gate, is_rms_norm)


def layernorm_fn(
    x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True, is_rms_norm=False
):
    """The gated LayerNorm (RMSNorm with ``is_rms_norm``) over x's last dim; x's shape and dtype."""
    return _checked_call(x, weight, bias, z, eps, group_size, norm_before_gate, is_rms_norm)


def rmsnorm_fn(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True):
    """The gated RMSNorm over x's last dim; x's shape and dtype."""
    return _checked_call(x, weight, bias, z, eps, group_size, norm_before_gate, True)


class _GatedNorm(torch.nn.Module):
    """The two modules' shared body: a learnable weight (ones) of ``hidden_size``, a bias
    (zeros) for the LayerNorm and a None parameter for the RMSNorm (as the original registers),
    ``forward(x, z=None)``; group_size None is one group of hidden_size channels."""

    is_rms_norm = False

    def __init__(
        self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True, device=None, dtype=None
    ):
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, **factory_kwargs))
        if self.is_rms_norm:
            self.register_parameter("bias", None)
        else:
            self.bias = torch.nn.Parameter(torch.empty(hidden_size, **factory_kwargs))
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate
        self.reset_parameters()

    def reset_parameters(self):
        torch.nn.init.ones_(self.weight)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def forward(self, x, z=None):
        fn = rmsnorm_fn if self.is_rms_norm else layernorm_fn
        return fn(x, self.weight, self.bias, z=z, eps=self.eps, group_size=self.group_size,
                  norm_before_gate=self.norm_before_gate)


class LayerNorm(_GatedNorm):
    """Gated LayerNorm with a learnable weight (ones) and bias (zeros) of ``hidden_size``;
    ``forward(x, z=None)``. group_size None is one group of hidden_size channels."""


class RMSNorm(_GatedNorm):
    """Gated RMSNorm with a learnable weight (ones) of ``hidden_size`` and no bias (a None
    parameter, as the original registers); ``forward(x, z=None)``."""

    is_rms_norm = True


__all__ = [
    "rms_norm_ref",
    "layer_norm_ref",
    "LayerNormFn",
    "layernorm_fn",
    "rmsnorm_fn",
    "LayerNorm",
    "RMSNorm",
]
