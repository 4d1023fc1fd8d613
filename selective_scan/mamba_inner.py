"""``MambaInnerFn`` / ``mamba_inner_fn``: the fused training path of the Mamba block, and
``mamba_inner_ref``, the same block composed from the public functions.

Forward: split xz into x and z (channel views), causal conv1d + SiLU on x, project to
(dt, B, C), ``delta = delta_proj_weight @ dt``, optional non-learnable RMS norms on B, C
and delta, the selective scan gated by z, and the output projection.
Backward allocates ``dxz = empty_like(xz)`` and writes dz (scan backward) and dx (conv
backward) in place into its two channel views, as mamba_ssm does.

Every projection is composed as mamba_ssm 2.3.2 composes it: the same products in the same
operand order and the same layouts (delta and the output gradient are (dim, batch*L) products
seen as (batch, dim, L), so dim is their slowest axis), the same casts under autocast. With the
same scan, results agree with mamba_ssm's to the last bit of the matmuls; tests whose tolerances
assume that composition (large outputs from random weights) pass. Deliberate differences: the
output-bias gradient is the sum over tokens (mamba_ssm's sums it to a scalar), and the gradient
flows through the non-learnable RMS norms (mamba_ssm's backward skips their Jacobian).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from causal_conv1d import causal_conv1d_fn
from causal_conv1d.cpp_functions import causal_conv1d_bwd_function, causal_conv1d_fwd_function
from mamba_kernels.runtime import argchecks, dispatch, knobs

from . import _amp, _checks, pytorch_scan
from .rms_norm import rms_norm_backward, rms_norm_forward
from .scan_fn import (
    _CUDA_A_DTYPES,
    _CUDA_INPUT_DTYPES,
    KERNEL,
    SPACED_BWD_ARGS,
    _as_4d,
    selective_scan_fn,
    spaced_fwd_args,
)

Tensor = torch.Tensor


def _rows(t: Tensor) -> Tensor:
    """(batch, d, L) -> (batch*L, d)."""
    return t.transpose(1, 2).reshape(-1, t.shape[1])


def _cols(t: Tensor) -> Tensor:
    """(batch, d, L) -> (d, batch*L) (a view when d is the slowest axis, as for delta)."""
    return t.transpose(0, 1).reshape(t.shape[1], -1)


# (batch and L are passed, not inferred from batch*L: with an empty batch that product says nothing)


def _uncols(t: Tensor, batch: int, L: int) -> Tensor:
    """(d, batch*L) -> (batch, d, L), a view with d the slowest axis."""
    return t.view(t.shape[0], batch, L).transpose(0, 1)


def _unrows(t: Tensor, batch: int, L: int) -> Tensor:
    """(batch*L, d) -> (batch, d, L), a transposed view."""
    return t.view(batch, L, t.shape[-1]).transpose(1, 2)


def _var_bc(rows: Tensor, batch: int, L: int, is_complex: bool) -> Tensor:
    """(batch*L, d_state) slice of x_dbl -> (batch, 1, dstate, L) (``2L`` interleaved if complex)."""
    if not is_complex:
        return _unrows(rows, batch, L).unsqueeze(1).contiguous()
    t = rows.reshape(batch, L, rows.shape[1] // 2, 2).permute(0, 2, 1, 3)  # (b, n, L, 2)
    return t.reshape(batch, 1, t.shape[1], 2 * L)


def _var_bc_rows(grad: Tensor) -> Tensor:
    """Inverse of ``_var_bc`` for the scan's dB/dC (batch, 1, n, L), real or complex."""
    g = grad[:, 0]
    if g.is_complex():
        g = torch.view_as_real(g).permute(0, 2, 1, 3)  # (b, L, n, 2)
        return g.reshape(-1, g.shape[2] * 2)
    return g.transpose(1, 2).reshape(-1, g.shape[1])


