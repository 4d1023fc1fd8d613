"""The raw functions of causal-conv1d's compiled module ``causal_conv1d_cuda``, on our kernels.

The top-level module ``causal_conv1d_cuda`` (shipped in this distribution) re-exports these
three functions for code that calls the extension directly (mamba_ssm up to 2.2.4 and forks of
it). Their positional signature changed between causal-conv1d releases; every form has its own
number of arguments, so each call is recognised by its arity (docs/CLIENTS.md,
"causal_conv1d_cuda"):

causal_conv1d_fwd
  4: (x, weight, bias, silu) -> out                                           (1.0)
  5: (x, weight, bias, seq_idx, silu) -> out                                  (1.1)
  7: (x, weight, bias, seq_idx, initial_states, final_states_out, silu) -> out  (1.2 to 1.5.0)
  8: (x, weight, bias, seq_idx, initial_states, out, final_states_out, silu) -> None, out
     written in place                                                          (1.5.1 on)
causal_conv1d_bwd
  6: (x, weight, bias, dout, dx, silu) -> [dx, dweight, dbias]                 (1.0)
  7: (x, weight, bias, dout, seq_idx, dx, silu) -> [dx, dweight, dbias]        (1.1)
  10: (x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, return_dinitial_states,
      silu) -> [dx, dweight, dbias, dinitial_states]                           (1.2 to 1.5.0)
  12: (x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, dweight, dbias,
      dinitial_states, silu) -> None; dx and dinitial_states written, the gradients added into
      the float32 buffers dweight and dbias                                    (1.5.1 on)
causal_conv1d_update
  5: (x, conv_state, weight, bias, silu) -> out                                (1.0 to 1.3)
  6: (x, conv_state, weight, bias, silu, cache_seqlens) -> out                 (1.4)
  7: (x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices) -> out  (1.5.0)
  8: (x, conv_state, weight, bias, out, silu, cache_seqlens, conv_state_indices) -> None, out
     written in place                                                          (1.5.1 on)

A given dx is written in place; dbias is None without bias, dinitial_states None unless asked
for; the update accepts x as (batch, dim) or (batch, dim, seqlen) in every form. The semantics,
validation and errors are those of ``causal_conv1d.cpp_functions``, which runs them (CUDA
kernel for CUDA tensors, the PyTorch implementation otherwise).
"""

from __future__ import annotations

from typing import List, Optional

import torch

from mamba_kernels.runtime.argchecks import require_writable

from .cpp_functions import (
    causal_conv1d_bwd_function,
    causal_conv1d_fwd_function,
    causal_conv1d_update_function,
)

Tensor = torch.Tensor

_FORMS = {
    "causal_conv1d_fwd": {
        4: "(x, weight, bias, silu_activation)",
        5: "(x, weight, bias, seq_idx, silu_activation)",
        7: "(x, weight, bias, seq_idx, initial_states, final_states_out, silu_activation)",
        8: "(x, weight, bias, seq_idx, initial_states, out, final_states_out, silu_activation)",
    },
    "causal_conv1d_bwd": {
        6: "(x, weight, bias, dout, dx, silu_activation)",
        7: "(x, weight, bias, dout, seq_idx, dx, silu_activation)",
        10: "(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, return_dinitial_states, "
        "silu_activation)",
        12: "(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, dweight, dbias, "
        "dinitial_states, silu_activation)",
    },
    "causal_conv1d_update": {
        5: "(x, conv_state, weight, bias, silu_activation)",
        6: "(x, conv_state, weight, bias, silu_activation, cache_seqlens)",
        7: "(x, conv_state, weight, bias, silu_activation, cache_seqlens, conv_state_indices)",
        8: "(x, conv_state, weight, bias, out, silu_activation, cache_seqlens, conv_state_indices)",
    },
}


def _form(name: str, args: tuple) -> int:
    forms = _FORMS[name]
    if len(args) not in forms:
        accepted = "; ".join(f"{n}: {sig}" for n, sig in forms.items())
        raise TypeError(
            f"causal_conv1d_cuda.{name} takes one of the causal-conv1d releases' positional forms "
            f"(number of arguments: signature): {accepted}; got {len(args)} arguments"
        )
    return len(args)


