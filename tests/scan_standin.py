"""A stand-in for the compiled selective-scan ops on CPU, so the Python around them (what is kept
for the backward, what is recomputed, x's packing) runs in tests without a GPU."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from selective_scan import selective_scan_ref


class StandInKernel:
    """The compiled ops' contract (selective_scan/_ops.py) from the per-step reference: fwd keeps
    the state after every ``state_steps`` steps (float32, complex as pairs); bwd checks that the
    states it is given are those in the layout it is told, records them and the layout, and
    returns the reference's gradients. Records each forward call's keep_y."""

    CHUNK = 64

    def __init__(self):
        self.keep_y, self.bwd_states, self.bwd_layout = [], None, None

    @property
    def fwd_calls(self) -> int:
        return len(self.keep_y)

    @property
    def fwd_entry(self):  # _ops.py's eager entries: here the same methods
        return self.fwd

    @property
    def bwd_entry(self):
        return self.bwd

    @classmethod
    def install(cls, monkeypatch) -> StandInKernel:
        """Put a fresh stand-in where ``from . import _ops`` finds selective_scan's ops."""
        import selective_scan

        kernel = cls()
        monkeypatch.setitem(sys.modules, "selective_scan._ops", kernel)
        monkeypatch.setattr(selective_scan, "_ops", kernel, raising=False)
        return kernel

    def fwd(self, u, delta, A, B, C, D, z, delta_bias, softplus, keep_y, state_steps=CHUNK, state_count=-1,
            state_pairs=False):
        self.keep_y.append(keep_y)
        ckpt = self._states(u, delta, A, B, C, D, delta_bias, softplus, state_steps, state_count, state_pairs)
        y = selective_scan_ref(u, delta, A, B, C, D, None, delta_bias, softplus)
        out_z = y * F.silu(z) if z is not None else u.new_empty((0,))
        return (y if keep_y else u.new_empty((0,))), out_z, ckpt

    @staticmethod
    def _states(u, delta, A, B, C, D, delta_bias, softplus, state_steps, state_count, state_pairs):
        L, per = u.shape[-1], 2 if A.is_complex() else 1

        def upto(t, end):  # variable B/C: the first `end` steps; fixed ones as they are
            return t[..., : per * end] if t.dim() > 2 else t

        count = state_count if state_count >= 0 else -(-L // state_steps)
        states = []
        for k in range(count):
            end = min((k + 1) * state_steps, L)
            prefix = (u[..., :end], delta[..., :end], A, upto(B, end), upto(C, end), D)
            _, last = selective_scan_ref(*prefix, None, delta_bias, softplus, True)
            states.append(torch.view_as_real(last).flatten(-2) if A.is_complex() else last)
        ckpt = torch.stack(states, 2).float()
        if state_pairs:  # (b, d, count / 2, 2, dstate, per) stored as (b, d, count / 2, dstate, 2, per)
            b, d, _, nf = ckpt.shape
            pairs = ckpt.view(b, d, count // 2, 2, nf // per, per).transpose(3, 4).contiguous()
            ckpt = pairs.view(b, d, count // 2, 2 * nf)  # two slots a row: the original's x shape
        return ckpt

    def bwd(self, u, delta, A, B, C, D, z, delta_bias, dout, ckpt, y, dz, out_z, softplus, state_steps=CHUNK,
            state_pairs=False):
        # the states must be the ones the forward writes in the layout named, which the backward
        # op takes with one more slot (the final state twice) for spaced or paired states
        self.bwd_states, self.bwd_layout = ckpt.clone(), (state_steps, state_pairs)
        layout = (state_steps, ckpt.shape[2] * (2 if state_pairs else 1), state_pairs)
        expected = self._states(u, delta, A, B, C, D, delta_bias, softplus, *layout)
        torch.testing.assert_close(ckpt, expected, rtol=0, atol=0, msg="bwd: not the forward's states")
        given = (u, delta, A, B, C, D, z, delta_bias)
        leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in given]
        with torch.enable_grad():  # autograd's backward runs with grad mode off
            selective_scan_ref(*leaves[:7], leaves[7], softplus).backward(dout)
        if z is not None:
            dz.copy_(leaves[6].grad)
        if out_z.numel():
            out_z.copy_(y * F.silu(z))
        grads = [t.grad if t is not None else torch.empty(0) for t in leaves]
        return grads[0], grads[1], grads[2], grads[3], grads[4], grads[5], grads[7]
