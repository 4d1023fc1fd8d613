"""The contract of mamba_ssm's compiled module ``selective_scan_cuda``, on our kernels.

The top-level module ``selective_scan_cuda`` (shipped in this distribution) re-exports ``fwd``
and ``bwd`` from here, so mamba_ssm's Python code (its ``SelectiveScanFn`` and
``MambaInnerFn``) and other direct callers run unmodified on our kernels:

  fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
      -> [out, x] or, with z, [out, x, out_z]
  bwd(u, delta, A, B, C, D, z, delta_bias, dout, x, out, dz, delta_softplus, recompute_out_z)
      -> [du, ddelta, dA, dB, dC, dD, ddelta_bias] (+ [dz] with z) (+ [out_z] if recompute_out_z)

All arguments are positional, as in the compiled original. ``out`` is y without the z gate,
``out_z = out * silu(z)``; dD / ddelta_bias are None without D / delta_bias; a given ``dz``
is written in place and returned (mamba_ssm passes a view into its ``dxz``).

``x``, the scan-state tensor, differs from the original's (docs/CLIENTS.md, "selective_scan_cuda"):
its shape is (batch, dim, rows, 2 * dstate) in A's dtype (float32 or complex64; float64 for
float64 inputs) and ``x[:, :, -1, 1::2]`` is the state after the last step, which is all callers
read from it; otherwise it is only meant to be passed back to ``bwd`` with the same inputs,
which checks its shape. What the rows hold follows ``MAMBA_KERNELS_SCAN_STATES``:

* ``keep``: the states at our kernels' own checkpoints (every 64 steps on CUDA,
  the PyTorch path's chunk ends elsewhere, then the last state), two per row (row r holds
  checkpoints 2r and 2r + 1 in its even and odd slots; the last row's odd slots always hold the
  last state). ``bwd`` starts from them.
* ``recompute`` (what ``auto``, the default, means here): the original's shape, one row per
  2048 steps, the last state in the last row's odd slots. On CUDA the kernel writes x itself:
  row r's even slots hold the state after min(2048 r + 1024, L) steps, its odd slots the state
  after min(2048 (r + 1), L); the PyTorch path leaves zeros in every slot but the last state's.
  ``bwd`` starts from x's states (a state every 1024 steps) where the kernel can (real A,
  dstate <= 16), recomputing the chunk starts between them inside the backward kernel;
  otherwise it recomputes the states with one more forward pass.

Unlike the original, CPU tensors (and float64) work too: they run the PyTorch implementation,
which keeps the same contract. The last state with a fixed (2-D) B is the true state h, as
``selective_scan_ref`` gives (the original kernel returns h / B there).
"""

from __future__ import annotations

import sys
from typing import List, Optional, Tuple

import torch

from mamba_kernels.runtime import argchecks, dispatch, knobs
from mamba_kernels.runtime.library import pick

from . import _checks, chunked, pytorch_scan
from .scan_fn import (
    _CUDA_A_DTYPES,
    _CUDA_INPUT_DTYPES,
    KERNEL,
    SPACED_BWD_ARGS,
    SPACED_MAX_DSTATE,
    SPACED_STEPS,
    _as_4d,
    _index_fits,
    _ops_module,
    paired_fwd_args,
    spaced_states_fit,
)

Tensor = torch.Tensor


def _compiled(u: Tensor, A: Tensor) -> bool:
    # an empty problem (batch, dim or L of 0) runs the PyTorch path on any device
    kernel_dtypes = u.dtype in _CUDA_INPUT_DTYPES and A.dtype in _CUDA_A_DTYPES and not argchecks.is_empty(u)
    # u.is_cuda is a flag read; u.device.type builds a device object and a string
    return kernel_dtypes and dispatch.use_cuda(KERNEL, "cuda" if u.is_cuda else u.device.type)