def _scan_form(grad: Tensor, bc: Tensor, A: Tensor) -> Tensor:
    """The compiled backward's dB/dC in the PyTorch backward's form: variable ones as
    (batch, G, n, L), complex for complex A (the op returns interleaved real/imag pairs)."""
    if bc.dim() == 2:
        return grad
    grad = grad if grad.dim() == 4 else grad.unsqueeze(1)
    if not A.is_complex():
        return grad
    return torch.view_as_complex(grad.float().unflatten(-1, (-1, 2)).contiguous())


class _Projected:
    """delta, B and C as the scan sees them, from x_dbl (and their pre-norm values)."""

    def __init__(
        self,
        x_dbl,
        delta_proj_weight,
        A,
        B,
        C,
        B_proj_bias,
        C_proj_bias,
        b_rms_weight,
        c_rms_weight,
        dt_rms_weight,
        eps,
        batch,
        L,
    ):
        dt_rank = delta_proj_weight.shape[1]
        d_state = A.shape[1] * (2 if A.is_complex() else 1)
        delta_cols = delta_proj_weight @ x_dbl[:, :dt_rank].t()  # (d_inner, b*L)
        self.delta_pre = delta_cols.t()  # (b*L, d_inner): what the dt norm sees
        if dt_rms_weight is None:
            self.delta = _uncols(delta_cols, batch, L)
        else:
            rows = rms_norm_forward(self.delta_pre.contiguous(), dt_rms_weight, None, eps)
            self.delta = _unrows(rows, batch, L).contiguous()
        self.B_pre = self.C_pre = None
        self.B, self.C = B, C
        if B is None:
            self.B_pre = x_dbl[:, dt_rank : dt_rank + d_state]
            if B_proj_bias is not None:
                self.B_pre = self.B_pre + B_proj_bias.to(self.B_pre.dtype)
            rows = (
                self.B_pre if b_rms_weight is None else rms_norm_forward(self.B_pre, b_rms_weight, None, eps)
            )
            self.B = _var_bc(rows, batch, L, A.is_complex())
        if C is None:
            self.C_pre = x_dbl[:, -d_state:]
            if C_proj_bias is not None:
                self.C_pre = self.C_pre + C_proj_bias.to(self.C_pre.dtype)
            rows = (
                self.C_pre if c_rms_weight is None else rms_norm_forward(self.C_pre, c_rms_weight, None, eps)
            )
            self.C = _var_bc(rows, batch, L, A.is_complex())


def _through_norm(pre: Tensor, weight: Optional[Tensor], eps: float, grad_rows: Tensor) -> Tensor:
    return grad_rows.to(pre.dtype) if weight is None else rms_norm_backward(pre, weight, eps, grad_rows)


def _scan_backward(ctx, proj, conv1d_out, delta, A, D, z, delta_bias, dout_y, dz, ckpt, y):
    """The scan's gradients (conv output, delta, A, B, C, D, delta bias) and ``y * silu(z)``,
    from the compiled kernel or the PyTorch path; dz is written in place."""
    if ctx.cuda:
        from . import _ops  # loads the compiled extension, which only the CUDA path needs

        Bs, Cs, softplus = _as_4d(proj.B), _as_4d(proj.C), ctx.delta_softplus
        if ckpt is None:  # recompute, with no spaced states: the states and y (no gate)
            y, _, ckpt = _ops.fwd(conv1d_out, delta, A, Bs, Cs, D, None, delta_bias, softplus, True)
        out_z = torch.empty_like(z)  # y silu(z), written by the backward kernel in the same pass
        dconv1d_out, ddelta, dA, dB, dC, dD, ddelta_bias = _ops.bwd(
            conv1d_out, delta, A, Bs, Cs, D, z, delta_bias, dout_y, ckpt, y, dz, out_z,
            ctx.delta_softplus, *ctx.bwd_layout,
        )
        dB, dC = (_scan_form(g, t, A) for g, t in ((dB, proj.B), (dC, proj.C)))
        return dconv1d_out, ddelta, dA, dB, dC, dD, ddelta_bias, out_z
    p = pytorch_scan.make_problem(
        conv1d_out, delta, A, proj.B, proj.C, D, z, delta_bias, ctx.delta_softplus, ctx.groups
    )
    dconv1d_out, ddelta, dA, dB, dC, dD, ddelta_bias, _, out_z = pytorch_scan.backward(
        p, dout_y, dz=dz, recompute_out_z=True, checkpoints=ckpt, y=y
    )
    return dconv1d_out, ddelta, dA, dB, dC, dD, ddelta_bias, out_z


