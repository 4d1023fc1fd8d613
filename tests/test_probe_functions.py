"""The bad-input probe of every public function of causal_conv1d and selective_scan, as a table.

Each row is (function, case, inputs builder, expectation). The builder returns the keyword
arguments of one call; the expectation is either

* ``Raises(cls, regex)``: the call raises exactly ``cls`` and the message matches ``regex``,
  which names the argument, the rule and the value seen; a refused call changes no argument
  (in-place targets keep their contents); or
* ``OK``: the call works and its results, and every argument it writes in place, equal those
  of the same call on contiguous copies of the arguments (stride-0, transposed and sliced
  inputs are valid); ``OK_EMPTY`` also checks the shapes of the results (the empty-size rule:
  batch, dim and seqlen may be 0, docs/CLIENTS.md "Argument rules").

The table is the record of what was tried (issue 42, item 4). Everything runs on CPU; the
CUDA dispatch sees the same checks before any kernel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import pytest
import torch

import causal_conv1d_cuda
import selective_scan_cuda
from causal_conv1d import causal_conv1d_fn, causal_conv1d_update
from causal_conv1d.causal_conv1d_interface import causal_conv1d_ref, causal_conv1d_update_ref
from causal_conv1d.causal_conv1d_varlen import causal_conv1d_varlen_states, causal_conv1d_varlen_states_ref
from causal_conv1d.cpp_functions import (
    causal_conv1d_bwd_function,
    causal_conv1d_fwd_function,
    causal_conv1d_update_function,
)
from selective_scan import (
    mamba_inner_fn,
    mamba_inner_ref,
    selective_scan_fn,
    selective_scan_ref,
    selective_state_update,
)

Tensor = torch.Tensor
B, D, L, W, N = 2, 4, 5, 3, 3  # batch, dim, seqlen, conv width, dstate
I32 = torch.int32
META = "meta"


@dataclass(frozen=True)
class Raises:
    cls: type
    regex: str


@dataclass(frozen=True)
class Ok:
    shapes: Optional[Tuple[Tuple[int, ...], ...]] = None  # the results' shapes, when checked
    finite_before: Optional[int] = None  # NaN at this step: every result before it stays finite


OK = Ok()


def OK_EMPTY(*shapes):
    return Ok(shapes=shapes)


# --- the functions, called with keyword arguments (positional where the API is positional) ---


def compat_conv_fwd(**kw):
    return causal_conv1d_cuda.causal_conv1d_fwd(*kw["args"])


def compat_conv_bwd(**kw):
    return causal_conv1d_cuda.causal_conv1d_bwd(*kw["args"])


def compat_conv_update(**kw):
    return causal_conv1d_cuda.causal_conv1d_update(*kw["args"])


def compat_scan_fwd(**kw):
    return selective_scan_cuda.fwd(*kw["args"])


def compat_scan_bwd(**kw):
    return selective_scan_cuda.bwd(*kw["args"])


def conv_fwd_function(x, weight, bias=None, seq_idx=None, initial_states=None, final_states_out=None,
                      silu_activation=False):
    return causal_conv1d_fwd_function(x, weight, bias, seq_idx, initial_states, final_states_out,
                                      silu_activation)


def conv_bwd_function(x, weight, dout, bias=None, seq_idx=None, initial_states=None, dfinal_states=None,
                      dx=None, return_dinitial_states=False, silu_activation=False):
    return causal_conv1d_bwd_function(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx,
                                      return_dinitial_states, silu_activation)


def conv_update_function(x, conv_state, weight, bias=None, silu_activation=False, cache_seqlens=None,
                         conv_state_indices=None):
    return causal_conv1d_update_function(x, conv_state, weight, bias, silu_activation, cache_seqlens,
                                         conv_state_indices)


# --- builders: a valid call's arguments, with changes ----------------------------------------


def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def expanded(t: Tensor, dim: int) -> Tensor:
    """t with axis ``dim`` stride 0: its first slice, expanded back."""
    return t.narrow(dim, 0, 1).expand(t.shape)


def transposed(t: Tensor) -> Tensor:
    """t's values in a tensor of reversed memory order (same shape, not contiguous)."""
    return t.permute(*reversed(range(t.dim()))).contiguous().permute(*reversed(range(t.dim())))


def sliced(t: Tensor, dim: int) -> Tensor:
    """t's values in every other element of a buffer twice as long along ``dim``."""
    shape = list(t.shape)
    shape[dim] *= 2
    buf = torch.full(shape, float("nan"), dtype=t.dtype) if t.is_floating_point() else torch.zeros(
        shape, dtype=t.dtype)
    index = [slice(None)] * t.dim()
    index[dim] = slice(0, None, 2)
    view = buf[tuple(index)]
    view.copy_(t)
    return view


def conv(b=B, d=D, l=L, w=W, **change):
    kw = dict(x=_r(b, d, l), weight=_r(d, w), bias=_r(d))
    kw.update(change)
    return kw


def conv_upd(b=B, d=D, state_len=W - 1, w=W, **change):
    kw = dict(x=_r(b, d), conv_state=_r(b, d, state_len), weight=_r(d, w), bias=_r(d))
    kw.update(change)
    return kw


def conv_bwd(b=B, d=D, l=L, w=W, **change):
    kw = dict(x=_r(b, d, l), weight=_r(d, w), dout=_r(b, d, l))
    kw.update(change)
    return kw


def varlen(tokens=7, d=D, cu=(0, 3, 7), state_len=W - 1, **change):
    kw = dict(x=_r(tokens, d), cu_seqlens=torch.tensor(cu, dtype=I32), state_len=state_len)
    kw.update(change)
    return kw


def scan(b=B, d=D, l=L, n=N, **change):
    kw = dict(u=_r(b, d, l), delta=torch.rand(b, d, l), A=-torch.rand(d, n), B=_r(b, n, l), C=_r(b, n, l),
              D=_r(d), z=_r(b, d, l), delta_bias=torch.rand(d), delta_softplus=True, return_last_state=True)
    kw.update(change)
    return kw


def ssu(b=B, h=2, d=D, n=N, g=1, heads=True, **change):
    if heads:
        kw = dict(state=_r(b, h, d, n), x=_r(b, h, d), dt=torch.rand(b, h, d), A=-torch.rand(h, d, n),
                  B=_r(b, g, n), C=_r(b, g, n), D=_r(h, d), z=_r(b, h, d), dt_bias=torch.rand(h, d),
                  dt_softplus=True)
    else:
        kw = dict(state=_r(b, d, n), x=_r(b, d), dt=torch.rand(b, d), A=-torch.rand(d, n), B=_r(b, n),
                  C=_r(b, n), D=_r(d), z=_r(b, d), dt_bias=torch.rand(d), dt_softplus=True)
    kw.update(change)
    return kw


