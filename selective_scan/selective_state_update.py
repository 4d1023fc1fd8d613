"""Drop-in for ``mamba_ssm.ops.triton.selective_state_update``: one decode step of the scan.

``selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None,
dt_softplus=False, state_batch_indices=None)`` advances ``state`` in place by one token and
returns the output for that token:

    dt  = softplus(dt + dt_bias)            (softplus only with dt_softplus; identity above 20)
    state = exp(dt * A) * state + dt * B * x
    out = sum_n C * state + D * x,  then  out * silu(z)  when z is given

Shapes, without / with heads: state (batch, dim, dstate) / (batch, nheads, dim, dstate);
x, dt, z (batch, dim) / (batch, nheads, dim); A (dim, dstate) / (nheads, dim, dstate);
B, C (batch, dstate) / (batch, ngroups, dstate) with nheads divisible by ngroups;
D, dt_bias (dim,) / (nheads, dim). ``dt_softplus`` must be a bool (numpy's too), as
``selective_scan_fn``'s flags: anything else is a TypeError. The step runs in float32
(float64 if state or x is float64); state keeps its dtype; out has x's dtype.

``state_batch_indices`` (batch,) integer: row i of x uses and updates
``state[state_batch_indices[i]]`` (state may hold more slots than the batch). A negative
index marks a padded row: its state slot is neither read nor written and its output is
zero. Indices must be below ``state.shape[0]`` and the non-negative ones must be distinct
(two rows updating one slot would be a race). The PyTorch path checks both. The CUDA kernel
does not, because reading the index values on the host would cost a device sync per decode
step (tens of microseconds; the original checks neither): there an index at or past
``state.shape[0]`` touches no memory and gives a NaN output row, so the mistake shows, and
rows sharing a slot leave that slot and their outputs unspecified (other rows and slots are
unaffected).

On CUDA tensors the compiled kernel runs when the extension is available, every tensor is
float32, float16 or bfloat16 (each may differ) and dstate <= 256; otherwise the PyTorch path.
The kernel reads every operand in place with its strides. Like the original's Triton kernel
its output is not differentiable; the PyTorch path is.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Optional

import torch
import torch.nn.functional as F

from mamba_kernels.runtime import argchecks, dispatch

from . import _checks

Tensor = torch.Tensor
KERNEL = "selective_scan"  # the extension family (selective_scan._cuda) the decode kernel ships in
KERNEL_MAX_DSTATE = 256


_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_INDEX_DTYPES = (torch.int32, torch.int64)
_FLOAT64 = torch.float64
_PACKAGE = sys.modules[__package__]


def _named(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices) -> dict:
    """The operands by name, for the error paths."""
    return {
        "state": state,
        "x": x,
        "dt": dt,
        "A": A,
        "B": B,
        "C": C,
        "D": D,
        "z": z,
        "dt_bias": dt_bias,
        "state_batch_indices": state_batch_indices,
    }


def _check(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices) -> bool:
    """Validate one decode step's arguments; return whether the compiled kernel covers them
    (``_fits``). Runs on every decode step, so the good path reads each attribute once and
    builds no string: messages are made only on failure.

    Long: it runs on every decode step, so the checks stay inline: the good path reads each attribute
    once and calls nothing it can avoid.
    """
    if not (
        isinstance(state, Tensor)
        and isinstance(x, Tensor)
        and isinstance(dt, Tensor)
        and isinstance(A, Tensor)
        and isinstance(B, Tensor)
        and isinstance(C, Tensor)
        and (D is None or isinstance(D, Tensor))
        and (z is None or isinstance(z, Tensor))
        and (dt_bias is None or isinstance(dt_bias, Tensor))
        and (state_batch_indices is None or isinstance(state_batch_indices, Tensor))
    ):
        named = _named(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices)
        for name, t in named.items():
            _checks.require_tensor(name, t, optional=name in ("D", "z", "dt_bias", "state_batch_indices"))
    device = state.device
    for t in (x, dt, A, B, C, D, z, dt_bias, state_batch_indices):
        if t is not None and t.device != device:
            _checks.require_same_device(_named(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices))
    shape = state.shape
    heads = len(shape) == 4
    if not heads and len(shape) != 3:
        raise ValueError(
            f"state must be (batch, dim, dstate) or (batch, nheads, dim, dstate), got {tuple(shape)}"
        )
    if heads:
        nheads, dim, dstate = shape[1], shape[2], shape[3]
    else:
        nheads, dim, dstate = 1, shape[1], shape[2]
    argchecks.require_dstate("dstate (state.shape[-1])", dstate)
    x_shape = x.shape
    desc = "(batch, nheads, dim)" if heads else "(batch, dim)"
    if len(x_shape) != len(shape) - 1:  # (batch is read from x: no shape to quote without it)
        raise argchecks.error(ValueError, "x", f"must be {desc}, matching state", str(tuple(x_shape)))
    batch = x_shape[0]
    lead = (batch, nheads, dim) if heads else (batch, dim)
    if x_shape != lead or dt.shape != lead or (z is not None and z.shape != lead):
        _checks.require_shape("x", x, lead, f"{desc}, matching state")
        _checks.require_shape("dt", dt, lead, f"same as x {desc}")
        _checks.require_shape("z", z, lead, f"same as x {desc}")
    A_shape = (nheads, dim, dstate) if heads else (dim, dstate)
    if A.shape != A_shape:
        _checks.require_shape("A", A, A_shape, "matching state")
    B_shape = B.shape
    if len(B_shape) != (3 if heads else 2):
        raise ValueError(
            f"B must be {'(batch, ngroups, dstate)' if heads else '(batch, dstate)'}, got {tuple(B_shape)}"
        )
    ngroups = B_shape[1] if heads else 1
    want = (batch, ngroups, dstate) if heads else (batch, dstate)
    if B_shape != want:
        _checks.require_shape("B", B, want, "(batch, [ngroups,] dstate)")
    if C.shape != B_shape:
        _checks.require_shape("C", C, tuple(B_shape), "same as B")
    if ngroups < 1 or nheads % ngroups != 0:
        raise ValueError(f"nheads must be divisible by ngroups: nheads={nheads}, ngroups={ngroups}")
    per_channel = (nheads, dim) if heads else (dim,)
    if D is not None and D.shape != per_channel:
        _checks.require_shape("D", D, per_channel, "one value per channel")
    if dt_bias is not None and dt_bias.shape != per_channel:
        _checks.require_shape("dt_bias", dt_bias, per_channel, "one value per channel")
    wide = False
    for t in (state, x, dt, A, B, C, D, z, dt_bias):
        if t is not None:
            dtype = t.dtype
            if dtype not in _FLOATS:
                named = _named(state, x, dt, A, B, C, D, z, dt_bias, None)
                name = next(k for k, v in named.items() if v is not None and v.dtype not in _FLOATS)
                raise TypeError(
                    f"{name} must be a real floating dtype (float32/16, bfloat16, float64), got "
                    f"{named[name].dtype}"
                )
            if dtype == _FLOAT64:
                wide = True
    if state_batch_indices is None:
        if shape[0] != batch:
            raise ValueError(
                f"without state_batch_indices, state.shape[0] must equal the batch {batch}, got {shape[0]}"
            )
    elif state_batch_indices.dtype not in _INDEX_DTYPES or state_batch_indices.shape != (batch,):
        raise ValueError(
            f"state_batch_indices must be an int32/int64 tensor of shape ({batch},), got "
            f"{state_batch_indices.dtype} {tuple(state_batch_indices.shape)}"
        )
    return _fits(dstate, wide)


def _check_index_values(state: Tensor, state_batch_indices: Optional[Tensor]) -> None:
    """Bounds and distinctness of the slot indices (PyTorch path: reads them on the host)."""
    if state_batch_indices is None:
        return
    idx = state_batch_indices.tolist()
    if any(i >= state.shape[0] for i in idx):
        raise ValueError(
            f"state_batch_indices must be < state.shape[0]={state.shape[0]} (negative = padding), got {idx}"
        )
    used = [i for i in idx if i >= 0]
    if len(set(used)) != len(used):
        raise ValueError(f"state_batch_indices must not repeat a state slot, got {idx}")


def _fits(dstate: int, any_float64: bool) -> bool:
    """The compiled kernel covers float32/16 and bfloat16 (float64 runs in PyTorch), dstate <= 256."""
    return not any_float64 and dstate <= KERNEL_MAX_DSTATE


def _kernel_fits(state: Tensor, *tensors: Optional[Tensor]) -> bool:
    """``_fits`` for these operands."""
    wide = any(t is not None and t.dtype == _FLOAT64 for t in (state, *tensors))
    return _fits(state.shape[-1], wide)


def _kernel_may_take(state, x) -> bool:
    """Whether the compiled kernel may take a step on ``state`` (a CUDA tensor of a dtype and
    dstate it covers, argchecks.DSTATE_MIN at least) and x (not empty: an empty problem runs
    the PyTorch path, argchecks.is_empty); the op checks the rest."""
    return (
        isinstance(state, Tensor)
        and state.is_cuda
        and state.dtype is not _FLOAT64
        and state.dim() >= 3
        and argchecks.DSTATE_MIN <= state.shape[-1] <= KERNEL_MAX_DSTATE
        and isinstance(x, Tensor)
        and not argchecks.is_empty(x)
    )


def _shape(t: Tensor) -> str:
    return f"shape {tuple(t.shape)}"


def _requires_grad(*tensors: Optional[Tensor]) -> bool:
    """Whether autograd would record an op on these (None never counts)."""
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return True
    return False


def _ops() -> ModuleType:
    """``selective_scan._update_ops``, imported on first use (importing it loads the extension);
    read from the package, which is what ``from . import _update_ops`` does after its import
    machinery."""
    ops = getattr(_PACKAGE, "_update_ops", None)
    if ops is None:
        from . import _update_ops as ops
    return ops


def selective_state_update(
    state: Tensor,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor] = None,
    z: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    dt_softplus: bool = False,
    state_batch_indices: Optional[Tensor] = None,
) -> Tensor:
    """One decode step; updates ``state`` in place and returns out (x's shape and dtype).

    Long: the dispatch of a host-bound decode step (the compiled op first, our checks only when it
    refuses, then the PyTorch path), commented step by step; moving parts out would add a call to every
    step.
    """
    # a flag must be a bool, as for selective_scan_fn: dt_softplus="no" would otherwise be true
    dt_softplus = _checks.require_bool("dt_softplus", dt_softplus)
    if isinstance(state, Tensor):
        # the in-place target's rule, shared with causal_conv1d_update's conv_state and checked
        # before any dispatch: rows sharing memory would lose updates here and race on CUDA
        argchecks.require_writable("state", state, seen=_shape)
    # A decode step is host-bound, and the op checks every rule the kernel relies on (naming the
    # argument, the rule and the value). So where the kernel may take the call the op goes
    # first, and our checks run only when it refuses: they then name a rule they own as on CPU
    # (the same ValueError), re-raise the op's error for a rule only the kernel has, or send a
    # call the kernel does not cover (a float64 operand) on to the PyTorch path. A refused call
    # leaves the state untouched. (The state's overlap, above, and an empty problem or a dstate
    # of 0, in _kernel_may_take, are decided before the op.)
    if _kernel_may_take(state, x) and dispatch.use_cuda(KERNEL, "cuda"):
        args = (state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices)
        try:
            # no backward (nor has the original): out is explicitly not differentiable; no_grad
            # only when an operand requires grad (else it would change nothing, at ~1 us a step)
            if _requires_grad(state, x, dt, A, B, C, D, z, dt_bias):
                with torch.no_grad():
                    return _ops().update(*args)
            return _ops().update(*args)
        except (RuntimeError, TypeError, ValueError):
            if _check(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices):
                raise
    elif _check(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices):
        # the kernel covers these operands but not here (no usable extension, or not CUDA
        # tensors): the decision warns once, or raises under MAMBA_KERNELS_BACKEND=cuda
        dispatch.use_cuda(KERNEL, "cuda" if state.is_cuda else state.device.type)
    _check_index_values(state, state_batch_indices)
    heads = state.dim() == 4
    if not heads:  # one head: lift everything to the heads form
        x, dt, A, B, C = x[:, None], dt[:, None], A[None], B[:, None], C[:, None]
        z = z[:, None] if z is not None else None
        D = D[None] if D is not None else None
        dt_bias = dt_bias[None] if dt_bias is not None else None
    wide = torch.float64 in (state.dtype, x.dtype)
    cd = torch.float64 if wide else torch.float32
    nheads, ngroups = x.shape[1], B.shape[1]
    xf = x.to(cd)
    dtf = dt.to(cd)
    if dt_bias is not None:
        dtf = dtf + dt_bias.to(cd)
    if dt_softplus:
        dtf = F.softplus(dtf, threshold=20.0)
    Bh = B.to(cd).repeat_interleave(nheads // ngroups, dim=1).unsqueeze(2)  # (batch, nheads, 1, dstate)
    Ch = C.to(cd).repeat_interleave(nheads // ngroups, dim=1).unsqueeze(2)
    slots = state if heads else state.unsqueeze(1)
    if state_batch_indices is None:
        old = slots.to(cd, copy=True)  # not an alias: slots is overwritten, old kept for backward
        valid = None
    else:
        idx = state_batch_indices.long()
        valid = idx >= 0
        old = slots[idx.clamp(min=0)].to(cd)
    new = torch.exp(dtf.unsqueeze(-1) * A.to(cd)) * old + (dtf * xf).unsqueeze(-1) * Bh
    out = (new * Ch).sum(-1)
    if D is not None:
        out = out + D.to(cd) * xf
    if z is not None:
        out = out * F.silu(z.to(cd))
    if valid is None:
        slots.copy_(new)
    else:
        slots[idx[valid]] = new[valid].to(state.dtype)
        out = torch.where(valid[:, None, None], out, torch.zeros_like(out))
    out = out.to(x.dtype)
    return out if heads else out[:, 0]