def _bc_grads(given, grad, pre, rms_weight, eps, proj_bias, bias_dtype):
    """(the gradient of a given B or C, of a variable one's x_dbl rows, of its projection bias):
    a given one gets its own shape back (3-D without the group axis, or real pairs)."""
    if given is not None:
        return pytorch_scan.grad_as_given(grad, given), None, None
    dpre = _through_norm(pre, rms_weight, eps, _var_bc_rows(grad))
    return None, dpre, (dpre.sum(0).to(bias_dtype) if proj_bias is not None else None)


def _delta_grads(ddelta, delta_pre, dt_rms_weight, eps, x_dbl, delta_proj_weight, dx_dbl):
    """delta_proj_weight's gradient; delta's part of x_dbl's is written into ``dx_dbl``."""
    dt_rank = delta_proj_weight.shape[1]
    if dt_rms_weight is None:
        ddelta_cols = _cols(ddelta)  # (d_inner, b*L)
    else:
        ddelta_cols = rms_norm_backward(delta_pre, dt_rms_weight, eps, _rows(ddelta)).t()
    ddelta_proj_weight = torch.einsum("dB,Br->dr", ddelta_cols, x_dbl[:, :dt_rank])
    dx_dbl[:, :dt_rank] = torch.einsum("dB,dr->Br", ddelta_cols, delta_proj_weight)
    return ddelta_proj_weight


def _through_x_proj(dx_dbl, dconv1d_out, conv1d_out, x_proj_weight, batch, L):
    """(x_proj_weight's gradient, the conv output's gradient with x_dbl's added)."""
    dconv_cols = _cols(dconv1d_out).to(dx_dbl.dtype)
    dx_proj_weight = torch.einsum("Br,Bd->rd", dx_dbl, _rows(conv1d_out).to(dx_dbl.dtype))
    dconv_cols = torch.addmm(dconv_cols, x_proj_weight.t(), dx_dbl.t(), out=dconv_cols)
    return dx_proj_weight, _uncols(dconv_cols, batch, L)