def inner(b=B, d=D, l=L, n=N, r=2, d_model=3, **change):
    kw = dict(xz=_r(b, 2 * d, l), conv1d_weight=_r(d, 1, 4), conv1d_bias=_r(d),
              x_proj_weight=_r(r + 2 * n, d),
              delta_proj_weight=_r(d, r), out_proj_weight=_r(d_model, d), out_proj_bias=None,
              A=-torch.rand(d, n), D=torch.ones(d), delta_bias=torch.rand(d))
    kw.update(change)
    return kw


def compat_scan_fwd_args(b=B, d=D, l=L, n=N, **change):
    kw = scan(b, d, l, n, **change)
    return dict(args=(kw["u"], kw["delta"], kw["A"], kw["B"], kw["C"], kw["D"], kw["z"], kw["delta_bias"],
                      kw["delta_softplus"]))


def compat_scan_bwd_args(b=B, d=D, l=L, n=N, dz=None, dout=None, softplus=True, recompute=True, **change):
    kw = scan(b, d, l, n, **change)
    fwd_args = (kw["u"], kw["delta"], kw["A"], kw["B"], kw["C"], kw["D"], kw["z"], kw["delta_bias"], True)
    out, x, _ = selective_scan_cuda.fwd(*fwd_args)
    dout = _r(b, d, l) if dout is None else dout
    return dict(args=fwd_args[:8] + (dout, x, out, dz, softplus, recompute))


def nan_at(t: Tensor, step: int) -> Tensor:
    t = t.clone()
    t[..., step] = float("nan")
    return t


def _with(builder: Callable[..., dict], **change) -> Callable[[], dict]:
    """A row's builder: ``builder`` with ``change``, where a callable value is applied to the
    valid argument of that name (``x=transposed``)."""

    def build():
        base = builder(**{k: v for k, v in change.items() if not callable(v) and k in _SIZE_ARGS})
        for k, v in change.items():
            if k in _SIZE_ARGS:
                continue
            base[k] = v(base[k]) if callable(v) and not isinstance(v, type) else v
        return base

    return build


_SIZE_ARGS = {"b", "d", "l", "w", "n", "h", "g", "heads", "state_len", "tokens", "cu", "r", "d_model"}


def _const(value):
    """A value for ``_with`` that is used as it is even when callable."""
    return lambda _old: value


# --- the table ---------------------------------------------------------------------------------

ROWS = []


def row(fn: Callable, case: str, build: Callable[[], dict], expect) -> None:
    ROWS.append(pytest.param(fn, build, expect, id=f"{fn.__name__}-{case}"))


# causal_conv1d_fn and causal_conv1d_ref: the same rules (the reference checks the same way)
for f in (causal_conv1d_fn, causal_conv1d_ref):
    n = f.__name__
    row(f, "x-list", _with(conv, x=[[1.0]]),
        Raises(TypeError, rf"{n}: x must be a torch.Tensor, got \[\[1.0\]\]"))
    row(f, "x-2d", _with(conv, x=_const(_r(D, L))),
        Raises(ValueError, rf"{n}: x must have shape \(batch, dim, seqlen\), got .*shape \(4, 5\)"))
    row(f, "x-int", _with(conv, x=lambda t: t.long()),
        Raises(TypeError, r"x must be float32, float16, bfloat16 or float64, got a torch.int64 tensor"))
    row(f, "x-complex", _with(conv, x=lambda t: t.to(torch.complex64)),
        Raises(TypeError, r"x must be float32.*got a torch.complex64 tensor"))
    row(f, "weight-none", _with(conv, weight=None),
        Raises(TypeError, r"weight must be a torch.Tensor, got None"))
    row(f, "weight-3d", _with(conv, weight=_const(_r(D, 1, W))),
        Raises(ValueError, r"weight must have shape \(dim, width\) with dim = 4, got .*\(4, 1, 3\)"))
    row(f, "weight-dim", _with(conv, weight=_const(_r(D + 1, W))),
        Raises(ValueError, r"weight must have shape \(dim, width\) with dim = 4, got .*\(5, 3\)"))
    row(f, "weight-width-1", _with(conv, weight=_const(_r(D, 1))),
        Raises(ValueError, r"weight width \(its last size\) must be between 2 and 4, got .*\(4, 1\)"))
    row(f, "weight-width-5", _with(conv, weight=_const(_r(D, 5))),
        Raises(ValueError, r"weight width .* between 2 and 4, got .*\(4, 5\)"))
    row(f, "weight-int", _with(conv, weight=lambda t: t.int()),
        Raises(TypeError, r"weight must be float32.*got a torch.int32 tensor"))
    row(f, "weight-device", _with(conv, weight=lambda t: t.to(META)),
        Raises(ValueError, r"weight must be on x's device cpu, got .* on meta"))
    row(f, "x-device", _with(conv, x=lambda t: t.to(META)),
        Raises(ValueError, r"weight must be on x's device meta, got .* on cpu"))
    row(f, "bias-scalar", _with(conv, bias=0.0), Raises(TypeError, r"bias must be a torch.Tensor, got 0.0"))
    row(f, "bias-shape", _with(conv, bias=_const(_r(D, 1))),
        Raises(ValueError, r"bias must have shape \(dim,\) = \(4,\), got .*\(4, 1\)"))
    row(f, "bias-dtype", _with(conv, bias=lambda t: t.half()),
        Raises(TypeError, r"bias must have weight's dtype torch.float32, got a torch.float16"))
    row(f, "seq_idx-int64", _with(conv, seq_idx=torch.zeros(B, L, dtype=torch.int64)),
        Raises(TypeError, r"seq_idx must be an int32 tensor, got a torch.int64"))
    row(f, "seq_idx-shape", _with(conv, seq_idx=torch.zeros(B, L + 1, dtype=I32)),
        Raises(ValueError, r"seq_idx must have shape \(batch, seqlen\) = \(2, 5\), got .*\(2, 6\)"))
    row(f, "initial_states-shape", _with(conv, initial_states=_r(B, D, W)),
        Raises(ValueError,
            r"initial_states must have shape \(batch, dim, width - 1\) = \(2, 4, 2\), got .*\(2, 4, 3\)"))
    row(f, "initial_states-dtype", _with(conv, initial_states=_r(B, D, W - 1, dtype=torch.float64)),
        Raises(TypeError, r"initial_states must have x's dtype torch.float32, got a torch.float64"))
    row(f, "final_states_out-expanded",
        _with(conv, return_final_states=True, final_states_out=torch.zeros(1, D, W - 1).expand(B, D, W - 1)),
        Raises(ValueError,
            r"final_states_out is written in place and must not overlap itself.*strides \(0, "))
    row(f, "final_states_out-shape", _with(conv, return_final_states=True, final_states_out=_r(B, D, W)),
        Raises(ValueError, r"final_states_out must have shape \(batch, dim, width - 1\)"))
    row(f, "return_final_states-str", _with(conv, return_final_states="yes"),
        Raises(TypeError, r"return_final_states must be a bool, got 'yes'"))
    for bad in ("relu", "SiLU", 1, ""):
        row(f, f"activation-{bad!r}", _with(conv, activation=bad),
            Raises(NotImplementedError,
                rf"activation must be None, silu, or swish, got {re.escape(repr(bad))}"))
    # valid but unusual: match the contiguous call
    row(f, "x-channel-last", _with(conv, x=transposed, activation="silu"), OK)
    row(f, "x-sliced-time", _with(conv, x=lambda t: sliced(t, 2)), OK)
    row(f, "x-stride0-batch", _with(conv, x=lambda t: expanded(t, 0)), OK)
    row(f, "weight-stride0", _with(conv, weight=lambda t: expanded(t, 0)), OK)
    row(f, "weight-transposed", _with(conv, weight=transposed), OK)
    row(f, "bias-stride0", _with(conv, bias=lambda t: expanded(t, 0)), OK)
    row(f, "initial_states-stride0", _with(conv, initial_states=expanded(_r(B, D, W - 1), 0),
                                           return_final_states=True), OK)
    row(f, "seq_idx-stride0",
        _with(conv, seq_idx=torch.tensor([[0, 0, 1, 1, 1]], dtype=I32).expand(B, L)), OK)
    row(f, "final_states_out-transposed", _with(conv, return_final_states=True,
                                                final_states_out=transposed(torch.zeros(B, D, W - 1))), OK)
    row(f, "float64",
        _with(conv, x=lambda t: t.double(), weight=lambda t: t.double(), bias=lambda t: t.double()),
        OK)
    row(f, "weight-half-x-float", _with(conv, weight=lambda t: t.half(), bias=lambda t: t.half()), OK)
    row(f, "nan-at-step-3", _with(conv, x=lambda t: nan_at(t, 3)), Ok(finite_before=3))
    row(f, "batch-0", _with(conv, b=0, return_final_states=True), OK_EMPTY((0, D, L), (0, D, W - 1)))
    row(f, "dim-0", _with(conv, d=0, return_final_states=True), OK_EMPTY((B, 0, L), (B, 0, W - 1)))
    row(f, "seqlen-0", _with(conv, l=0, return_final_states=True, initial_states=_r(B, D, W - 1)),
        OK_EMPTY((B, D, 0), (B, D, W - 1)))
    row(f, "seqlen-0-seq_idx",
        _with(conv, l=0, return_final_states=True, seq_idx=torch.zeros(B, 0, dtype=I32)),
        OK_EMPTY((B, D, 0), (B, D, W - 1)))