def _check_dest(name: str, what: str, dest: object, like: object) -> None:
    """A buffer the call writes (``what``) has ``like``'s shape and device and does not overlap
    itself; checked before anything runs, so a refused call changes nothing (a state neither).
    When ``like`` is not a tensor the function's own checks name it first."""
    if not isinstance(like, Tensor):
        return
    if not isinstance(dest, Tensor) or dest.shape != like.shape or dest.device != like.device:
        got = f"shape {tuple(dest.shape)}, device {dest.device}" if isinstance(dest, Tensor) else repr(dest)
        raise ValueError(
            f"causal_conv1d_cuda.{name}: {what} must be a tensor of shape {tuple(like.shape)} on "
            f"{like.device}, got {got}"
        )
    require_writable(what, dest, fn=f"causal_conv1d_cuda.{name}")


def _write(name: str, what: str, dest: Tensor, value: Tensor, add: bool = False) -> None:
    _check_dest(name, what, dest, value)
    if add:
        dest.add_(value.to(dest.dtype))
    else:
        dest.copy_(value)


def causal_conv1d_fwd(*args) -> Optional[Tensor]:
    """Forward conv (+ SiLU); see the module docstring for the accepted forms."""
    n = _form("causal_conv1d_fwd", args)
    if n == 4:
        x, weight, bias, silu = args
        return causal_conv1d_fwd_function(x, weight, bias, None, None, None, silu)
    if n == 5:
        x, weight, bias, seq_idx, silu = args
        return causal_conv1d_fwd_function(x, weight, bias, seq_idx, None, None, silu)
    if n == 7:
        return causal_conv1d_fwd_function(*args)
    x, weight, bias, seq_idx, initial_states, out, final_states_out, silu = args
    _check_dest("causal_conv1d_fwd", "out", out, x)
    result = causal_conv1d_fwd_function(x, weight, bias, seq_idx, initial_states, final_states_out, silu)
    _write("causal_conv1d_fwd", "out", out, result)
    return None


def causal_conv1d_bwd(*args) -> Optional[List[Optional[Tensor]]]:
    """Backward of the conv (+ SiLU); see the module docstring for the accepted forms."""
    n = _form("causal_conv1d_bwd", args)
    if n in (6, 7):
        x, weight, bias, dout = args[:4]
        seq_idx = args[4] if n == 7 else None
        dx, silu = args[-2:]
        dx, dweight, dbias, _ = causal_conv1d_bwd_function(
            x, weight, bias, dout, seq_idx, None, None, dx, False, silu
        )
        return [dx, dweight, dbias]
    if n == 10:
        return list(causal_conv1d_bwd_function(*args))
    x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, dweight, dbias, dinit, silu = args
    if dx is None:
        raise ValueError(
            "causal_conv1d_cuda.causal_conv1d_bwd: dx must be a tensor in the 12-argument form, got None"
        )
    _check_dest("causal_conv1d_bwd", "dweight", dweight, weight)
    if bias is not None and dbias is not None:
        _check_dest("causal_conv1d_bwd", "dbias", dbias, bias)
    if dinit is not None:
        _check_dest("causal_conv1d_bwd", "dinitial_states", dinit, initial_states)
    _, gw, gb, gi = causal_conv1d_bwd_function(
        x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, dinit is not None, silu
    )
    _write("causal_conv1d_bwd", "dweight", dweight, gw, add=True)
    if bias is not None and dbias is not None:
        _write("causal_conv1d_bwd", "dbias", dbias, gb, add=True)
    if dinit is not None:
        _write("causal_conv1d_bwd", "dinitial_states", dinit, gi)
    return None


def causal_conv1d_update(*args) -> Optional[Tensor]:
    """Decode step(s), conv_state updated in place; see the module docstring for the accepted forms."""
    n = _form("causal_conv1d_update", args)
    out = None
    if n == 8:
        x, conv_state, weight, bias, out, silu, cache_seqlens, indices = args
    else:
        x, conv_state, weight, bias, silu = args[:5]
        cache_seqlens = args[5] if n >= 6 else None
        indices = args[6] if n == 7 else None
    if n == 8:
        _check_dest("causal_conv1d_update", "out", out, x)
    two_d = isinstance(x, Tensor) and x.dim() == 2
    result = causal_conv1d_update_function(
        x.unsqueeze(-1) if two_d else x, conv_state, weight, bias, silu, cache_seqlens, indices
    )
    result = result.squeeze(-1) if two_d else result
    if n != 8:
        return result
    _write("causal_conv1d_update", "out", out, result)
    return None


__all__ = ["causal_conv1d_fwd", "causal_conv1d_bwd", "causal_conv1d_update"]
