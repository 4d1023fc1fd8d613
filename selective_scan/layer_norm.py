"""Drop-in for ``mamba_ssm.ops.triton.layer_norm`` (mamba_ssm 2.3.2.post1) in plain PyTorch:
dropout + residual add + layer norm / RMS norm, with a parallel second branch, on any device and
any floating dtype, and no Triton anywhere.

Same names, positional order, defaults, return tuples, output dtypes and state-dict keys as the
original; mamba_ssm's own callers (its Block, MixerModel and rms_norm_forward) run on it unchanged.

The forward of a row, in the wide dtype (float32, or float64 when an input is float64):
``h = dropout(x * rowscale) [+ dropout(x1)] [+ residual]``, then ``y = norm(h) * weight + bias``
(``y1`` with weight1 / bias1 from the same normalized rows). ``residual_out`` is h stored in the
residual dtype (residual's, else float32 with residual_in_fp32, else x's); the backward reads it
back. Deliberate differences from the original (docs/CLIENTS.md, "mamba_ssm's layer_norm
module"):

* the dropout masks come from our own counter-based generator keyed by the same per-row seeds
  (drawn with ``torch.randint`` as the original draws them), so ``torch.manual_seed`` makes them
  reproducible, and equal on CPU and CUDA, but they are not the masks Triton's generator makes;
* float64 inputs are computed in float64 (the original's kernels compute in float32), and
  mean / rstd are then float64;
* ``bias1`` without ``weight1`` is refused (the original silently returns garbage for its
  gradient); wrong arguments get errors naming the argument, the rule and the value.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from mamba_kernels.runtime.argchecks import describe, error

from . import _norm_checks as checks
from ._amp import autocast_dtype, custom_bwd, custom_fwd
from .rms_norm import compute_dtype, normalized, normalized_grad, row_stats

Tensor = torch.Tensor

__all__ = [
    "layer_norm_ref",
    "rms_norm_ref",
    "layer_norm_fn",
    "rms_norm_fn",
    "LayerNormFn",
    "RMSNorm",
    "layer_norm_linear_fn",
    "LayerNormLinearFn",
]


# --- dropout: keep masks from per-row seeds --------------------------------------------------
#
# Each row r draws a seed s_r in [0, 2**32) with torch.randint (torch's generator, so
# torch.manual_seed governs it); element (r, c) is kept when a 32-bit hash of (s_r, c) is at
# least p * 2**32 (exactly: its top 24 bits reach ceil(p * 2**24)). The forward and the backward
# regenerate the same mask from the seeds, so no mask is kept between them. The hash runs on
# int64 tensors with every product below 2**49, so it is exact, and the same, on every device.

_M16, _M32 = 0xFFFF, 0xFFFFFFFF


def _mul32(a: Tensor, c: int) -> Tensor:
    """(a * c) mod 2**32 for a in [0, 2**32), from two 16-bit halves of c (no int64 overflow)."""
    return (a * (c & _M16) + (((a * (c >> 16)) & _M16) << 16)) & _M32


def _mix32(a: Tensor) -> Tensor:
    """A bijective 32-bit mixer (xor-shifts and odd multipliers): every input bit flips about
    half the output bits."""
    a = a ^ (a >> 16)
    a = _mul32(a, 0x85EBCA6B)
    a = a ^ (a >> 13)
    a = _mul32(a, 0xC2B2AE35)
    return a ^ (a >> 16)


def _keep_mask(seeds: Tensor, n: int, p: float) -> Tensor:
    """(len(seeds), n) bool: True where the element is kept, with probability 1 - p."""
    cols = torch.arange(n, device=seeds.device, dtype=torch.int64)
    h = _mix32(_mix32(seeds & _M32).unsqueeze(-1) ^ cols)
    return (_mix32(h) >> 8) >= math.ceil(p * 2**24)


def _dropped(h: Tensor, keep: Tensor, p: float) -> Tensor:
    """h with the dropped elements zeroed and the kept ones divided by 1 - p."""
    if p >= 1.0:
        return torch.zeros_like(h)
    return torch.where(keep, h / (1.0 - p), h.new_zeros(()))


# --- the forward and backward of (M, N) rows -------------------------------------------------


def _forward(x, weight, bias, eps, residual, x1, weight1, bias1, dropout_p, rowscale, out_dtype,
             residual_dtype, is_rms_norm, return_dropout_mask):
    """_layer_norm_fwd's work on checked arguments (x 2-D)."""
    if residual is not None:
        residual_dtype = residual.dtype
    m, n = x.shape
    wide = compute_dtype(x, weight, bias, residual, x1, weight1, bias1, rowscale)
    # x joins the residual in its add (type promotion converts it exactly, as x.to(wide) would):
    # one kernel fewer on the decode step's path, where every launch counts
    plain = rowscale is None and dropout_p == 0.0 and x1 is None and residual is not None
    h = x if plain else x.to(wide)
    if rowscale is not None:
        h = h * rowscale.to(wide).unsqueeze(-1)
    seeds = mask = mask1 = None
    if dropout_p > 0.0:
        seeds = torch.randint(2**32, (m if x1 is None else 2 * m,), device=x.device, dtype=torch.int64)
        keep = _keep_mask(seeds, n, dropout_p)
        mask, mask1 = (keep, None) if x1 is None else keep.tensor_split(2, dim=0)
        h = _dropped(h, mask, dropout_p)
    if x1 is not None:
        h1 = x1.to(wide)
        h = h + (h1 if mask1 is None else _dropped(h1, mask1, dropout_p))
    if residual is not None:
        h = h + residual.to(wide)  # with x itself (plain): promoted to wide, the same sum
    changed = residual is not None or dropout_p > 0.0 or rowscale is not None or x1 is not None
    if changed or (residual_dtype is not None and residual_dtype != x.dtype):
        residual_out = h.to(residual_dtype if residual_dtype is not None else x.dtype)
    else:
        residual_out = x
    mean, rstd = row_stats(h, eps, is_rms_norm)
    xhat = normalized(h, mean, rstd)
    y_dtype = x.dtype if out_dtype is None else out_dtype
    y = _affine(xhat, weight, bias, y_dtype)
    y1 = None if weight1 is None else _affine(xhat, weight1, bias1, y_dtype)
    if not return_dropout_mask:
        mask = mask1 = None
    return y, y1, mean, rstd, residual_out, seeds, mask, mask1