row(causal_conv1d_fn, "seq_idx-activation-positional", lambda: dict(**conv(), seq_idx="silu"),
    Raises(TypeError, r"seq_idx \(4th positional argument since causal-conv1d 1.1\) must be an int32 tensor"))

# the decode step of the conv (and its reference)
for f in (causal_conv1d_update, causal_conv1d_update_ref):
    n = f.__name__
    row(f, "x-4d", _with(conv_upd, x=_const(_r(B, D, 1, 1))),
        Raises(ValueError,
            rf"{n}: x must have shape \(batch, dim\) or \(batch, dim, seqlen\), got .*\(2, 4, 1, 1\)"))
    row(f, "x-int", _with(conv_upd, x=lambda t: t.int()),
        Raises(TypeError, r"x must be float32.*torch.int32"))
    row(f, "conv_state-list", _with(conv_upd, conv_state=[0.0]),
        Raises(TypeError, r"conv_state must be a torch.Tensor, got \[0.0\]"))
    row(f, "conv_state-expanded", _with(conv_upd, conv_state=lambda t: expanded(t, 0)),
        Raises(ValueError,
            r"conv_state is written in place and must not overlap itself.*strides \(0, 2, 1\)"))
    row(f, "conv_state-leaf-requires-grad", _with(conv_upd, conv_state=lambda t: t.requires_grad_()),
        Raises(ValueError, r"conv_state is written in place and must not be a leaf that requires grad"))
    row(f, "conv_state-dtype", _with(conv_upd, conv_state=lambda t: t.double()),
        Raises(TypeError, r"conv_state must have x's dtype torch.float32, got a torch.float64"))
    row(f, "conv_state-short", _with(conv_upd, state_len=1),
        Raises(ValueError, r"conv_state must have state_len >= width - 1 = 2, got .*\(2, 4, 1\)"))
    row(f, "conv_state-dim", _with(conv_upd, conv_state=_const(_r(B, D + 1, W - 1))),
        Raises(ValueError,
            r"conv_state must have shape \(batch, dim, state_len\) with dim = 4, got .*\(2, 5, 2\)"))
    row(f, "conv_state-batch", _with(conv_upd, conv_state=_const(_r(B + 1, D, W - 1))),
        Raises(ValueError,
            r"conv_state must have batch = 2 entries when conv_state_indices is None, got .*\(3, 4, 2\)"))
    row(f, "cache_seqlens-negative", _with(conv_upd, cache_seqlens=torch.tensor([0, -1], dtype=I32)),
        Raises(ValueError, r"cache_seqlens must be >= 0, got \[0, -1\]"))
    row(f, "cache_seqlens-int64", _with(conv_upd, cache_seqlens=torch.zeros(B, dtype=torch.int64)),
        Raises(TypeError, r"cache_seqlens must be an int32 tensor, got a torch.int64"))
    row(f, "cache_seqlens-list", _with(conv_upd, cache_seqlens=[0, 1]),
        Raises(TypeError, r"cache_seqlens must be a torch.Tensor, got \[0, 1\]"))
    row(f, "activation-gelu", _with(conv_upd, activation="gelu"),
        Raises(NotImplementedError, r"activation must be None, silu, or swish, got 'gelu'"))
    row(f, "x-transposed", _with(conv_upd, x=transposed), OK)
    row(f, "x-stride0", _with(conv_upd, x=lambda t: expanded(t, 0)), OK)
    row(f, "conv_state-sliced", _with(conv_upd, conv_state=lambda t: sliced(t, 2)), OK)
    row(f, "conv_state-long-transposed", _with(conv_upd, state_len=5, conv_state=transposed), OK)
    row(f, "cache_seqlens", _with(conv_upd, state_len=5, cache_seqlens=torch.tensor([1, 4], dtype=I32)), OK)
    row(f, "batch-0", _with(conv_upd, b=0), OK_EMPTY((0, D)))
    row(f, "dim-0", _with(conv_upd, d=0), OK_EMPTY((B, 0)))
    row(f, "seqlen-0", _with(conv_upd, x=_const(_r(B, D, 0))), OK_EMPTY((B, D, 0)))
f = causal_conv1d_update
row(f, "indices-repeat", _with(conv_upd, conv_state=_const(_r(3, D, W - 1)),
                               conv_state_indices=torch.tensor([1, 1], dtype=I32)),
    Raises(ValueError, r"conv_state_indices must not repeat a state row, got \[1, 1\]"))
row(f, "indices-range", _with(conv_upd, conv_state_indices=torch.tensor([0, 2], dtype=I32)),
    Raises(ValueError, r"conv_state_indices must be < conv_state.shape\[0\] = 2 .*got \[0, 2\]"))
