"""Argument validation for ``selective_scan.layer_norm``: every rule is checked before anything
runs, and each error reads ``arg rule, got seen`` (mamba_kernels/runtime/argchecks.py).

A wrong type or dtype is a TypeError; a wrong shape, range or combination a ValueError.
"""

from __future__ import annotations

import math
import numbers
from typing import Dict, Optional, Tuple

import torch

from mamba_kernels.runtime import argchecks
from mamba_kernels.runtime.argchecks import describe, error, require_one_device

Tensor = torch.Tensor

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_FLOAT_RULE = "must be a floating tensor (float16, bfloat16, float32 or float64)"


def tensor(name: str, t: object, optional: bool = False) -> None:
    """TypeError unless t is a floating tensor (or None, when optional)."""
    argchecks.require_tensor(name, t, optional)
    if t is not None:
        argchecks.require_dtype_in(name, t, FLOAT_DTYPES, _FLOAT_RULE)  # type: ignore[arg-type]


def flag(name: str, value: object) -> bool:
    """A flag must be a bool (numpy's too): a string such as "no" would otherwise be true."""
    return argchecks.require_bool(name, value, numpy=True, rule="must be a bool (True or False)")


def dtype_or_none(name: str, value: object) -> None:
    if value is not None and value not in FLOAT_DTYPES:
        raise error(TypeError, name, "must be None or a floating torch.dtype", repr(value))


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(TypeError, name, "must be a real number", argchecks.typed_repr(value))
    return float(value)


def eps(value: object) -> None:
    v = _real("eps", value)
    if not (math.isfinite(v) and v >= 0.0):
        raise error(ValueError, "eps", "must be finite and >= 0", repr(value))


def dropout_p(value: object) -> float:
    v = _real("dropout_p", value)
    if not 0.0 <= v <= 1.0:
        raise error(ValueError, "dropout_p", "must be between 0 and 1", repr(value))
    return v


def shape(name: str, t: Optional[Tensor], want: Tuple[int, ...], what: str) -> None:
    """ValueError unless t (when given) has shape ``want``; ``what`` says where it comes from."""
    if t is not None:
        argchecks.require_shape(name, t, want, what, form="must have shape {shape} ({what})")


def second_branch(weight1: object, bias1: object) -> None:
    if bias1 is not None and weight1 is None:
        rule = "must be None when weight1 is None (weight1 makes the second output)"
        raise error(ValueError, "bias1", rule, describe(bias1))


def norm_inputs(
    x: object, weight: object, bias: object, eps_: object, residual: object = None, x1: object = None,
    weight1: object = None, bias1: object = None, dropout_p_: object = 0.0, rowscale: object = None,
    *, two_d: bool = False, extra: Optional[Dict[str, object]] = None,
) -> None:
    """The forward's inputs: x (..., N) (exactly (M, N) when ``two_d``), weight, bias, weight1
    and bias1 (N,), residual and x1 shaped like x, rowscale x.shape[:-1], one device for all
    (and for the tensors in ``extra``, name -> value, checked by the caller)."""
    tensor("x", x)
    assert isinstance(x, Tensor)
    if two_d and x.dim() != 2:
        raise error(ValueError, "x", "must be 2-D (M, N): rows to normalize over their last dim", describe(x))
    if x.dim() < 1:
        raise error(ValueError, "x", "must have at least one dim (the one normalized over)", describe(x))
    n = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias), ("weight1", weight1), ("bias1", bias1)):
        tensor(name, t, optional=name != "weight")
        shape(name, t, (n,), "N = x.shape[-1]")  # type: ignore[arg-type]
    for name, t in (("residual", residual), ("x1", x1)):
        tensor(name, t, optional=True)
        shape(name, t, tuple(x.shape), "x's shape")  # type: ignore[arg-type]
    tensor("rowscale", rowscale, optional=True)
    shape("rowscale", rowscale, tuple(x.shape[:-1]), "x.shape[:-1], one scale per row")  # type: ignore[arg-type]
    second_branch(weight1, bias1)
    if rowscale is not None and x1 is not None:
        rule = "must be None when x1 is given (no row scale with the parallel branch)"
        raise error(ValueError, "rowscale", rule, describe(rowscale))
    eps(eps_)
    dropout_p(dropout_p_)
    named = {"x": x, "weight": weight, "bias": bias, "residual": residual, "x1": x1, "weight1": weight1,
             "bias1": bias1, "rowscale": rowscale}
    require_one_device({**named, **(extra or {})})