def _check(u, delta, A, B, C, D, z, delta_bias, delta_softplus) -> int:
    # the per-call path: one pass that reads each attribute once and builds no message; only
    # when it refuses do the checks below run, in order, to name the first rule that fails
    if delta_softplus is True or delta_softplus is False:
        groups = _checks._quick_groups(u, delta, A, B, C, D, z, delta_bias, False)
        if groups:
            return groups
    for name, t, optional in (
        ("u", u, False), ("delta", delta, False), ("A", A, False), ("B", B, False), ("C", C, False),
        ("D", D, True), ("z", z, True), ("delta_bias", delta_bias, True),
    ):
        _checks.require_tensor(name, t, optional)
    _checks.require_bool("delta_softplus", delta_softplus)
    return _checks.check_selective_scan(u, delta, A, B, C, D, z, delta_bias)


ORIGINAL_CHUNK = 2 * SPACED_STEPS  # steps per row of the original's x, the shape x has under "recompute"


def _pack(states: Tensor) -> Tensor:
    """(batch, dim, K, dstate) states -> x of (batch, dim, ceil(K / 2), 2 * dstate): row r holds
    states 2r and 2r + 1 in its even and odd slots; with K odd the last state fills both slots of
    the last row, so x[..., -1, 1::2] is always the last state."""
    b, d, k, n = states.shape
    x = states.new_empty((b, d, -(-k // 2), 2 * n))
    pairs = x.view(b, d, -1, n, 2)
    pairs[..., 0] = states[:, :, 0::2]
    pairs[:, :, : k // 2, :, 1] = states[:, :, 1::2]
    if k % 2:
        pairs[:, :, -1, :, 1] = states[:, :, -1]
    return x


def _unpack(x: Tensor, count: int) -> Tensor:
    """The inverse of ``_pack``: x -> its first ``count`` states, a new contiguous
    (batch, dim, count, dstate) tensor."""
    b, d, _, n2 = x.shape
    pairs = x.reshape(b, d, -1, n2 // 2, 2)  # a view of fwd's own (contiguous) x
    states = x.new_empty((b, d, count, n2 // 2))
    states[:, :, 0::2] = pairs[:, :, : -(-count // 2), :, 0]
    states[:, :, 1::2] = pairs[:, :, : count // 2, :, 1]
    return states


def _original_rows(L: int) -> int:
    """Rows of the original's x: one per ORIGINAL_CHUNK steps, and one for L = 0 (which holds
    the state after no step, zeros), so that x[:, :, -1, 1::2] is always the last state."""
    return max(1, -(-L // ORIGINAL_CHUNK))


def _original_shape(last: Tensor, L: int) -> Tensor:
    """The original's shape, (batch, dim, ceil(L / 2048), 2 * dstate): the last state in the last
    row's odd slots, zeros elsewhere."""
    b, d, n = last.shape
    rows = _original_rows(L)
    x = last.new_zeros((b, d, rows, 2 * n))
    # the last row's odd slots as one strided view: a third of the host time of x[:, :, -1, 1::2]
    x.as_strided((b, d, n), (x.stride(0), x.stride(1), 2), (rows - 1) * x.stride(2) + 1).copy_(last)
    return x


def _state_count(L: int, compiled: bool) -> int:
    """How many states the path keeps: every 64 steps on CUDA (the last being the final state);
    on the PyTorch path its first-level chunk ends, then the final state."""
    return _ops_chunks(L) if compiled else chunked.checkpoint_count(L) + 1


def _state_dtype(u: Tensor, A: Tensor) -> torch.dtype:
    real = _checks.compute_dtype(u)
    if A.is_complex():
        return torch.complex128 if real == torch.float64 else torch.complex64
    return real


def _expected_x(u: Tensor, A: Tensor, compiled: bool, form: str):
    batch, dim, L = u.shape
    rows = _original_rows(L) if form == "recompute" else -(-_state_count(L, compiled) // 2)
    dtype = A.dtype if compiled else _state_dtype(u, A)
    return (batch, dim, rows, 2 * A.shape[1]), dtype


def _ops_chunks(L: int) -> int:
    return -(-L // _ops_module().CHUNK)


def _fast(u, A, delta_softplus) -> bool:
    """Whether the call goes to our compiled op with no checks of ours first: the op checks
    every rule itself (naming the argument, the rule and the value), so in that case our own
    checks would cost the host their time twice, and mamba_ssm's small layers are host-bound."""
    return (
        # isinstance, not `__class__ is`: torch 2.11's dynamo reads a constant's __class__ as
        # something other than bool, which sent every compiled call to the PyTorch path
        isinstance(delta_softplus, bool)
        and isinstance(u, Tensor)
        and isinstance(A, Tensor)
        and u.dim() == 3  # read before the op's checks: L picks the states' layout
        and A.dim() == 2
        and _compiled(u, A)
    )


def _as_4d_any(t):
    # a non-tensor goes to the op as it is, whose argument parsing names it
    return _as_4d(t) if isinstance(t, Tensor) else t


def fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus) -> List[Tensor]:
    """[out, x] (+ [out_z] with z); see the module docstring."""
    if _fast(u, A, delta_softplus):
        form = knobs.scan_states_for(knobs.RECOMPUTE)
        L = u.shape[2]
        # recompute: x straight from the kernel, a state every 1024 steps with slots 2r and
        # 2r + 1 interleaved into row r (launches of our own for it would cost more host time
        # than the scan's launch); keep: a state every 64 steps
        layout = paired_fwd_args(L) if form == "recompute" else ()
        ops = _ops_module()
        op = pick(ops.fwd, ops.fwd_entry)
        out, out_z, states = op(
            u, delta, A, _as_4d_any(B), _as_4d_any(C), D, z, delta_bias, delta_softplus, True, *layout
        )
        if not _entry_tried:
            _arm_entry()
        if A.is_complex():
            states = torch.view_as_complex(states.unflatten(-1, (-1, 2)))
        # recompute: the op returned the pairs in x's shape
        x = states if form == "recompute" else _pack(states)
        return [out, x, out_z] if z is not None else [out, x]
    # the PyTorch path (CPU, float64, no usable extension): our checks name the rule first
    groups = _check(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    form = knobs.scan_states_for(knobs.RECOMPUTE)
    p = pytorch_scan.make_problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus, groups)
    if form == "recompute":
        out, out_z, last = pytorch_scan.forward(p, True)
        x = _original_shape(last, u.shape[-1])
    else:
        out, out_z, last, ckpt = pytorch_scan.forward(p, True, checkpoints=True)
        x = _pack(torch.cat([ckpt, last.unsqueeze(0)]).permute(1, 2, 0, 3))  # (batch, dim, K + 1, dstate)
    return [out, x, out_z] if z is not None else [out, x]


def _check_x(x: Tensor, u: Tensor, A: Tensor, compiled: bool, form: str, cause: Optional[Exception] = None):
    shape, dtype = _expected_x(u, A, compiled, form)
    if not isinstance(x, Tensor) or tuple(x.shape) != shape or x.dtype != dtype or x.device != u.device:
        got = f"shape {tuple(x.shape)}, dtype {x.dtype}, device {x.device}" if isinstance(x, Tensor) else x
        raise ValueError(
            f"selective_scan_cuda.bwd: x must be the second output of selective_scan_cuda.fwd for these "
            f"inputs (shape {shape}, dtype {dtype}, device {u.device}, with {knobs.SCAN_STATES_VAR}={form}), "
            f"got {got}"
        ) from cause


def _as_dtype(t: Tensor, dtype: torch.dtype) -> Tensor:
    # t.to(dtype) returns t itself when it has the dtype already, but only after a dispatch
    return t if t.dtype == dtype else t.to(dtype)


def _check_like_z(name: str, t: Tensor, z: Tensor) -> None:
    _checks.require_tensor(name, t)
    if t.shape != z.shape or t.dtype != z.dtype or t.device != z.device:
        raise ValueError(
            f"selective_scan_cuda.bwd: {name} must have z's shape {tuple(z.shape)}, dtype {z.dtype} and "
            f"device {z.device}, got shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"
        )


def _dz_shape(t: object) -> str:
    return f"shape {tuple(t.shape)}"  # type: ignore[attr-defined]


def bwd(
    u, delta, A, B, C, D, z, delta_bias, dout, x, out, dz, delta_softplus, recompute_out_z
) -> List[Optional[Tensor]]:
    """[du, ddelta, dA, dB, dC, dD, ddelta_bias] (+ [dz] with z) (+ [out_z] if recompute_out_z).

    Long: selective_scan_cuda.bwd's whole contract in one place: the compiled call for the arguments it
    takes, else every argument checked in the original's order, then the PyTorch path; its lines are the
    checks themselves.
    """
    compiled = isinstance(recompute_out_z, bool) and isinstance(dout, Tensor) and _fast(u, A, delta_softplus)
    if z is not None and isinstance(dz, Tensor):  # written in place: the in-place targets' rule
        argchecks.require_writable("dz", dz, fn="selective_scan_cuda.bwd", seen=_dz_shape)
    if not compiled:  # our checks, then the PyTorch path (arguments they pass went through _fast)
        groups = _check(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
        _checks.require_bool("recompute_out_z", recompute_out_z)
        _checks.require_tensor("dout", dout)
        if dout.shape != u.shape or dout.device != u.device:
            raise ValueError(
                f"selective_scan_cuda.bwd: dout must have u's shape {tuple(u.shape)} and device {u.device}, "
                f"got shape {tuple(dout.shape)}, device {dout.device}"
            )
        if z is not None:
            if out is not None:
                _check_like_z("out", out, z)
            if dz is not None:
                _check_like_z("dz", dz, z)
    form = knobs.scan_states_for(knobs.RECOMPUTE)
    # recompute on CUDA, real A, y given with z: x's rows are the op's state pairs, which the op
    # takes as they are and checks itself (x is named below if the op refuses the call)
    y_given = z is None or out is not None
    spaced = compiled and form == "recompute" and isinstance(x, Tensor) and y_given and spaced_states_fit(A)
    if x is not None and not spaced:
        _check_x(x, u, A, compiled, form)
    states = None  # the states the forward kept, when it kept them
    if x is not None and form == "keep":
        states = _unpack(x, _state_count(u.shape[-1], compiled))
    if compiled:
        _ops = _ops_module()
        B4, C4 = _as_4d_any(B), _as_4d_any(C)
        layout = ()  # the op's state_steps, state_pairs for ckpt
        if (states is None and not spaced) or (z is not None and out is None):
            # recompute what the forward would have kept: the states, and y where the caller
            # did not pass it (the gate is never needed: the backward writes out_z itself)
            want_y = z is not None and out is None
            y, _, ckpt = _ops.fwd(u, delta, A, B4, C4, D, None, delta_bias, delta_softplus, want_y)
            out = y if want_y else out
        elif spaced:
            # x's rows are the kernel's state pairs 1024 steps apart: the backward starts from
            # them and recomputes the chunk starts in between, with no forward scan here
            ckpt, layout = x.contiguous(), SPACED_BWD_ARGS
        else:
            ckpt = torch.view_as_real(states).flatten(-2) if A.is_complex() else states
        gated = z is not None
        if gated and dz is None:
            dz = torch.empty_like(z)
        out_z = torch.empty_like(z) if (recompute_out_z and gated) else None
        # the op's in-place outputs: an empty tensor stands for one that is not wanted
        empty = u.new_empty((0,)) if not gated or out_z is None else None
        try:
            op = pick(_ops.bwd, _ops.bwd_entry)
            du, ddelta, dA, dB, dC, dD, ddelta_bias = op(
                u, delta, A, B4, C4, D, z, delta_bias, _as_dtype(dout, u.dtype), ckpt, out if gated else None,
                dz if gated else empty, out_z if out_z is not None else empty, delta_softplus, *layout,
            )
        except Exception as refused:
            if spaced:  # a wrong x is named as x, not as the op's ckpt
                _check_x(x, u, A, compiled, form, refused)
            raise
        dB = dB.squeeze(1) if B.dim() == 3 else dB
        dC = dC.squeeze(1) if C.dim() == 3 else dC
        if not _entry_tried:
            _arm_entry()
    else:
        p = pytorch_scan.make_problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus, groups)
        ckpt = states[:, :, :-1].permute(2, 0, 1, 3).contiguous() if states is not None else None
        du, ddelta, dA, dB, dC, dD, ddelta_bias, dz, out_z = pytorch_scan.backward(
            p, dout, dz=dz, recompute_out_z=bool(recompute_out_z), checkpoints=ckpt,
            y=out if z is not None else None,
        )
        dA = dA.to(A.dtype)
        dB, dC = pytorch_scan.grad_as_given(dB, B), pytorch_scan.grad_as_given(dC, C)
    result = [
        du,
        ddelta,
        dA,
        dB,
        dC,
        _as_dtype(dD, D.dtype) if D is not None else None,
        _as_dtype(ddelta_bias, delta_bias.dtype) if delta_bias is not None else None,
    ]
    if z is not None:
        result.append(dz)
    if recompute_out_z:
        result.append(out_z)
    return result


# ---- the C entry (csrc/selective_scan/classic/compat_entry.cpp, stable/compat_entry.cpp)
#
# mamba_ssm's small layers wait on the host, where this module's Python plus a torch.ops call
# cost about twice the original's pybind11 function (docs/SCAN.md, "The ops"). The extension
# carries C functions for the common case of fwd and bwd, which call the op's body directly and
# hand every other call back to the functions above: a classic build reads the caller's tensors
# through the running torch's C++ ABI, a stable-ABI build through DLPack's C exchange API (a
# torch without it keeps the functions above). Once the compiled path has run here (so the
# extension and every GPU passed their first-use checks), selective_scan_cuda's fwd and bwd
# become those entries; torch.compile traces the functions above in their place.

_entry_tried = False


def _entry_env_rules() -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
    """(variable, values) under which fwd and bwd take the compiled path with the "recompute"
    layout: the choices' own spellings, "" for unset. Any other spelling reaches the functions
    above, which parse it."""

    def spellings(var, choices, wanted):
        ok = tuple(v for v in choices if wanted({var: v}))
        return (var, ok + ("",) if wanted({}) else ok)

    return (
        spellings(knobs.BACKEND_VAR, knobs.BACKENDS, lambda env: knobs.backend_mode(env) != "reference"),
        spellings(knobs.SCAN_STATES_VAR, knobs.SCAN_STATES_CHOICES,
                  lambda env: knobs.scan_states_for(knobs.RECOMPUTE, env) == knobs.RECOMPUTE),
    )


def _entry_arm_args(fwd_py, bwd_py) -> tuple:
    """compat_arm's arguments: the functions the entry hands calls back to, the environment
    rules, the states' spacing and where the spaced backward runs; then, for a stable build's
    entry, DLPack's C exchange API (None on a torch without it), the tensor types it reads, the
    test for a negative view and the count of active dispatch modes (both asked per call)."""
    bwd_spaced = all(_index_fits(i) for i in range(torch.cuda.device_count()))
    return (fwd_py, bwd_py, _entry_env_rules(), SPACED_STEPS, SPACED_MAX_DSTATE, bwd_spaced,
            getattr(torch.Tensor, "__dlpack_c_exchange_api__", None),
            (torch.Tensor, torch.nn.Parameter, torch.Tensor.is_neg),
            getattr(torch._C, "_len_torch_dispatch_stack", None))


def _arm_entry() -> None:
    """Make selective_scan_cuda's fwd and bwd the extension's C entry, where there is one.
    Called by a compiled call until the extension's first-use checks have passed (a caller that
    patches the dispatch reaches the compiled path before them; on a machine where some GPU
    cannot run the binary they never pass, and each call pays one dict read), then decided once."""
    global _entry_tried
    module = dispatch.ready_module(KERNEL)
    if module is None:
        return
    _entry_tried = True
    arm = getattr(module, "compat_arm", None)
    compat = sys.modules.get("selective_scan_cuda")
    # an extension without an entry, a torch without DLPack's C exchange API (which a stable
    # build reads tensors through), or a caller who replaced the functions: they stay
    if arm is None or compat is None or compat.fwd is not fwd or compat.bwd is not bwd:
        return
    try:
        from torch._dynamo import substitute_in_graph
    except ImportError:  # a torch whose compiler could not trace the functions in the entry's place
        return
    try:
        arm(*_entry_arm_args(fwd, bwd))
    except (TypeError, ValueError):  # a stable entry on a torch without DLPack's C exchange API
        return
    substitute_in_graph(module.compat_fwd, skip_signature_check=True)(fwd)
    substitute_in_graph(module.compat_bwd, skip_signature_check=True)(bwd)
    compat.fwd, compat.bwd = module.compat_fwd, module.compat_bwd


__all__ = ["fwd", "bwd"]