row(f, "indices-int64", _with(conv_upd, conv_state_indices=torch.zeros(B, dtype=torch.int64)),
    Raises(TypeError, r"conv_state_indices must be an int32 tensor, got a torch.int64"))
row(f, "indices-expanded-state",
    _with(conv_upd, conv_state=_const(torch.zeros(1, D, W - 1).expand(3, D, W - 1)),
                                       conv_state_indices=torch.tensor([0, 2], dtype=I32)),
    Raises(ValueError, r"conv_state is written in place and must not overlap itself"))
row(f, "indices-padding", _with(conv_upd, conv_state=_const(_r(3, D, W - 1)),
                                conv_state_indices=torch.tensor([2, -1], dtype=I32)), OK)
row(f, "indices-batch-0", _with(conv_upd, b=0, conv_state=_const(_r(3, D, W - 1)),
                                conv_state_indices=torch.zeros(0, dtype=I32)), OK_EMPTY((0, D)))

# the functional layer (cpp_functions) that every path goes through
f = conv_fwd_function
row(f, "silu-str", _with(conv, silu_activation="silu"),
    Raises(TypeError, r"causal_conv1d_fwd_function: silu_activation must be a bool, got 'silu'"))
row(f, "x-transposed", _with(conv, x=transposed), OK)
f = conv_bwd_function
row(f, "dout-shape", _with(conv_bwd, dout=_const(_r(B, D, L + 1))),
    Raises(ValueError,
        r"dout must have shape x's shape \(batch, dim, seqlen\) = \(2, 4, 5\), got .*\(2, 4, 6\)"))
row(f, "dout-dtype", _with(conv_bwd, dout=lambda t: t.half()),
    Raises(TypeError, r"dout must have x's dtype torch.float32, got a torch.float16"))
row(f, "dx-expanded", _with(conv_bwd, dx=torch.zeros(1, D, L).expand(B, D, L)),
    Raises(ValueError, r"dx is written in place and must not overlap itself.*strides \(0, 5, 1\)"))
row(f, "return_dinitial_states-str",
    _with(conv_bwd, initial_states=_r(B, D, W - 1), return_dinitial_states="y"),
    Raises(TypeError, r"return_dinitial_states must be a bool, got 'y'"))
row(f, "return_dinitial_states-without-states", _with(conv_bwd, return_dinitial_states=True),
    Raises(ValueError, r"return_dinitial_states needs initial_states to be given, got True"))
row(f, "dout-stride0", _with(conv_bwd, dout=lambda t: expanded(t, 2)), OK)
row(f, "dx-transposed", _with(conv_bwd, dx=transposed(torch.zeros(B, D, L))), OK)
row(f, "batch-0", _with(conv_bwd, b=0), OK_EMPTY((0, D, L), (D, W), None, None))
row(f, "seqlen-0", _with(conv_bwd, l=0, initial_states=_r(B, D, W - 1), dfinal_states=_r(B, D, W - 1),
                         return_dinitial_states=True), OK_EMPTY((B, D, 0), (D, W), None, (B, D, W - 1)))
f = conv_update_function
row(f, "x-2d", _with(conv_upd),
    Raises(ValueError,
        r"causal_conv1d_update_function: x must have shape \(batch, dim, seqlen\), got .*\(2, 4\)"))

# packed variable-length sequences
for f in (causal_conv1d_varlen_states, causal_conv1d_varlen_states_ref):
    row(f, "x-3d", _with(varlen, x=_const(_r(2, 3, D))),
        Raises(ValueError, r"x must be \(total_tokens, dim\), got .*\(2, 3, 4\)"))
    row(f, "x-int", _with(varlen, x=lambda t: t.int()), Raises(TypeError, r"x must be float32.*torch.int32"))
    row(f, "cu_seqlens-float", _with(varlen, cu_seqlens=lambda t: t.float()),
        Raises(TypeError, r"cu_seqlens must be an int32 or int64 tensor, got a torch.float32"))
    row(f, "cu_seqlens-2d", _with(varlen, cu_seqlens=lambda t: t[None]),
        Raises(ValueError, r"cu_seqlens must be \(batch \+ 1,\), got .*\(1, 3\)"))
    row(f, "cu_seqlens-start", _with(varlen, cu=(1, 3, 7)),
        Raises(ValueError, r"cu_seqlens must start at 0, never decrease and end at most at total_tokens = 7, "
                           r"got \[1, 3, 7\]"))
    row(f, "cu_seqlens-decreasing", _with(varlen, cu=(0, 5, 3)),
        Raises(ValueError, r"never decrease.*\[0, 5, 3\]"))
    row(f, "cu_seqlens-past-end", _with(varlen, cu=(0, 3, 8)),
        Raises(ValueError, r"at most at .* 7, got \[0, 3, 8\]"))
    row(f, "cu_seqlens-device", _with(varlen, cu_seqlens=lambda t: t.to(META)),
        Raises(ValueError, r"cu_seqlens must be on x's device cpu, got .* on meta"))
    row(f, "state_len-0", _with(varlen, state_len=0), Raises(ValueError, r"state_len must be >= 1, got 0"))
    row(f, "state_len-float", _with(varlen, state_len=2.0),
        Raises(TypeError, r"state_len must be an int, got 2.0"))
    row(f, "state_len-bool", _with(varlen, state_len=True),
        Raises(TypeError, r"state_len must be an int, got True"))
    row(f, "cu_seqlens-list", _with(varlen, cu_seqlens=[0, 7]),
        Raises(TypeError, r"cu_seqlens must be a torch.Tensor, got \[0, 7\]"))
    row(f, "x-transposed", _with(varlen, x=transposed), OK)
    row(f, "x-stride0", _with(varlen, x=lambda t: expanded(t, 1)), OK)
    row(f, "cu_seqlens-int64-empty-sequence", _with(varlen, cu_seqlens=torch.tensor([0, 0, 7])), OK)
    row(f, "tokens-0", _with(varlen, tokens=0, cu=(0, 0)), OK_EMPTY((1, D, W - 1)))
    row(f, "batch-0", _with(varlen, cu=(0,)), OK_EMPTY((0, D, W - 1)))
    row(f, "dim-0", _with(varlen, d=0), OK_EMPTY((2, 0, W - 1)))

# causal_conv1d_cuda, the compiled module's names (the same checks, then its own buffers')
x0, w0, s0 = _r(B, D, L), _r(D, W), _r(B, D, W - 1)
row(compat_conv_fwd, "arity-3", lambda: dict(args=(x0, w0, None)),
    Raises(TypeError, r"causal_conv1d_cuda.causal_conv1d_fwd takes one of .* got 3 arguments"))
row(compat_conv_fwd, "form8-out-expanded",
    lambda: dict(args=(x0, w0, None, None, None, torch.zeros(1, D, L).expand(B, D, L), None, False)),
    Raises(ValueError, r"causal_conv1d_cuda.causal_conv1d_fwd: out is written in place and must not overlap"))