class MambaInnerFn(torch.autograd.Function):
    @staticmethod
    @_amp.custom_fwd
    def forward(
        ctx,
        xz,
        conv1d_weight,
        conv1d_bias,
        x_proj_weight,
        delta_proj_weight,
        out_proj_weight,
        out_proj_bias,
        A,
        B=None,
        C=None,
        D=None,
        delta_bias=None,
        B_proj_bias=None,
        C_proj_bias=None,
        delta_softplus=True,
        checkpoint_lvl=1,
        b_rms_weight=None,
        c_rms_weight=None,
        dt_rms_weight=None,
        b_c_dt_rms_eps=1e-6,
    ):
        """Long: the fused layer's forward as one sequence (conv, x projection, delta, B and C, the scan,
        the out projection), in the order of the original's MambaInnerFn.forward, so the two read side
        by side and the tensors saved for the backward are named where they are made."""
        delta_softplus = _checks.require_bool("delta_softplus", delta_softplus)
        rms = {"b_rms_weight": b_rms_weight, "c_rms_weight": c_rms_weight, "dt_rms_weight": dt_rms_weight}
        cast = _amp.autocast_dtype()
        biases = {"conv1d_bias": conv1d_bias, "out_proj_bias": out_proj_bias, "B_proj_bias": B_proj_bias,
                  "C_proj_bias": C_proj_bias}
        _checks.check_mamba_inner(
            xz, conv1d_weight, x_proj_weight, delta_proj_weight, out_proj_weight, A, B, C, checkpoint_lvl,
            rms, biases, b_c_dt_rms_eps, cast is not None,
        )
        # an empty problem (batch, d_inner or L of 0) runs the PyTorch path on any device
        use_cuda = not argchecks.is_empty(xz) and dispatch.use_cuda(KERNEL, xz.device.type)
        if cast is not None:
            x_proj_weight = x_proj_weight.to(cast)
            delta_proj_weight = delta_proj_weight.to(cast)
            out_proj_weight = out_proj_weight.to(cast)
            out_proj_bias = out_proj_bias.to(cast) if out_proj_bias is not None else None
        if xz.stride(-1) != 1:
            xz = xz.contiguous()
        batch = xz.shape[0]
        weight = conv1d_weight[:, 0]
        x, z = xz.chunk(2, dim=1)
        conv1d_out = causal_conv1d_fwd_function(x, weight, conv1d_bias, None, None, None, True)
        x_dbl = F.linear(_rows(conv1d_out), x_proj_weight)  # (b*L, dt_rank + n_var*d_state)
        proj = _Projected(
            x_dbl,
            delta_proj_weight,
            A,
            B,
            C,
            B_proj_bias,
            C_proj_bias,
            b_rms_weight,
            c_rms_weight,
            dt_rms_weight,
            b_c_dt_rms_eps,
            batch,
            xz.shape[-1],
        )
        groups = _checks.check_selective_scan(conv1d_out, proj.delta, A, proj.B, proj.C, D, z, delta_bias)
        use_cuda = use_cuda and conv1d_out.dtype in _CUDA_INPUT_DTYPES and A.dtype in _CUDA_A_DTYPES
        # with gradients to come, what the original holds: the ungated output and a state every
        # 1024 steps, from which the backward kernel recomputes the rest (spaced_fwd_args; where
        # it cannot, nothing, and the backward reruns the forward scan), unless
        # MAMBA_KERNELS_SCAN_STATES=keep holds a state every 64 steps; without, the kernel does
        # not even write y
        grads = any(ctx.needs_input_grad)
        form = knobs.scan_states_for(knobs.RECOMPUTE)
        layout = spaced_fwd_args(A, xz.shape[-1]) if grads and use_cuda and form == knobs.RECOMPUTE else ()
        ctx.bwd_layout = SPACED_BWD_ARGS if layout else ()
        keep_states = grads and (form == knobs.KEEP or bool(layout))
        if use_cuda:
            from . import _ops

            Bs, Cs = _as_4d(proj.B), _as_4d(proj.C)
            y, out_z, ckpt = _ops.fwd(
                conv1d_out, proj.delta, A, Bs, Cs, D, z, delta_bias, delta_softplus, keep_states, *layout
            )
        else:
            p = pytorch_scan.make_problem(
                conv1d_out, proj.delta, A, proj.B, proj.C, D, z, delta_bias, delta_softplus, groups
            )
            y, out_z, _, *ckpt = pytorch_scan.forward(p, False, checkpoints=keep_states)
            ckpt = ckpt[0] if keep_states else None
        scan_saved = (ckpt, y) if keep_states else (None, None)
        ctx.cuda = use_cuda
        ctx.delta_softplus = delta_softplus
        ctx.groups = groups
        ctx.checkpoint_lvl = checkpoint_lvl
        ctx.eps = b_c_dt_rms_eps
        ctx.has_out_proj_bias = out_proj_bias is not None
        ctx.proj_bias_dtypes = tuple(None if t is None else t.dtype for t in (B_proj_bias, C_proj_bias))
        keep = (conv1d_out, proj.delta) if checkpoint_lvl == 0 else (None, None)
        ctx.save_for_backward(
            xz,
            conv1d_weight,
            conv1d_bias,
            x_dbl,
            x_proj_weight,
            delta_proj_weight,
            out_proj_weight,
            A,
            B,
            C,
            D,
            delta_bias,
            B_proj_bias,
            C_proj_bias,
            b_rms_weight,
            c_rms_weight,
            dt_rms_weight,
            *keep,
            *scan_saved,
        )
        return F.linear(out_z.transpose(1, 2), out_proj_weight, out_proj_bias)

    @staticmethod
    @_amp.custom_bwd
    def backward(ctx, dout):
        """Long: the forward's steps in reverse, each recomputed tensor next to the gradient that needs it,
        in the order of the original's MambaInnerFn.backward."""
        (
            xz,
            conv1d_weight,
            conv1d_bias,
            x_dbl,
            x_proj_weight,
            delta_proj_weight,
            out_proj_weight,
            A,
            B,
            C,
            D,
            delta_bias,
            B_proj_bias,
            C_proj_bias,
            b_rms_weight,
            c_rms_weight,
            dt_rms_weight,
            conv1d_out,
            delta,
            ckpt,
            y,
        ) = ctx.saved_tensors
        eps = ctx.eps
        batch = xz.shape[0]
        dt_rank = delta_proj_weight.shape[1]
        d_state = A.shape[1] * (2 if A.is_complex() else 1)
        weight = conv1d_weight[:, 0]
        x, z = xz.chunk(2, dim=1)
        if ctx.checkpoint_lvl == 1:
            conv1d_out = causal_conv1d_fwd_function(x, weight, conv1d_bias, None, None, None, True)
        proj = _Projected(
            x_dbl,
            delta_proj_weight,
            A,
            B,
            C,
            B_proj_bias,
            C_proj_bias,
            b_rms_weight,
            c_rms_weight,
            dt_rms_weight,
            eps,
            batch,
            xz.shape[-1],
        )
        if delta is None:
            delta = proj.delta
        dxz = torch.empty_like(xz)
        dx, dz = dxz.chunk(2, dim=1)
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        dout_cols = dout.reshape(-1, dout.shape[-1]).t()  # (d_model, b*L)
        dout_y = _uncols(out_proj_weight.t().to(dout_cols.dtype) @ dout_cols, batch, xz.shape[-1])
        # dz is written in place into its view of dxz
        dconv1d_out, ddelta, dA, dB, dC, dD, ddelta_bias, out_z = _scan_backward(
            ctx, proj, conv1d_out, delta, A, D, z, delta_bias, dout_y, dz, ckpt, y
        )
        dout_proj_weight = torch.einsum("eB,dB->ed", dout_cols, _cols(out_z).to(dout_cols.dtype))
        dout_proj_bias = dout_cols.sum(1) if ctx.has_out_proj_bias else None
        # what reaches x_dbl: the rows of a variable B and C, then delta's
        dx_dbl = torch.zeros_like(x_dbl)
        dB, dpre, dB_proj_bias = _bc_grads(B, dB, proj.B_pre, b_rms_weight, eps, B_proj_bias,
                                           ctx.proj_bias_dtypes[0])
        if dpre is not None:
            dx_dbl[:, dt_rank : dt_rank + d_state] = dpre
        dC, dpre, dC_proj_bias = _bc_grads(C, dC, proj.C_pre, c_rms_weight, eps, C_proj_bias,
                                           ctx.proj_bias_dtypes[1])
        if dpre is not None:
            dx_dbl[:, x_dbl.shape[1] - d_state :] = dpre
        ddelta_proj_weight = _delta_grads(ddelta, proj.delta_pre, dt_rms_weight, eps, x_dbl,
                                          delta_proj_weight, dx_dbl)
        dx_proj_weight, dconv1d_out = _through_x_proj(dx_dbl, dconv1d_out, conv1d_out, x_proj_weight, batch,
                                                         xz.shape[-1])
        # dx is written in place into its view of dxz
        _, dweight, dconv1d_bias, _ = causal_conv1d_bwd_function(
            x, weight, conv1d_bias, dconv1d_out, None, None, None, dx, False, True
        )
        return (
            dxz,
            dweight.unsqueeze(1),
            dconv1d_bias,
            dx_proj_weight,
            ddelta_proj_weight,
            dout_proj_weight,
            dout_proj_bias,
            dA.to(A.dtype),
            dB,
            dC,
            dD.to(D.dtype) if D is not None else None,
            ddelta_bias.to(delta_bias.dtype) if delta_bias is not None else None,
            dB_proj_bias,
            dC_proj_bias,
            None,
            None,
            None,
            None,
            None,
            None,
        )


