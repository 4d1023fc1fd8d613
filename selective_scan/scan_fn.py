"""``SelectiveScanFn``, ``selective_scan_fn`` and the per-step ``selective_scan_ref``."""

from __future__ import annotations

import sys
from typing import Optional

import torch
import torch.nn.functional as F

from mamba_kernels.runtime import argchecks, dispatch, knobs
from mamba_kernels.runtime.library import pick

from . import _checks, pytorch_scan

Tensor = torch.Tensor
KERNEL = "selective_scan"
_PACKAGE = sys.modules[__package__]


def _opt_to(t: Optional[Tensor], like: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None or like is None else t.to(like.dtype)


# What the compiled kernels take; anything else (float64) runs the PyTorch path.
_CUDA_INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_CUDA_A_DTYPES = (torch.float32, torch.complex64)


def _as_4d(t: Tensor) -> Tensor:
    """Variable B/C as (batch, ngroups, dstate, L): the kernels' one layout (a view)."""
    return t.unsqueeze(1) if t.dim() == 3 else t


def _ops_module():
    """``selective_scan._ops``, imported on first use (importing it loads the extension), then
    read from the package: what ``from . import _ops`` returns, without its per-call cost."""
    ops = getattr(_PACKAGE, "_ops", None)
    if ops is None:
        from . import _ops as ops
    return ops


# The backward kernel for real A and dstate <= 16 (csrc/selective_scan/bwd_lanes.cu) starts from
# states up to 1024 steps apart and recomputes the 64-step chunk starts in between (bitwise what
# states every 64 steps give): a scan that keeps a state every SPACED_STEPS steps, in pairs (the
# layout of selective_scan_cuda's x), holds what the original holds and needs no second forward.
SPACED_STEPS = 1024
SPACED_MAX_DSTATE = 16  # the lane kernels' states per channel (LanePolicy::kLanes)
SPACED_BWD_ARGS = (SPACED_STEPS, True)  # the backward op's state_steps, state_pairs for them


def paired_fwd_args(L: int) -> tuple:
    """The forward op's (state_steps, state_count, state_pairs) for a state every SPACED_STEPS
    steps, slots 2r and 2r + 1 interleaved: the last slot is always the final state."""
    return SPACED_STEPS, 2 * -(-L // (2 * SPACED_STEPS)), True


# Shared memory a block of that backward takes (kSpacedSmemBytes in csrc/selective_scan/bwd_lanes.cu):
# more than sm_75 (Turing) allows, 64 KB.
SPACED_BWD_SHARED_BYTES = 81408
_SPACED_DEVICE_FITS: dict = {}  # CUDA device index -> whether its blocks hold that


def spaced_device_fits(device: torch.device) -> bool:
    """Whether a block of the spaced backward fits the shared memory of ``device`` (a CUDA device;
    measured once per device)."""
    return _index_fits(device.index if device.index is not None else torch.cuda.current_device())


def _index_fits(index: int) -> bool:
    fits = _SPACED_DEVICE_FITS.get(index)
    if fits is None:
        props = torch.cuda.get_device_properties(index)
        optin = getattr(props, "shared_memory_per_block_optin", None)  # (older torch: the capability)
        fits = optin >= SPACED_BWD_SHARED_BYTES if optin is not None else (props.major, props.minor) >= (8, 0)
        _SPACED_DEVICE_FITS[index] = fits
    return fits


def spaced_states_fit(A: Tensor) -> bool:
    """Whether the backward can start from states SPACED_STEPS apart: the lane kernel's problems
    (real A, dstate up to its lanes), on a device whose blocks hold its shared memory."""
    if A.is_complex() or A.shape[1] > SPACED_MAX_DSTATE:
        return False
    # (is_cuda and get_device: flag and index reads; A.device builds an object, on a per-call path)
    return not A.is_cuda or _index_fits(A.get_device())


def spaced_fwd_args(A: Tensor, L: int) -> tuple:
    """``paired_fwd_args(L)`` where the backward can start from such states, else () (the
    forward op's default: a state every 64 steps)."""
    return paired_fwd_args(L) if spaced_states_fit(A) else ()


def final_state(ckpt: Tensor, paired: bool) -> Tensor:
    """The final state in the forward op's states (a view; real A when ``paired``)."""
    if not paired:
        return ckpt[:, :, -1]
    b, d, rows, n2 = ckpt.shape
    return ckpt.view(b, d, rows, n2 // 2, 2)[:, :, -1, :, 1]


def _use_cuda(u: Tensor, A: Tensor) -> bool:
    # u.is_cuda is a flag read; u.device.type builds a device object and a string. An empty
    # problem (batch, dim or L of 0) runs the PyTorch path, on any device (argchecks.is_empty).
    return (
        not argchecks.is_empty(u)
        and dispatch.use_cuda(KERNEL, "cuda" if u.is_cuda else u.device.type)
        and u.dtype in _CUDA_INPUT_DTYPES
        and A.dtype in _CUDA_A_DTYPES
    )


def _forward(use_cuda, groups, keep, u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state,
             layout=()):
    """(result, last state or None, the two tensors the backward starts from or Nones): the
    forward of ``SelectiveScanFn``, and all of ``selective_scan_fn`` when autograd records
    nothing (``keep`` False). ``layout``: the compiled forward's state arguments (spaced_fwd_args)."""
    if use_cuda:
        keep_y = z is None or keep  # y is the result without z; with z, kept for the backward
        ops = _ops_module()
        op = pick(ops.fwd, ops.fwd_entry)
        out, out_z, ckpt = op(
            u, delta, A, _as_4d(B), _as_4d(C), D, z, delta_bias, delta_softplus, keep_y, *layout
        )
        saved = (ckpt, out if z is not None else None) if keep else (None, None)
        result = out_z if z is not None else out
        last = None
        if return_last_state:
            last = final_state(ckpt, bool(layout)).clone()  # not a view: the saved states stay intact
            if A.is_complex():
                last = torch.view_as_complex(last.unflatten(-1, (-1, 2)))
        return result, last, saved
    p = pytorch_scan.make_problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus, groups)
    out, out_z, last_state, *ckpt = pytorch_scan.forward(p, bool(return_last_state), checkpoints=keep)
    saved = (ckpt[0] if keep else None, out if keep and z is not None else None)
    return (out_z if z is not None else out), last_state, saved


def _records(tensors) -> bool:
    """Whether autograd would record an op on these (None never counts)."""
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return True
    return False


class SelectiveScanFn(torch.autograd.Function):
    """``out = selective_scan(u, delta, A, B, C, D, z, delta_bias)``; last state is not differentiated."""

    @staticmethod
    def forward(
        ctx, u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, return_last_state=False
    ):
        groups = _checks.check_selective_scan(u, delta, A, B, C, D, z, delta_bias)
        ctx.delta_softplus = bool(delta_softplus)
        ctx.groups = groups
        use_cuda = _use_cuda(u, A)
        ctx.cuda = use_cuda
        # With gradients to come, keep the states every 64 steps (and the ungated y with z) for
        # the backward, unless MAMBA_KERNELS_SCAN_STATES=recompute trades that memory for
        # recomputing them: from a state every 1024 steps inside the backward kernel where it
        # can (spaced_fwd_args), else with a second forward scan.
        grads = any(ctx.needs_input_grad[:8])
        form = knobs.scan_states_for(knobs.KEEP)
        layout = spaced_fwd_args(A, u.shape[-1]) if grads and use_cuda and form == knobs.RECOMPUTE else ()
        ctx.bwd_layout = SPACED_BWD_ARGS if layout else ()
        keep = grads and (form == knobs.KEEP or bool(layout))
        result, last, saved = _forward(
            use_cuda, groups, keep, u, delta, A, B, C, D, z, delta_bias, ctx.delta_softplus,
            return_last_state, layout,
        )
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, *saved)
        if not return_last_state:
            return result
        ctx.mark_non_differentiable(last)
        return result, last

    @staticmethod
    def backward(ctx, dout, *unused):
        if ctx.cuda:
            _ops = _ops_module()
            u, delta, A, B, C, D, z, delta_bias, ckpt, y = ctx.saved_tensors
            if ckpt is None:  # recompute, with no spaced states: the states, and y with z (no gate)
                y, _, ckpt = _ops.fwd(
                    u, delta, A, _as_4d(B), _as_4d(C), D, None, delta_bias, ctx.delta_softplus, z is not None
                )
            dz = torch.empty_like(z) if z is not None else u.new_empty((0,))
            op = pick(_ops.bwd, _ops.bwd_entry)
            du, ddelta, dA, dB, dC, dD, ddelta_bias = op(
                u, delta, A, _as_4d(B), _as_4d(C), D, z, delta_bias, dout, ckpt, y if z is not None else None,
                dz, u.new_empty((0,)), ctx.delta_softplus, *ctx.bwd_layout,
            )
            return (
                du,
                ddelta,
                dA,
                dB.squeeze(1) if B.dim() == 3 else dB,
                dC.squeeze(1) if C.dim() == 3 else dC,
                dD if D is not None else None,
                dz if z is not None else None,
                ddelta_bias if delta_bias is not None else None,
                None,
                None,
            )
        u, delta, A, B, C, D, z, delta_bias, ckpt, y = ctx.saved_tensors
        p = pytorch_scan.make_problem(u, delta, A, B, C, D, z, delta_bias, ctx.delta_softplus, ctx.groups)
        du, ddelta, dA, dB, dC, dD, ddelta_bias, dz, _ = pytorch_scan.backward(p, dout, checkpoints=ckpt, y=y)
        return (
            du,
            ddelta,
            dA.to(A.dtype),
            pytorch_scan.grad_as_given(dB, B),
            pytorch_scan.grad_as_given(dC, C),
            _opt_to(dD, D),
            dz,
            _opt_to(ddelta_bias, delta_bias),
            None,
            None,
        )


def selective_scan_fn(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, return_last_state=False
):
    """Selective scan with autograd (chunked PyTorch implementation, no loop over time).

    u, delta, z: (batch, dim, L); A: (dim, dstate) float32 or complex64; B, C: fixed
    (dim, dstate) in A's dtype or variable (batch, [ngroups,] dstate, L) in u's dtype (last
    dim 2L, interleaved real/imag, for complex A); D, delta_bias: (dim,) float32.
    Returns out (u's dtype, delta's memory layout; gated by silu(z) when z is given), and
    with ``return_last_state`` also the state after the last step, (batch, dim, dstate) in
    float32/complex64 (float64/complex128 for float64 u). The last state is the true h for
    fixed B too (mamba_ssm's kernel returns h/B there) and gets no gradient.
    ``delta_softplus`` and ``return_last_state`` must be bools.
    """
    delta_softplus = _checks.require_bool("delta_softplus", delta_softplus)
    return_last_state = _checks.require_bool("return_last_state", return_last_state)
    args = (u, delta, A, B, C, D, z, delta_bias)
    try:
        records = _records(args)
    except AttributeError:  # not a tensor: the Function's checks name it
        records = True
    if records:
        return SelectiveScanFn.apply(*args, delta_softplus, return_last_state)
    # autograd would record nothing: the same forward without the Function's machinery
    groups = _checks.check_selective_scan(*args)
    result, last, _ = _forward(_use_cuda(u, A), groups, False, *args, delta_softplus, return_last_state)
    return (result, last) if return_last_state else result


def selective_scan_ref(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, return_last_state=False
):
    """Per-step reference of the same maths (loops over time; differentiable by autograd).

    Runs in float32 (float64 when u or A is double precision) and returns u's dtype.
    """
    delta_softplus = _checks.require_bool("delta_softplus", delta_softplus)
    return_last_state = _checks.require_bool("return_last_state", return_last_state)
    groups = _checks.check_selective_scan(u, delta, A, B, C, D, z, delta_bias, reference=True)
    wide = u.dtype == torch.float64 or A.dtype in (torch.float64, torch.complex128)
    real = torch.float64 if wide else torch.float32
    cplx = (torch.complex128 if wide else torch.complex64) if A.is_complex() else real
    batch, dim, L = u.shape
    uf = u.to(real)
    dt = delta.to(real)
    if delta_bias is not None:
        dt = dt + delta_bias.to(real)[:, None]
    if delta_softplus:
        dt = F.softplus(dt)
    Ac = A.to(cplx)

    def per_channel(t: Tensor) -> Tensor:  # -> (dim, n) fixed, or (batch, dim, n, L)
        if t.dim() == 2:
            return t.to(cplx)
        t = pytorch_scan._as_variable(t.to(real), A.is_complex()).to(cplx)
        return t.repeat_interleave(dim // groups, dim=1)

    Bc, Cc = per_channel(B), per_channel(C)
    decay = torch.exp(dt.unsqueeze(-1) * Ac.unsqueeze(-2))  # (batch, dim, L, n)
    h = u.new_zeros((batch, dim, A.shape[1]), dtype=cplx)
    ys = []
    for t in range(L):
        Bt = Bc if B.dim() == 2 else Bc[..., t]
        Ct = Cc if C.dim() == 2 else Cc[..., t]
        h = decay[:, :, t] * h + (dt[:, :, t] * uf[:, :, t]).unsqueeze(-1) * Bt
        yt = (h * Ct).sum(-1)
        ys.append(2 * yt.real if A.is_complex() else yt)
    y = torch.stack(ys, dim=-1) if ys else uf.new_zeros((batch, dim, 0))  # L = 0: no step
    if D is not None:
        y = y + uf * D.to(real)[:, None]
    if z is not None:
        y = y * F.silu(z.to(real))
    out = y.to(u.dtype)
    return (out, h) if return_last_state else out