row(compat_conv_fwd, "form8-out-shape",
    lambda: dict(args=(x0, w0, None, None, None, torch.zeros(B, D, L + 1), None, False)),
    Raises(ValueError, r"out must be a tensor of shape \(2, 4, 5\) on cpu, got shape \(2, 4, 6\)"))
row(compat_conv_fwd, "form4-silu-str", lambda: dict(args=(x0, w0, None, "silu")),
    Raises(TypeError, r"silu_activation must be a bool, got 'silu'"))
row(compat_conv_fwd, "form8-out-transposed",
    lambda: dict(args=(x0, w0, None, None, None, transposed(torch.zeros(B, D, L)), None, True)), OK)
row(compat_conv_bwd, "form12-dweight-shape",
    lambda: dict(args=(x0, w0, None, _r(B, D, L), None, None, None, torch.zeros(B, D, L),
                       torch.zeros(D, W + 1),
                       None, None, False)),
    Raises(ValueError, r"dweight must be a tensor of shape \(4, 3\) on cpu, got shape \(4, 4\)"))
row(compat_conv_bwd, "form12-dweight-expanded",
    lambda: dict(args=(x0, w0, None, _r(B, D, L), None, None, None, torch.zeros(B, D, L),
                       torch.zeros(1, W).expand(D, W), None, None, False)),
    Raises(ValueError, r"dweight is written in place and must not overlap itself"))
row(compat_conv_bwd, "form12-dx-none",
    lambda: dict(args=(x0, w0, None, _r(B, D, L), None, None, None, None, torch.zeros(D, W), None, None,
                       False)),
    Raises(ValueError, r"dx must be a tensor in the 12-argument form, got None"))
row(compat_conv_update, "form8-out-shape",
    lambda: dict(args=(_r(B, D), s0.clone(), w0, None, torch.zeros(B, D + 1), False, None, None)),
    Raises(ValueError, r"causal_conv1d_cuda.causal_conv1d_update: out must be a tensor of shape \(2, 4\)"))
row(compat_conv_update, "form5-state-expanded",
    lambda: dict(args=(_r(B, D), expanded(s0, 0), w0, None, False)),
    Raises(ValueError, r"conv_state is written in place and must not overlap itself"))
row(compat_conv_update, "form8-out-sliced",
    lambda: dict(args=(_r(B, D), s0.clone(), w0, None, sliced(torch.zeros(B, D), 1), True, None, None)), OK)

# selective_scan_fn and selective_scan_ref
for f in (selective_scan_fn, selective_scan_ref):
    row(f, "u-list", _with(scan, u=[[1.0]]), Raises(TypeError, r"u must be a torch.Tensor, got list"))
    row(f, "u-2d", _with(scan, u=_const(_r(D, L))),
        Raises(ValueError, r"u must be 3-D \(batch, dim, L\), got 2-D \(4, 5\)"))
    row(f, "u-int", _with(scan, u=lambda t: t.int(), delta=lambda t: t.int()),
        Raises(TypeError, r"u must be float32, float16, bfloat16 or float64, got torch.int32"))
    row(f, "delta-shape", _with(scan, delta=_const(torch.rand(B, D, L + 1))),
        Raises(ValueError,
            r"delta must have shape \(2, 4, 5\) \(same as u: \(batch, dim, L\)\), got \(2, 4, 6\)"))
    row(f, "delta-dtype", _with(scan, delta=lambda t: t.half()),
        Raises(TypeError, r"delta must have u's dtype torch.float32, got torch.float16"))
    row(f, "A-shape", _with(scan, A=_const(-torch.rand(D + 1, N))),
        Raises(ValueError, r"A must have shape \(dim, dstate\) with dim=4, got \(5, 3\)"))
    row(f, "A-half", _with(scan, A=lambda t: t.half()),
        Raises(TypeError, r"A must be float32 or complex64 .* got torch.float16 with u torch.float32"))
    row(f, "dstate-0", _with(scan, n=0),
        Raises(ValueError, r"dstate \(A.shape\[1\]\) must be between 1 and 256, got 0"))
    row(f, "dstate-257", _with(scan, n=257, l=1),
        Raises(ValueError, r"dstate \(A.shape\[1\]\) must be between 1 and 256, got 257"))
    row(f, "B-5d", _with(scan, B=lambda t: t[:, None, None]), Raises(ValueError, r"B must be 2-D .* got 5-D"))
    row(f, "B-length", _with(scan, B=_const(_r(B, N, L + 1))),
        Raises(ValueError,
            r"B must have shape \(2, 3, 5\) \(\(batch, \[ngroups,\] dstate, L\)\), got \(2, 3, 6\)"))
    row(f, "C-dtype", _with(scan, C=lambda t: t.double()),
        Raises(TypeError, r"variable C must have u's dtype torch.float32, got torch.float64"))
    row(f, "D-dtype", _with(scan, D=lambda t: t.half()),
        Raises(TypeError, r"D must be torch.float32 .*got torch.float16"))
    row(f, "D-scalar", _with(scan, D=1.0), Raises(TypeError, r"D must be a torch.Tensor, got float"))
    row(f, "z-shape", _with(scan, z=_const(_r(B, D, L + 1))),
        Raises(ValueError, r"z must have shape \(2, 4, 5\)"))
    row(f, "delta_bias-device", _with(scan, delta_bias=lambda t: t.to(META)),
        Raises(ValueError, r"all tensors must be on one device: u is on cpu but delta_bias is on meta"))
    row(f, "delta_softplus-str", _with(scan, delta_softplus="no"),
        Raises(TypeError, r"delta_softplus must be a bool \(True or False\), got str 'no'"))
    row(f, "groups-dim", _with(scan, B=_const(_r(B, 3, N, L)), C=_const(_r(B, 3, N, L))),
        Raises(ValueError, r"dim must be divisible by ngroups: dim=4, ngroups=3"))
    row(f, "u-transposed", _with(scan, u=transposed, z=transposed), OK)
    row(f, "delta-stride0", _with(scan, delta=lambda t: expanded(t, 0)), OK)
    row(f, "A-stride0", _with(scan, A=lambda t: expanded(t, 0)), OK)
    row(f, "B-stride0-time", _with(scan, B=lambda t: expanded(t, 2), C=lambda t: sliced(t, 1)), OK)
    row(f, "D-stride0", _with(scan, D=lambda t: expanded(t, 0), delta_bias=lambda t: expanded(t, 0)), OK)
    row(f, "B-fixed", _with(scan, B=_const(_r(D, N)), C=_const(transposed(_r(D, N)))), OK)
    row(f, "complex-A",
        _with(scan, A=lambda t: torch.complex(t, torch.rand_like(t)), B=_const(_r(B, N, 2 * L)),
                              C=_const(_r(B, N, 2 * L))), OK)
    wide = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
    row(f, "float64", _with(scan, **{k: (lambda t: t.double()) for k in wide}), OK)
    row(f, "nan-at-step-2", _with(scan, u=lambda t: nan_at(t, 2), return_last_state=False),
        Ok(finite_before=2))
    row(f, "batch-0", _with(scan, b=0), OK_EMPTY((0, D, L), (0, D, N)))
    row(f, "dim-0", _with(scan, d=0), OK_EMPTY((B, 0, L), (B, 0, N)))
    row(f, "seqlen-0", _with(scan, l=0), OK_EMPTY((B, D, 0), (B, D, N)))