def mamba_inner_fn(
    xz,
    conv1d_weight,
    conv1d_bias,
    x_proj_weight,
    delta_proj_weight,
    out_proj_weight,
    out_proj_bias,
    A,
    B=None,
    C=None,
    D=None,
    delta_bias=None,
    B_proj_bias=None,
    C_proj_bias=None,
    delta_softplus=True,
    checkpoint_lvl=1,
    b_rms_weight=None,
    c_rms_weight=None,
    dt_rms_weight=None,
    b_c_dt_rms_eps=1e-6,
):
    """The Mamba block's inner computation, xz (batch, 2*d_inner, L) -> (batch, L, d_model).

    B/C None means input-dependent (taken from x_proj). checkpoint_lvl 1 recomputes the
    conv output and delta in the backward instead of keeping them. The RMS weights are
    non-learnable (no gradient); the gradient does flow through the norms to x_proj.
    """
    return MambaInnerFn.apply(
        xz,
        conv1d_weight,
        conv1d_bias,
        x_proj_weight,
        delta_proj_weight,
        out_proj_weight,
        out_proj_bias,
        A,
        B,
        C,
        D,
        delta_bias,
        B_proj_bias,
        C_proj_bias,
        delta_softplus,
        checkpoint_lvl,
        b_rms_weight,
        c_rms_weight,
        dt_rms_weight,
        b_c_dt_rms_eps,
    )