def _affine(xhat: Tensor, weight: Tensor, bias: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    # weight and bias are never wider than xhat (compute_dtype saw them): the products promote
    # them exactly, without a conversion kernel of their own
    y = xhat * weight
    if bias is not None:
        y = y + bias
    return y.to(dtype)


def _backward(dy, x, weight, bias, eps, mean, rstd, dresidual, dy1, weight1, bias1, seeds, dropout_p,
              rowscale, has_residual, has_x1, is_rms_norm, x_dtype, recompute_output):
    """_layer_norm_bwd's work on checked arguments; x is the forward's residual_out."""
    m, n = x.shape
    wide = compute_dtype(rstd, x, dy, dy1, weight, bias, weight1, bias1)
    xhat = normalized(x.to(wide), mean, rstd)
    dyw = dy.to(wide)
    g = dyw * weight.to(wide)
    dw = (dyw * xhat).sum(0).to(weight.dtype)
    db = None if bias is None else dyw.sum(0).to(bias.dtype)
    dw1 = db1 = None
    if weight1 is not None:
        dy1w = torch.zeros_like(xhat) if dy1 is None else dy1.to(wide)  # no dy1: zero gradients
        g = g + dy1w * weight1.to(wide)
        dw1 = (dy1w * xhat).sum(0).to(weight1.dtype)
        db1 = None if bias1 is None else dy1w.sum(0).to(bias1.dtype)
    dh = normalized_grad(xhat, rstd, g, is_rms_norm)
    if dresidual is not None:
        dh = dh + dresidual.to(wide)
    dx_dtype = x.dtype if x_dtype is None else x_dtype
    # as the original, one tensor serves two gradients where they are equal
    residual_is_dx = dx_dtype == x.dtype and dropout_p == 0.0 and rowscale is None
    dresidual_in = dh.to(x.dtype) if has_residual and not residual_is_dx else None
    keep = keep1 = None
    if dropout_p > 0.0:
        keep = _keep_mask(seeds, n, dropout_p)
        if has_x1:
            keep, keep1 = keep.tensor_split(2, dim=0)
    dxw = dh if keep is None else _dropped(dh, keep, dropout_p)
    if rowscale is not None:
        dxw = dxw * rowscale.to(wide).unsqueeze(-1)
    dx = dxw.to(dx_dtype)
    if has_residual and residual_is_dx:
        dresidual_in = dx
    dx1 = None
    if has_x1:
        dx1 = dx if keep1 is None else _dropped(dh, keep1, dropout_p).to(dx_dtype)
    grads = (dx, dw, db, dresidual_in, dx1, dw1, db1)
    if recompute_output:
        return grads + (_affine(xhat, weight, bias, dy.dtype),)
    return grads


def _layer_norm_fwd(
    x,
    weight,
    bias,
    eps,
    residual=None,
    x1=None,
    weight1=None,
    bias1=None,
    dropout_p=0.0,
    rowscale=None,
    out_dtype=None,
    residual_dtype=None,
    is_rms_norm=False,
    return_dropout_mask=False,
):
    """Normalize the rows of x (M, N): returns ``(y, y1, mean, rstd, residual_out, seeds,
    dropout_mask, dropout_mask1)``.

    y (and y1, None without weight1) in out_dtype (default x's); mean (None for the RMS norm)
    and rstd (M,) in float32 (float64 for float64 inputs); residual_out the pre-norm sum in the
    residual dtype, or x itself when nothing was added, scaled or dropped and the dtype is x's;
    seeds (M,) or (2M,) int64 when dropout_p > 0; the masks (True keeps) with
    return_dropout_mask and dropout_p > 0, else None.
    """
    checks.norm_inputs(x, weight, bias, eps, residual, x1, weight1, bias1, dropout_p, rowscale, two_d=True)
    checks.dtype_or_none("out_dtype", out_dtype)
    checks.dtype_or_none("residual_dtype", residual_dtype)
    is_rms_norm = checks.flag("is_rms_norm", is_rms_norm)
    return_dropout_mask = checks.flag("return_dropout_mask", return_dropout_mask)
    return _forward(x, weight, bias, eps, residual, x1, weight1, bias1, float(dropout_p), rowscale,
                    out_dtype, residual_dtype, is_rms_norm, return_dropout_mask)


def _layer_norm_bwd(
    dy,
    x,
    weight,
    bias,
    eps,
    mean,
    rstd,
    dresidual=None,
    dy1=None,
    weight1=None,
    bias1=None,
    seeds=None,
    dropout_p=0.0,
    rowscale=None,
    has_residual=False,
    has_x1=False,
    is_rms_norm=False,
    x_dtype=None,
    recompute_output=False,
):
    """Gradients of _layer_norm_fwd: returns ``(dx, dw, db, dresidual_in, dx1, dw1, db1)``, and
    y recomputed (in dy's dtype) as an eighth entry with recompute_output.

    x is the forward's residual_out (M, N); mean, rstd and seeds are the forward's. dx (and dx1)
    in x_dtype (default x's), dresidual_in in x's dtype (None without has_residual), dx1 None
    without has_x1; dw, db, dw1, db1 in their parameters' dtypes (None where those are None).
    """
    flags = [checks.flag(name, v) for name, v in (("has_residual", has_residual), ("has_x1", has_x1),
                                                   ("is_rms_norm", is_rms_norm),
                                                   ("recompute_output", recompute_output))]
    has_residual, has_x1, is_rms_norm, recompute_output = flags
    checks.backward_inputs(dy, x, weight, bias, eps, mean, rstd, dresidual, dy1, weight1, bias1, seeds,
                           dropout_p, rowscale, has_x1, is_rms_norm, recompute_output)
    checks.dtype_or_none("x_dtype", x_dtype)
    return _backward(dy, x, weight, bias, eps, None if is_rms_norm else mean, rstd, dresidual, dy1, weight1,
                     bias1, seeds, float(dropout_p), rowscale, has_residual, has_x1, is_rms_norm, x_dtype,
                     recompute_output)


# --- autograd -----------------------------------------------------------------------------------


def _rows(t: Optional[Tensor], m: int, n: int) -> Optional[Tensor]:
    return None if t is None else t.reshape(m, n)


class LayerNormFn(torch.autograd.Function):
    """The fused norm as an autograd Function: saves residual_out, the parameters, mean, rstd
    and the dropout seeds, as the original does, and nothing of the size of x more."""

    @staticmethod
    def forward(
        ctx,
        x,
        weight,
        bias,
        residual=None,
        x1=None,
        weight1=None,
        bias1=None,
        eps=1e-6,
        dropout_p=0.0,
        rowscale=None,
        prenorm=False,
        residual_in_fp32=False,
        is_rms_norm=False,
        return_dropout_mask=False,
    ):
        checks.norm_inputs(x, weight, bias, eps, residual, x1, weight1, bias1, dropout_p, rowscale)
        prenorm = checks.flag("prenorm", prenorm)
        residual_in_fp32 = checks.flag("residual_in_fp32", residual_in_fp32)
        is_rms_norm = checks.flag("is_rms_norm", is_rms_norm)
        return_dropout_mask = checks.flag("return_dropout_mask", return_dropout_mask)
        dropout_p = float(dropout_p)
        shape = x.shape
        m, n = math.prod(shape[:-1]), shape[-1]
        rowscale = None if rowscale is None else rowscale.reshape(m)
        if residual is not None:
            residual_dtype = residual.dtype
        else:
            residual_dtype = torch.float32 if residual_in_fp32 else None
        y, y1, mean, rstd, residual_out, seeds, mask, mask1 = _forward(
            x.reshape(m, n), weight, bias, eps, _rows(residual, m, n), _rows(x1, m, n), weight1, bias1,
            dropout_p, rowscale, None, residual_dtype, is_rms_norm, return_dropout_mask,
        )
        ctx.save_for_backward(residual_out, weight, bias, weight1, bias1, rowscale, seeds, mean, rstd)
        ctx.x_shape_og = shape
        ctx.eps = eps
        ctx.dropout_p = dropout_p
        ctx.is_rms_norm = is_rms_norm
        ctx.has_residual = residual is not None
        ctx.has_x1 = x1 is not None
        ctx.prenorm = prenorm
        ctx.x_dtype = x.dtype
        outs = [y.reshape(shape)]
        if weight1 is not None:
            outs.append(y1.reshape(shape))
        if prenorm:
            outs.append(residual_out.reshape(shape))
        if return_dropout_mask:
            masks = [None if k is None else k.reshape(shape) for k in (mask, mask1)]
            ctx.mark_non_differentiable(*[k for k in masks if k is not None])
            outs += masks
        return outs[0] if len(outs) == 1 else tuple(outs)

    @staticmethod
    def backward(ctx, dy, *args):
        x, weight, bias, weight1, bias1, rowscale, seeds, mean, rstd = ctx.saved_tensors
        shape = ctx.x_shape_og
        m, n = x.shape
        dy1 = None
        if weight1 is not None:
            dy1, args = _rows(args[0], m, n), args[1:]
        dresidual = _rows(args[0], m, n) if ctx.prenorm else None
        dx, dw, db, dresidual_in, dx1, dw1, db1 = _backward(
            dy.reshape(m, n), x, weight, bias, ctx.eps, mean, rstd, dresidual, dy1, weight1, bias1, seeds,
            ctx.dropout_p, rowscale, ctx.has_residual, ctx.has_x1, ctx.is_rms_norm, ctx.x_dtype, False,
        )
        return (
            dx.reshape(shape),
            dw,
            db,
            dresidual_in.reshape(shape) if ctx.has_residual else None,
            dx1.reshape(shape) if dx1 is not None else None,
            dw1,
            db1,
        ) + (None,) * 7


def layer_norm_fn(
    x,
    weight,
    bias,
    residual=None,
    x1=None,
    weight1=None,
    bias1=None,
    eps=1e-6,
    dropout_p=0.0,
    rowscale=None,
    prenorm=False,
    residual_in_fp32=False,
    is_rms_norm=False,
    return_dropout_mask=False,
):
    """Dropout + residual add + layer norm (RMS norm with is_rms_norm) over x's last dim.

    Returns y; then y1 when weight1 is given; then residual_out with prenorm; then
    (dropout_mask, dropout_mask1) with return_dropout_mask. Dropout applies whenever
    dropout_p > 0 (modules pass 0 in eval).
    """
    return LayerNormFn.apply(x, weight, bias, residual, x1, weight1, bias1, eps, dropout_p, rowscale, prenorm,
                             residual_in_fp32, is_rms_norm, return_dropout_mask)


def rms_norm_fn(
    x,
    weight,
    bias,
    residual=None,
    x1=None,
    weight1=None,
    bias1=None,
    eps=1e-6,
    dropout_p=0.0,
    rowscale=None,
    prenorm=False,
    residual_in_fp32=False,
    return_dropout_mask=False,
):
    """``layer_norm_fn`` with is_rms_norm=True."""
    return LayerNormFn.apply(x, weight, bias, residual, x1, weight1, bias1, eps, dropout_p, rowscale, prenorm,
                             residual_in_fp32, True, return_dropout_mask)


class RMSNorm(torch.nn.Module):
    """RMS norm with a learnable weight (ones at init) and no bias; parameters ``weight`` and
    ``bias`` (registered as None), so state dicts hold ``weight`` only, as the original's."""

    def __init__(self, hidden_size, eps=1e-5, dropout_p=0.0, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.drop = torch.nn.Dropout(dropout_p) if dropout_p > 0.0 else None
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        torch.nn.init.ones_(self.weight)

    def forward(self, x, residual=None, prenorm=False, residual_in_fp32=False):
        p = self.drop.p if self.drop is not None and self.training else 0.0
        return rms_norm_fn(x, self.weight, self.bias, residual=residual, eps=self.eps, dropout_p=p,
                           prenorm=prenorm, residual_in_fp32=residual_in_fp32)


class LayerNormLinearFn(torch.autograd.Function):
    """Residual add + norm, then a linear layer; y is recomputed in the backward rather than kept.
    Under CUDA autocast the norm's output and the linear run in the autocast dtype."""

    @staticmethod
    @custom_fwd
    def forward(
        ctx,
        x,
        norm_weight,
        norm_bias,
        linear_weight,
        linear_bias,
        residual=None,
        eps=1e-6,
        prenorm=False,
        residual_in_fp32=False,
        is_rms_norm=False,
    ):
        checks.norm_inputs(x, norm_weight, norm_bias, eps, residual,
                           extra={"linear_weight": linear_weight, "linear_bias": linear_bias})
        checks.tensor("linear_weight", linear_weight)
        n = x.shape[-1]
        if linear_weight.dim() != 2 or linear_weight.shape[1] != n:
            raise error(ValueError, "linear_weight", f"must be 2-D (out_features, N) with N = {n}",
                               describe(linear_weight))
        checks.tensor("linear_bias", linear_bias, optional=True)
        checks.shape("linear_bias", linear_bias, (linear_weight.shape[0],), "(out_features,)")
        prenorm = checks.flag("prenorm", prenorm)
        residual_in_fp32 = checks.flag("residual_in_fp32", residual_in_fp32)
        is_rms_norm = checks.flag("is_rms_norm", is_rms_norm)
        shape = x.shape
        m = math.prod(shape[:-1])
        if residual is not None:
            residual_dtype = residual.dtype
        else:
            residual_dtype = torch.float32 if residual_in_fp32 else None
        amp = autocast_dtype()
        y, _, mean, rstd, residual_out, *_rest = _forward(
            x.reshape(m, n), norm_weight, norm_bias, eps, _rows(residual, m, n), None, None, None, 0.0, None,
            amp, residual_dtype, is_rms_norm, False,
        )
        dtype = amp if amp is not None else y.dtype
        linear_weight = linear_weight.to(dtype)
        linear_bias = None if linear_bias is None else linear_bias.to(dtype)
        out = F.linear(y.to(dtype).reshape(shape), linear_weight, linear_bias)
        ctx.save_for_backward(residual_out, norm_weight, norm_bias, linear_weight, mean, rstd)
        ctx.x_shape_og = shape
        ctx.eps = eps
        ctx.is_rms_norm = is_rms_norm
        ctx.has_residual = residual is not None
        ctx.prenorm = prenorm
        ctx.x_dtype = x.dtype
        ctx.linear_bias_is_none = linear_bias is None
        return out if not prenorm else (out, residual_out.reshape(shape))

    @staticmethod
    @custom_bwd
    def backward(ctx, dout, *args):
        x, norm_weight, norm_bias, linear_weight, mean, rstd = ctx.saved_tensors
        shape = ctx.x_shape_og
        m, n = x.shape
        dout = dout.reshape(m, linear_weight.shape[0])
        dy = dout @ linear_weight
        dlinear_bias = None if ctx.linear_bias_is_none else dout.sum(0)
        dresidual = _rows(args[0], m, n) if ctx.prenorm else None
        dx, dnorm_weight, dnorm_bias, dresidual_in, _, _, _, y = _backward(
            dy, x, norm_weight, norm_bias, ctx.eps, mean, rstd, dresidual, None, None, None, None, 0.0, None,
            ctx.has_residual, False, ctx.is_rms_norm, ctx.x_dtype, True,
        )
        dlinear_weight = dout.t() @ y.to(dout.dtype)
        return (
            dx.reshape(shape),
            dnorm_weight,
            dnorm_bias,
            dlinear_weight,
            dlinear_bias,
            dresidual_in.reshape(shape) if ctx.has_residual else None,
            None,
            None,
            None,
            None,
        )


def layer_norm_linear_fn(
    x,
    norm_weight,
    norm_bias,
    linear_weight,
    linear_bias,
    residual=None,
    eps=1e-6,
    prenorm=False,
    residual_in_fp32=False,
    is_rms_norm=False,
):
    """``linear(norm(x [+ residual]))``; with prenorm also returns residual_out."""
    return LayerNormLinearFn.apply(x, norm_weight, norm_bias, linear_weight, linear_bias, residual, eps,
                                   prenorm, residual_in_fp32, is_rms_norm)


# --- references ---------------------------------------------------------------------------------


def _reference(x, weight, bias, residual, x1, weight1, bias1, eps, dropout_p, rowscale, prenorm,
               dropout_mask, dropout_mask1, upcast, is_rms_norm):
    checks.norm_inputs(x, weight, bias, eps, residual, x1, weight1, bias1, dropout_p, rowscale,
                       extra={"dropout_mask": dropout_mask, "dropout_mask1": dropout_mask1})
    checks.dropout_mask("dropout_mask", dropout_mask, x)
    checks.dropout_mask("dropout_mask1", dropout_mask1, x)
    prenorm = checks.flag("prenorm", prenorm)
    upcast = checks.flag("upcast", upcast)
    out_dtype = x.dtype
    if upcast:
        x, weight, bias, residual, x1, weight1, bias1 = (
            None if t is None else t.float() for t in (x, weight, bias, residual, x1, weight1, bias1)
        )
    if rowscale is not None:
        x = x * rowscale.unsqueeze(-1)
    if dropout_p > 0.0:
        x = _ref_dropout(x, dropout_mask, dropout_p)
        if x1 is not None:
            x1 = _ref_dropout(x1, dropout_mask1, dropout_p)
    if x1 is not None:
        x = x + x1
    if residual is not None:
        x = (x + residual).to(x.dtype)

    def norm(w, b):
        if is_rms_norm:
            rstd = 1 / torch.sqrt(x.square().mean(-1, keepdim=True) + eps)
            y = x * rstd * w
            return (y if b is None else y + b).to(out_dtype)
        return F.layer_norm(x.to(w.dtype), x.shape[-1:], weight=w, bias=b, eps=eps).to(out_dtype)

    outs = [norm(weight, bias)]
    if weight1 is not None:
        outs.append(norm(weight1, bias1))
    if prenorm:
        outs.append(x)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _ref_dropout(x: Tensor, mask: Optional[Tensor], p: float) -> Tensor:
    if mask is None:
        return F.dropout(x, p=p)
    return x.masked_fill(~mask, 0.0) / (1.0 - p)


def layer_norm_ref(
    x,
    weight,
    bias,
    residual=None,
    x1=None,
    weight1=None,
    bias1=None,
    eps=1e-6,
    dropout_p=0.0,
    rowscale=None,
    prenorm=False,
    dropout_mask=None,
    dropout_mask1=None,
    upcast=False,
):
    """The layer norm of ``layer_norm_fn`` by unfused torch ops (in x's dtype, float32 with
    upcast): y, then y1 with weight1, then the pre-norm sum with prenorm. Given dropout masks
    (True keeps) replace the random ones."""
    return _reference(x, weight, bias, residual, x1, weight1, bias1, eps, dropout_p, rowscale, prenorm,
                      dropout_mask, dropout_mask1, upcast, False)


def rms_norm_ref(
    x,
    weight,
    bias,
    residual=None,
    x1=None,
    weight1=None,
    bias1=None,
    eps=1e-6,
    dropout_p=0.0,
    rowscale=None,
    prenorm=False,
    dropout_mask=None,
    dropout_mask1=None,
    upcast=False,
):
    """``layer_norm_ref`` for the RMS norm."""
    return _reference(x, weight, bias, residual, x1, weight1, bias1, eps, dropout_p, rowscale, prenorm,
                      dropout_mask, dropout_mask1, upcast, True)