# selective_scan_cuda, the compiled module's names
row(compat_scan_fwd, "u-2d", lambda: dict(args=(_r(D, L),) + compat_scan_fwd_args()["args"][1:]),
    Raises(ValueError, r"u must be 3-D \(batch, dim, L\), got 2-D \(4, 5\)"))
row(compat_scan_fwd, "delta_softplus-int", lambda: dict(args=compat_scan_fwd_args()["args"][:8] + (1,)),
    Raises(TypeError, r"delta_softplus must be a bool \(True or False\), got int 1"))
row(compat_scan_fwd, "dstate-0", lambda: compat_scan_fwd_args(n=0),
    Raises(ValueError, r"dstate \(A.shape\[1\]\) must be between 1 and 256, got 0"))
row(compat_scan_fwd, "u-transposed",
    lambda: dict(args=(transposed(_r(B, D, L)),) + compat_scan_fwd_args()["args"][1:]),
    OK)
row(compat_scan_fwd, "seqlen-0", lambda: compat_scan_fwd_args(l=0),
    OK_EMPTY((B, D, 0), (B, D, 1, 2 * N), (B, D, 0)))
row(compat_scan_fwd, "batch-0", lambda: compat_scan_fwd_args(b=0),
    OK_EMPTY((0, D, L), (0, D, 1, 2 * N), (0, D, L)))
row(compat_scan_bwd, "dz-expanded", lambda: compat_scan_bwd_args(dz=torch.zeros(1, D, L).expand(B, D, L)),
    Raises(ValueError, r"selective_scan_cuda.bwd: dz is written in place and must not overlap itself"))
row(compat_scan_bwd, "dout-shape", lambda: compat_scan_bwd_args(dout=_r(B, D, L + 1)),
    Raises(ValueError, r"dout must have u's shape \(2, 4, 5\) and device cpu, got shape \(2, 4, 6\)"))
row(compat_scan_bwd, "recompute_out_z-str", lambda: compat_scan_bwd_args(recompute="yes"),
    Raises(TypeError, r"recompute_out_z must be a bool \(True or False\), got str 'yes'"))
row(compat_scan_bwd, "dz-sliced", lambda: compat_scan_bwd_args(dz=sliced(torch.zeros(B, D, L), 2)), OK)
row(compat_scan_bwd, "seqlen-0", lambda: compat_scan_bwd_args(l=0),
    OK_EMPTY((B, D, 0), (B, D, 0), (D, N), (B, N, 0), (B, N, 0), (D,), (D,), (B, D, 0), (B, D, 0)))

# mamba_inner_fn and mamba_inner_ref
for f in (mamba_inner_fn, mamba_inner_ref):
    row(f, "xz-list", _with(inner, xz=[1.0]), Raises(TypeError, r"xz must be a torch.Tensor, got list"))
    row(f, "xz-2d", _with(inner, xz=_const(_r(2 * D, L))),
        Raises(ValueError,
            r"xz must be 3-D \(batch, 2\*d_inner, L\) with an even channel count, got \(8, 5\)"))
    row(f, "xz-odd", _with(inner, xz=_const(_r(B, 2 * D + 1, L))),
        Raises(ValueError, r"xz must be .* got \(2, 9, 5\)"))
    row(f, "xz-int", _with(inner, xz=lambda t: t.int()),
        Raises(TypeError, r"xz must be float32, float16, bfloat16 or float64, got torch.int32"))
    row(f, "conv1d_weight-2d", _with(inner, conv1d_weight=lambda t: t[:, 0]),
        Raises(ValueError,
            r"conv1d_weight must have shape \(d_inner, 1, width\) with d_inner=4, got \(4, 4\)"))
    row(f, "conv1d_weight-width-5", _with(inner, conv1d_weight=_const(_r(D, 1, 5))),
        Raises(ValueError, r"conv1d_weight width \(its last size\) must be between 2 and 4, got \(4, 1, 5\)"))
    row(f, "x_proj_weight-rows", _with(inner, x_proj_weight=_const(_r(7, D))),
        Raises(ValueError,
            r"x_proj_weight must have shape \(dt_rank \+ 2 \* d_state, d_inner\) = \(8, 4\).*got \(7, 4\)"))
    row(f, "delta_proj_weight-shape", _with(inner, delta_proj_weight=_const(_r(D + 1, 2))),
        Raises(ValueError,
            r"delta_proj_weight must have shape \(d_inner, dt_rank\) with d_inner=4, got \(5, 2\)"))
    row(f, "out_proj_weight-shape", _with(inner, out_proj_weight=_const(_r(3, D + 1))),
        Raises(ValueError,
            r"out_proj_weight must have shape \(d_model, d_inner\) with d_inner=4, got \(3, 5\)"))
    row(f, "A-shape", _with(inner, A=_const(-torch.rand(D + 1, N))),
        Raises(ValueError, r"A must have shape \(d_inner, dstate\) with d_inner=4, got \(5, 3\)"))
    row(f, "A-device", _with(inner, A=lambda t: t.to(META)),
        Raises(ValueError, r"all tensors must be on one device: xz is on cpu but A is on meta"))
    row(f, "delta_softplus-str", _with(inner, delta_softplus="yes"),
        Raises(TypeError, r"delta_softplus must be a bool \(True or False\), got str 'yes'"))
    row(f, "xz-channel-last", _with(inner, xz=lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)), OK)
    row(f, "A-stride0", _with(inner, A=lambda t: expanded(t, 0)), OK)
    row(f, "x_proj_weight-float64", _with(inner, x_proj_weight=lambda t: t.double()),
        Raises(TypeError, r"x_proj_weight must have xz's dtype torch.float32 .*got torch.float64"))
    row(f, "out_proj_weight-int", _with(inner, out_proj_weight=lambda t: t.int()),
        Raises(TypeError, r"out_proj_weight must have xz's dtype torch.float32 .*got torch.int32"))
    row(f, "conv1d_weight-int", _with(inner, conv1d_weight=lambda t: t.int()),
        Raises(TypeError, r"conv1d_weight must be float32, float16, bfloat16 or float64, got torch.int32"))
    row(f, "conv1d_bias-shape", _with(inner, conv1d_bias=_const(_r(D + 1))),
        Raises(ValueError, r"conv1d_bias must have shape \(4,\) \(\(d_inner,\)\), got \(5,\)"))
    row(f, "conv1d_bias-dtype", _with(inner, conv1d_bias=lambda t: t.double()),
        Raises(TypeError, r"conv1d_bias must have conv1d_weight's dtype torch.float32, got torch.float64"))
    row(f, "out_proj_bias-shape", _with(inner, out_proj_bias=_r(5)),
        Raises(ValueError, r"out_proj_bias must have shape \(3,\) \(\(d_model,\)\), got \(5,\)"))
    row(f, "B_proj_bias-shape", _with(inner, B_proj_bias=_r(7)),
        Raises(ValueError, r"B_proj_bias must have shape \(3,\) \(\(d_state,\)\), got \(7,\)"))
    row(f, "D-float64", _with(inner, D=lambda t: t.double()),
        Raises(TypeError, r"D must be torch.float32 .*got torch.float64"))
    row(f, "biases-given", _with(inner, out_proj_bias=_r(3), B_proj_bias=_r(N), C_proj_bias=_r(N)), OK)
    row(f, "batch-0", _with(inner, b=0), OK_EMPTY((0, L, 3)))
    row(f, "seqlen-0", _with(inner, l=0), OK_EMPTY((B, 0, 3)))