def seeds(value: object, rows: int, has_x1: bool, p: float) -> None:
    """The dropout seeds of a forward: an int64 tensor of M rows' seeds (2M with x1) when
    dropout_p > 0; ignored otherwise."""
    if p == 0.0:
        return
    want = 2 * rows if has_x1 else rows
    if value is None:
        raise error(ValueError, "seeds", "must be given when dropout_p > 0 (the forward's seeds)", "None")
    argchecks.require_tensor("seeds", value)
    argchecks.require_dtype("seeds", value, torch.int64, "the forward's")  # type: ignore[arg-type]
    shape("seeds", value, (want,), "one per row, 2M with x1")  # type: ignore[arg-type]


def dropout_mask(name: str, mask: object, like: Tensor) -> None:
    """A given dropout mask: a bool tensor of the input's shape (True keeps)."""
    argchecks.require_tensor(name, mask, optional=True)
    if mask is not None:
        argchecks.require_dtype(name, mask, torch.bool, "the bool")  # type: ignore[arg-type]
        shape(name, mask, tuple(like.shape), "x's shape")  # type: ignore[arg-type]


def backward_inputs(
    dy: object, x: object, weight: object, bias: object, eps_: object, mean: object, rstd: object,
    dresidual: object, dy1: object, weight1: object, bias1: object, seeds_: object, dropout_p_: object,
    rowscale: object, has_x1: bool, is_rms_norm: bool, recompute_output: bool,
) -> None:
    """The backward's inputs: x (the forward's residual_out) (M, N); dy, dresidual and dy1 like
    x; the parameters (N,); mean (unless is_rms_norm) and rstd (M,); the forward's seeds."""
    tensor("x", x)
    assert isinstance(x, Tensor)
    if x.dim() != 2:
        raise error(ValueError, "x", "must be 2-D (M, N): the forward's residual_out", describe(x))
    m, n = x.shape
    for name, t in (("dy", dy), ("dresidual", dresidual), ("dy1", dy1)):
        tensor(name, t, optional=name != "dy")
        shape(name, t, (m, n), "(M, N), x's shape")  # type: ignore[arg-type]
    for name, t in (("weight", weight), ("bias", bias), ("weight1", weight1), ("bias1", bias1)):
        tensor(name, t, optional=name != "weight")
        shape(name, t, (n,), "N = x.shape[-1]")  # type: ignore[arg-type]
    for name, t in (("rstd", rstd), ("mean", mean)):
        tensor(name, t, optional=name == "mean" and is_rms_norm)
        if name == "rstd" or not is_rms_norm:
            shape(name, t, (m,), "(M,), one per row")  # type: ignore[arg-type]
    tensor("rowscale", rowscale, optional=True)
    shape("rowscale", rowscale, (m,), "(M,), one scale per row")  # type: ignore[arg-type]
    if dy1 is not None and weight1 is None:
        raise error(ValueError, "dy1", "must be None when weight1 is None", describe(dy1))
    second_branch(weight1, bias1)
    if recompute_output and weight1 is not None:
        raise error(ValueError, "recompute_output", "must be False when weight1 is given (the parallel norm)",
                    "True")
    eps(eps_)
    seeds(seeds_, m, has_x1, dropout_p(dropout_p_))
    require_one_device({"dy": dy, "x": x, "weight": weight, "bias": bias, "mean": mean, "rstd": rstd,
                        "dresidual": dresidual, "dy1": dy1, "weight1": weight1, "bias1": bias1,
                        "seeds": seeds_, "rowscale": rowscale})
