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
D, dt_bias (dim,) / (nheads, dim). The step runs in float32 (float64 if state or x is
float64); state keeps its dtype; out has x's dtype.

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

from typing import Optional

import torch
import torch.nn.functional as F

from mamba_kernels import dispatch

from . import _checks

Tensor = torch.Tensor
KERNEL = "selective_scan"  # the extension family (selective_scan._cuda) the decode kernel ships in
KERNEL_MAX_DSTATE = 256


def _check(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices) -> None:
    for name, t in (("state", state), ("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        _checks.require_tensor(name, t)
    for name, t in (("D", D), ("z", z), ("dt_bias", dt_bias), ("state_batch_indices", state_batch_indices)):
        _checks.require_tensor(name, t, optional=True)
    _checks.require_same_device(
        {
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
    )
    if state.dim() not in (3, 4):
        raise ValueError(
            f"state must be (batch, dim, dstate) or (batch, nheads, dim, dstate), got {tuple(state.shape)}"
        )
    heads = state.dim() == 4
    _, nheads, dim, dstate = state.shape if heads else (state.shape[0], 1, *state.shape[1:])
    batch = x.shape[0] if x.dim() > 0 else -1
    lead = (batch, nheads, dim) if heads else (batch, dim)
    desc = "(batch, nheads, dim)" if heads else "(batch, dim)"
    _checks.require_shape("x", x, lead, f"{desc}, matching state")
    _checks.require_shape("dt", dt, lead, f"same as x {desc}")
    if z is not None:
        _checks.require_shape("z", z, lead, f"same as x {desc}")
    _checks.require_shape("A", A, (nheads, dim, dstate) if heads else (dim, dstate), "matching state")
    if B.dim() != (3 if heads else 2):
        raise ValueError(
            f"B must be {'(batch, ngroups, dstate)' if heads else '(batch, dstate)'}, got {tuple(B.shape)}"
        )
    ngroups = B.shape[1] if heads else 1
    _checks.require_shape(
        "B", B, (batch, ngroups, dstate) if heads else (batch, dstate), "(batch, [ngroups,] dstate)"
    )
    _checks.require_shape("C", C, tuple(B.shape), "same as B")
    if ngroups < 1 or nheads % ngroups != 0:
        raise ValueError(f"nheads must be divisible by ngroups: nheads={nheads}, ngroups={ngroups}")
    for name, t in (("D", D), ("dt_bias", dt_bias)):
        if t is not None:
            _checks.require_shape(name, t, (nheads, dim) if heads else (dim,), "one value per channel")
    floats = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    for name, t in (
        ("state", state),
        ("x", x),
        ("dt", dt),
        ("A", A),
        ("B", B),
        ("C", C),
        ("D", D),
        ("z", z),
        ("dt_bias", dt_bias),
    ):
        if t is not None and t.dtype not in floats:
            raise TypeError(
                f"{name} must be a real floating dtype (float32/16, bfloat16, float64), got {t.dtype}"
            )
    if state_batch_indices is None:
        if state.shape[0] != batch:
            raise ValueError(
                f"without state_batch_indices, state.shape[0] must equal the batch {batch}, "
                f"got {state.shape[0]}"
            )
        return
    if state_batch_indices.dtype not in (torch.int32, torch.int64) or tuple(state_batch_indices.shape) != (
        batch,
    ):
        raise ValueError(
            f"state_batch_indices must be an int32/int64 tensor of shape ({batch},), got "
            f"{state_batch_indices.dtype} {tuple(state_batch_indices.shape)}"
        )


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


def _kernel_fits(state: Tensor, *tensors: Optional[Tensor]) -> bool:
    """The compiled kernel covers float32/16 and bfloat16 (float64 runs in PyTorch), dstate <= 256."""
    if state.dtype == torch.float64 or state.shape[-1] > KERNEL_MAX_DSTATE:
        return False
    for t in tensors:
        if t is not None and t.dtype == torch.float64:
            return False
    return True


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
    """One decode step; updates ``state`` in place and returns out (x's shape and dtype)."""
    _check(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices)
    if _kernel_fits(state, x, dt, A, B, C, D, z, dt_bias) and dispatch.use_cuda(KERNEL, state.device.type):
        from . import _update_ops

        args = (state, x, dt, A, B, C, D, z, dt_bias, bool(dt_softplus), state_batch_indices)
        if not torch.is_grad_enabled():
            return _update_ops.update(*args)
        with torch.no_grad():  # no backward (nor has the original): out is explicitly not differentiable
            return _update_ops.update(*args)
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