f = mamba_inner_fn
row(f, "checkpoint_lvl-2", _with(inner, checkpoint_lvl=2),
    Raises(ValueError, r"checkpoint_lvl must be 0 or 1, got 2"))
row(f, "b_rms_weight-shape", _with(inner, b_rms_weight=_r(N + 1)),
    Raises(ValueError,
        r"b_rms_weight must have shape \(3,\) \(one weight per normalised feature\), got \(4,\)"))
row(f, "b_c_dt_rms_eps-str", _with(inner, b_c_dt_rms_eps="x", b_rms_weight=torch.ones(N)),
    Raises(TypeError, r"b_c_dt_rms_eps must be a number >= 0, got 'x'"))
row(f, "b_c_dt_rms_eps-negative", _with(inner, b_c_dt_rms_eps=-1.0),
    Raises(ValueError, r"b_c_dt_rms_eps must be a number >= 0, got -1.0"))
row(f, "rms-norms",
    _with(inner, b_rms_weight=torch.ones(N), c_rms_weight=torch.ones(N), dt_rms_weight=torch.ones(D)), OK)

# selective_state_update, with and without heads
f = selective_state_update
for heads in (True, False):
    h = "heads" if heads else "no-heads"
    st = "(batch, nheads, dim)" if heads else "(batch, dim)"
    row(f, f"{h}-state-expanded-batch", _with(ssu, heads=heads, state=lambda t: expanded(t, 0)),
        Raises(ValueError,
            r"state is written in place and must not overlap itself .*got shape \(2, .* with strides \(0, "))
    row(f, f"{h}-state-expanded-batch-indices",
        _with(ssu, heads=heads, state=lambda t: expanded(t, 0), state_batch_indices=torch.tensor([1, 0])),
        Raises(ValueError, r"state is written in place and must not overlap itself"))
    row(f, f"{h}-state-overlapping-rows", _with(ssu, heads=heads, state=lambda t: t.flatten().as_strided(
        t.shape, (1,) + t.stride()[1:])),
        Raises(ValueError, r"state is written in place and must not overlap itself"))
    row(f, f"{h}-state-leaf-requires-grad", _with(ssu, heads=heads, state=lambda t: t.requires_grad_()),
        Raises(ValueError, r"state is written in place and must not be a leaf that requires grad"))
    row(f, f"{h}-dstate-0", _with(ssu, heads=heads, n=0),
        Raises(ValueError, r"dstate \(state.shape\[-1\]\) must be >= 1, got 0"))
    row(f, f"{h}-x-0d", _with(ssu, heads=heads, x=_const(torch.tensor(1.0))),
        Raises(ValueError, rf"x must be {re.escape(st)}, matching state, got \(\)"))
    row(f, f"{h}-x-rank", _with(ssu, heads=heads, x=lambda t: t[..., None]),
        Raises(ValueError, rf"x must be {re.escape(st)}, matching state, got \(2, .*1\)"))
    row(f, f"{h}-x-shape", _with(ssu, heads=heads, x=lambda t: t[..., :1]),
        Raises(ValueError,
            rf"x must have shape \(2, .*4\) \({re.escape(st)}, matching state\), got \(2, .*1\)"))
    row(f, f"{h}-x-list", _with(ssu, heads=heads, x=[1.0]),
        Raises(TypeError, r"x must be a torch.Tensor, got list"))
    row(f, f"{h}-A-int", _with(ssu, heads=heads, A=lambda t: t.int()),
        Raises(TypeError,
            r"A must be a real floating dtype \(float32/16, bfloat16, float64\), got torch.int32"))
    row(f, f"{h}-z-device", _with(ssu, heads=heads, z=lambda t: t.to(META)),
        Raises(ValueError, r"all tensors must be on one device: state is on cpu but z is on meta"))
    row(f, f"{h}-dt_softplus-str", _with(ssu, heads=heads, dt_softplus="no"),
        Raises(TypeError, r"dt_softplus must be a bool \(True or False\), got str 'no'"))
    row(f, f"{h}-indices-repeat", _with(ssu, heads=heads, state_batch_indices=torch.tensor([1, 1])),
        Raises(ValueError, r"state_batch_indices must not repeat a state slot, got \[1, 1\]"))
    row(f, f"{h}-indices-range", _with(ssu, heads=heads, state_batch_indices=torch.tensor([0, 2])),
        Raises(ValueError,
            r"state_batch_indices must be < state.shape\[0\]=2 \(negative = padding\), got \[0, 2\]"))
    row(f, f"{h}-indices-float", _with(ssu, heads=heads, state_batch_indices=torch.zeros(2)),
        Raises(ValueError,
            r"state_batch_indices must be an int32/int64 tensor of shape \(2,\), got torch.float32 \(2,\)"))
    row(f, f"{h}-indices-list", _with(ssu, heads=heads, state_batch_indices=[0, 1]),
        Raises(TypeError, r"state_batch_indices must be a torch.Tensor, got list"))
    row(f, f"{h}-state-bool", _with(ssu, heads=heads, state=lambda t: t.bool()),
        Raises(TypeError, r"state must be a real floating dtype .*got torch.bool"))
    row(f, f"{h}-state-sliced", _with(ssu, heads=heads, state=lambda t: sliced(t, -1)), OK)
    row(f, f"{h}-state-transposed", _with(ssu, heads=heads, state=transposed), OK)
    row(f, f"{h}-A-stride0", _with(ssu, heads=heads, A=lambda t: expanded(expanded(t, -1), -2)), OK)
    row(f, f"{h}-x-stride0",
        _with(ssu, heads=heads, x=lambda t: expanded(t, 0), dt=lambda t: expanded(t, -1)), OK)
    row(f, f"{h}-mixed-dtypes", _with(ssu, heads=heads, x=lambda t: t.double(), B=lambda t: t.half()), OK)
    row(f, f"{h}-indices-padding",
        _with(ssu, heads=heads, state_batch_indices=torch.tensor([-1, 0], dtype=I32)), OK)
    row(f, f"{h}-batch-0", _with(ssu, heads=heads, b=0), OK_EMPTY((0, 2, D) if heads else (0, D)))
    row(f, f"{h}-dim-0", _with(ssu, heads=heads, d=0), OK_EMPTY((B, 2, 0) if heads else (B, 0)))