def mamba_inner_ref(
    xz,
    conv1d_weight,
    conv1d_bias,
    x_proj_weight,
    delta_proj_weight,
    out_proj_weight,
    out_proj_bias,
    A,
    B=None,
    C=None,
    D=None,
    delta_bias=None,
    B_proj_bias=None,
    C_proj_bias=None,
    delta_softplus=True,
):
    """mamba_inner_fn from the public functions (no RMS norms, no checkpointing).

    Like mamba_ssm's, it always applies the softplus: ``delta_softplus`` (a bool) is ignored.
    """
    _checks.require_bool("delta_softplus", delta_softplus)
    biases = {"conv1d_bias": conv1d_bias, "out_proj_bias": out_proj_bias, "B_proj_bias": B_proj_bias,
              "C_proj_bias": C_proj_bias}
    _checks.check_mamba_inner(
        xz, conv1d_weight, x_proj_weight, delta_proj_weight, out_proj_weight, A, B, C, 1, {}, biases,
        autocast=_amp.autocast_dtype() is not None,
    )
    batch = xz.shape[0]
    dt_rank = delta_proj_weight.shape[1]
    d_state = A.shape[-1] * (2 if A.is_complex() else 1)
    x, z = xz.chunk(2, dim=1)
    x = causal_conv1d_fn(x, conv1d_weight[:, 0], conv1d_bias, activation="silu")
    x_dbl = F.linear(_rows(x), x_proj_weight)
    L = xz.shape[-1]
    delta = _uncols(delta_proj_weight @ x_dbl[:, :dt_rank].t(), batch, L)

    def variable(rows: Tensor, bias: Optional[Tensor]) -> Tensor:
        if bias is not None:
            rows = rows + bias.to(rows.dtype)
        return _var_bc(rows, batch, L, A.is_complex())[:, 0]

    if B is None:
        B = variable(x_dbl[:, dt_rank : dt_rank + d_state], B_proj_bias)
    if C is None:
        C = variable(x_dbl[:, -d_state:], C_proj_bias)
    y = selective_scan_fn(x, delta, A, B, C, D, z=z, delta_bias=delta_bias, delta_softplus=True)
    return F.linear(y.transpose(1, 2), out_proj_weight, out_proj_bias)


__all__ = ["MambaInnerFn", "mamba_inner_fn", "mamba_inner_ref"]