row(f, "heads-groups", _with(ssu, g=3),
    Raises(ValueError, r"nheads must be divisible by ngroups: nheads=2, ngroups=3"))
row(f, "heads-stride0-heads", _with(ssu, state=lambda t: expanded(t, 1)),
    Raises(ValueError, r"state is written in place and must not overlap itself .*strides \(\d+, 0, "))
row(f, "batch-0-indices",
    _with(ssu, b=0, state=_const(_r(3, 2, D, N)), state_batch_indices=torch.zeros(0, dtype=I32)),
    OK_EMPTY((0, 2, D)))


# --- running a row -----------------------------------------------------------------------------


def _tensors(value) -> list:
    """The tensors in a result, in order (None kept, to compare positions)."""
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return [value] if value is None or isinstance(value, Tensor) else []


def _contiguous_copy(value):
    if isinstance(value, Tensor):
        return value.detach().clone(memory_format=torch.contiguous_format).requires_grad_(value.requires_grad)
    if isinstance(value, tuple):
        return tuple(_contiguous_copy(v) for v in value)
    if isinstance(value, dict):
        return {k: _contiguous_copy(v) for k, v in value.items()}
    return value


def _snapshot(kwargs: dict) -> Dict[str, list]:
    return {
        k: [t.detach().clone() if isinstance(t, Tensor) else t for t in _tensors(v)]
        for k, v in kwargs.items()
        if _tensors(v)
    }


def _assert_same(got, want, what: str) -> None:
    got, want = _tensors(got), _tensors(want)
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g is None) == (w is None), f"{what}[{i}]"
        if g is not None:
            torch.testing.assert_close(g.detach(), w.detach(), equal_nan=True, rtol=1e-5, atol=1e-5,
                                       msg=f"{what}[{i}]")


@pytest.fixture(autouse=True)
def _seeded(monkeypatch):
    torch.manual_seed(0)
    # the PyTorch path on purpose and silently: no warning about the missing extension
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "reference")


@pytest.mark.parametrize("fn,build,expect", ROWS)
def test_probe(fn, build, expect):
    kwargs = build()
    if isinstance(expect, Raises):
        before = _snapshot(kwargs)
        with pytest.raises(Exception) as info:
            fn(**kwargs)
        assert type(info.value) is expect.cls, f"{type(info.value).__name__}: {info.value}"
        assert re.search(expect.regex, str(info.value)), str(info.value)
        after = _snapshot(kwargs)
        for name in before:  # a refused call writes nothing
            _assert_same(after[name], before[name], f"argument {name} after the refused call")
        return
    plain = _contiguous_copy(kwargs)
    got = fn(**kwargs)
    want = fn(**plain)
    _assert_same(got, want, "result")
    for name in kwargs:  # what the call wrote in place, too
        _assert_same(kwargs[name], plain[name], f"argument {name}")
    if expect.shapes is not None:
        shapes = tuple(None if t is None else tuple(t.shape) for t in _tensors(got))
        assert shapes == expect.shapes
    if expect.finite_before is not None:
        out = _tensors(got)[0]
        assert torch.isfinite(out[..., : expect.finite_before]).all()
        assert torch.isnan(out[..., expect.finite_before :]).any()


# --- the empty-size rule, with gradients ------------------------------------------------------

EMPTY_SIZES = [(0, D, L), (B, 0, L), (B, D, 0)]


@pytest.mark.parametrize("b,d,l", EMPTY_SIZES, ids=["batch-0", "dim-0", "seqlen-0"])
def test_empty_conv_gradients(b, d, l):
    """Empty results and the gradients of a sum over nothing: zeros for weight and bias; the
    initial states' gradient is the final states' (over zero steps final == initial)."""
    x, weight, bias = _r(b, d, l).requires_grad_(), _r(d, W).requires_grad_(), _r(d).requires_grad_()
    init = _r(b, d, W - 1).requires_grad_()
    out, final = causal_conv1d_fn(x, weight, bias, initial_states=init, return_final_states=True,
                                  activation="silu")
    (out.sum() + (final * final).sum()).backward()
    assert x.grad.shape == x.shape and torch.equal(weight.grad, torch.zeros_like(weight))
    assert torch.equal(bias.grad, torch.zeros_like(bias))
    if l == 0:
        torch.testing.assert_close(final, init)
        torch.testing.assert_close(init.grad, 2 * init.detach())
    assert init.grad.shape == init.shape


@pytest.mark.parametrize("b,d,l", EMPTY_SIZES, ids=["batch-0", "dim-0", "seqlen-0"])
def test_empty_scan_gradients(b, d, l):
    kw = scan(b, d, l)
    leaves = {k: v.requires_grad_() for k, v in kw.items() if isinstance(v, Tensor)}
    out, last = selective_scan_fn(**kw)
    assert out.shape == (b, d, l) and last.shape == (b, d, N)
    assert torch.equal(last, torch.zeros_like(last))  # the state after no step is h0 = 0
    out.sum().backward()
    for name, t in leaves.items():
        assert t.grad is not None and t.grad.shape == t.shape, name
        assert torch.equal(t.grad, torch.zeros_like(t)), name


@pytest.mark.parametrize("b,l", [(0, L), (B, 0)], ids=["batch-0", "seqlen-0"])
def test_empty_mamba_inner_gradients(b, l):
    kw = inner(b=b, l=l)
    leaves = {k: v.requires_grad_() for k, v in kw.items() if isinstance(v, Tensor)}
    out = mamba_inner_fn(**kw)
    assert out.shape == (b, l, 3)
    out.sum().backward()
    for name, t in leaves.items():
        assert t.grad is not None and t.grad.shape == t.shape, name
        assert torch.equal(t.grad, torch.zeros_like(t)), name


def test_conv_update_seqlen_0_leaves_the_state():
    state = _r(B, D, W - 1)
    before = state.clone()
    out = causal_conv1d_update(_r(B, D, 0), state, _r(D, W))
    assert out.shape == (B, D, 0) and torch.equal(state, before)


def test_expanded_state_never_loses_an_update():
    # the probe's finding: distinct indices into rows that share memory lost an update silently
    kw = ssu(state=torch.zeros(1, 2, D, N).expand(B, 2, D, N), state_batch_indices=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="state is written in place"):
        selective_state_update(**kw)


def test_table_covers_every_public_function():
    import causal_conv1d.causal_conv1d_varlen as varlen_module
    import selective_scan as scan_package

    probed = {p.values[0] for p in ROWS}
    public = {getattr(scan_package, name) for name in scan_package.__all__ if name != "__version__"}
    public |= {causal_conv1d_fn, causal_conv1d_update, causal_conv1d_ref, causal_conv1d_update_ref,
               varlen_module.causal_conv1d_varlen_states, varlen_module.causal_conv1d_varlen_states_ref,
               compat_conv_fwd, compat_conv_bwd, compat_conv_update, compat_scan_fwd, compat_scan_bwd,
               conv_fwd_function, conv_bwd_function, conv_update_function}
    assert public <= probed, public - probed
