"""The argument-check vocabulary of both kernel packages (causal_conv1d/_checks.py and
selective_scan/_checks.py): describing a value, building the error, and requiring a tensor, a
bool, a shape, a dtype, a device and writability.

Every error reads ``[fn: ]arg rule, got seen``: the function (when the package names it), the
argument, the rule it breaks and the value seen. The two packages word the value seen
differently (causal_conv1d describes the whole value, selective_scan the attribute that broke
the rule), so each primitive takes ``seen``, a function of the value, and the wording of its
rule where the packages differ; the messages are built only when a rule fails.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

# torch at the top, like runtime/library.py: only the kernel packages import this module, and
# they import torch anyway; the command line and setup.py never import it.
import torch

Seen = Callable[[object], str]


# --- describing the value seen --------------------------------------------------------------


def describe(value: object) -> str:
    """The whole value: ``a torch.float32 tensor of shape (2, 3) on cpu``, else its repr."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    return repr(value)


def type_name(value: object) -> str:
    """The value's type: ``list``."""
    return type(value).__name__


def typed_repr(value: object) -> str:
    """The value's type and repr: ``str 'no'``."""
    return f"{type(value).__name__} {value!r}"


def shape_of(t: object) -> str:
    """A tensor's shape: ``(2, 4, 6)``."""
    return str(tuple(t.shape))  # type: ignore[attr-defined]


def dtype_of(t: object) -> str:
    """A tensor's dtype: ``torch.float16``."""
    return str(t.dtype)  # type: ignore[attr-defined]


# --- the error -------------------------------------------------------------------------------


def error(cls: type, arg: str, rule: str, seen: str, fn: Optional[str] = None) -> Exception:
    """``cls("[fn: ]arg rule, got seen")``, to raise."""
    prefix = f"{fn}: " if fn else ""
    return cls(f"{prefix}{arg} {rule}, got {seen}")


def shape_error(
    arg: str, t: object, shape: Sequence[int], what: str, fn: Optional[str] = None,
    seen: Seen = describe, form: str = "must have shape {what} = {shape}",
) -> Exception:
    """ValueError: t has not ``shape``; ``form`` words the rule from ``what`` and ``shape``."""
    return error(ValueError, arg, form.format(what=what, shape=tuple(shape)), seen(t), fn)


def dtype_error(
    arg: str, t: object, dtype: torch.dtype, whose: str, fn: Optional[str] = None, seen: Seen = describe
) -> Exception:
    """TypeError: t has not ``whose`` dtype (``x's``, ``u's``, ``weight's``)."""
    return error(TypeError, arg, f"must have {whose} dtype {dtype}", seen(t), fn)


def device_error(arg: str, t: object, device: torch.device, whose: str,
                 fn: Optional[str] = None) -> Exception:
    """ValueError: t is not on ``whose`` device (the whole value described)."""
    return error(ValueError, arg, f"must be on {whose} device {device}", describe(t), fn)


# --- requirements: each returns quietly or raises the error ----------------------------------

TENSOR = "must be a torch.Tensor"


def require_tensor(
    arg: str, value: object, optional: bool = False, *, fn: Optional[str] = None, seen: Seen = describe
) -> Optional[torch.Tensor]:
    """TypeError unless value is a tensor (or None, when optional); returns it."""
    if value is None and optional:
        return None
    if not isinstance(value, torch.Tensor):
        raise error(TypeError, arg, TENSOR, seen(value), fn)
    return value


def require_bool(
    arg: str, value: object, *, fn: Optional[str] = None, numpy: bool = False,
    rule: str = "must be a bool", seen: Seen = repr,
) -> bool:
    """TypeError unless value is a bool (numpy's bool too, when ``numpy``): a string such as
    "no" would otherwise be true. Returns it as a Python bool."""
    if value is True or value is False:
        return value
    if isinstance(value, bool):
        return bool(value)
    if numpy and type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    raise error(TypeError, arg, rule, seen(value), fn)


def require_shape(
    arg: str, t: torch.Tensor, shape: Sequence[int], what: str, *, fn: Optional[str] = None,
    seen: Seen = describe, form: str = "must have shape {what} = {shape}",
) -> None:
    """ValueError unless t's shape is ``shape`` (``what`` names its sizes; see shape_error)."""
    if t.shape != tuple(shape):
        raise shape_error(arg, t, shape, what, fn, seen, form)


def require_dtype(
    arg: str, t: torch.Tensor, dtype: torch.dtype, whose: str, *, fn: Optional[str] = None,
    seen: Seen = describe,
) -> None:
    """TypeError unless t has ``whose`` dtype ``dtype``."""
    if t.dtype != dtype:
        raise dtype_error(arg, t, dtype, whose, fn, seen)


def require_dtype_in(
    arg: str, t: torch.Tensor, dtypes: Tuple[torch.dtype, ...], rule: str, *, fn: Optional[str] = None,
    seen: Seen = describe,
) -> None:
    """TypeError unless t's dtype is one of ``dtypes`` (``rule`` words them)."""
    if t.dtype not in dtypes:
        raise error(TypeError, arg, rule, seen(t), fn)


def require_device(arg: str, t: torch.Tensor, device: torch.device, whose: str, *,
                   fn: Optional[str] = None) -> None:
    """ValueError unless t is on ``device``, ``whose`` device (``x's``); see require_one_device."""
    if t.device != device:
        raise device_error(arg, t, device, whose, fn)


def require_one_device(named: Dict[str, object]) -> None:
    """ValueError unless the tensors among ``named`` (name -> value) are all on one device."""
    present = {k: v for k, v in named.items() if isinstance(v, torch.Tensor)}
    first_name, first = next(iter(present.items()))
    for k, v in present.items():
        if v.device != first.device:
            raise ValueError(
                f"all tensors must be on one device: {first_name} is on {first.device} "
                f"but {k} is on {v.device}"
            )


def overlaps_itself(t: torch.Tensor) -> bool:
    """Some two elements of t may share memory (an expanded or otherwise self-overlapping view).

    Conservative: axes sorted by stride, each stride must reach past the span of the smaller
    ones; a layout that interleaves two axes without a shared element is reported too. An
    empty tensor has no elements to share."""
    if t.is_contiguous():  # the usual case, answered without sorting strides
        return False
    if t.numel() == 0:
        return False
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1)
    span = 1
    for stride, size in dims:
        if stride < span:
            return True
        span = stride * size
    return False


def with_strides(t: object) -> str:
    """A tensor's shape and strides: ``shape (2, 3) with strides (0, 1)``."""
    return f"shape {tuple(t.shape)} with strides {t.stride()}"  # type: ignore[attr-defined]


WRITTEN_OVERLAP = (
    "is written in place and must not overlap itself (no two elements may share memory, e.g. expand)"
)


def require_writable(
    arg: str, t: torch.Tensor, *, fn: Optional[str] = None, seen: Seen = describe
) -> None:
    """ValueError unless t, written in place, neither overlaps itself nor is a leaf that
    requires grad. The one check of every in-place target (a buffer, a decode state): a
    state whose rows share memory would lose all but one row's update on the PyTorch path,
    race on CUDA, and otherwise fail inside torch with a message that names no argument."""
    if overlaps_itself(t):
        raise error(ValueError, arg, WRITTEN_OVERLAP, f"{seen(t)} with strides {t.stride()}", fn)
    if t.requires_grad and t.is_leaf:
        rule = "is written in place and must not be a leaf that requires grad"
        raise error(ValueError, arg, rule, seen(t), fn)


# --- sizes -------------------------------------------------------------------------------------
#
# Empty data is fine: batch 0, dim 0 and seqlen 0 (total_tokens 0 for packed sequences) are
# accepted by every op, which returns results of the shapes those sizes give, and gradients
# likewise (a gradient that sums over nothing is zeros; a state carried over zero steps is the
# state it started from). The structural sizes of a model are not data and must be >= 1:
# dstate, ngroups, the conv's width and a state's length. docs/KERNELS.md, "Argument rules".


def is_empty(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether some given tensor has no elements: an empty problem, which never goes to a
    compiled kernel (an empty launch grid is an error on CUDA) but to the PyTorch path."""
    for t in tensors:
        if t is not None and t.numel() == 0:
            return True
    return False


DSTATE_MIN = 1


def require_dstate(
    arg: str, dstate: int, upper: Optional[int] = None, *, fn: Optional[str] = None
) -> None:
    """ValueError unless ``DSTATE_MIN <= dstate`` (and ``<= upper`` when given): a scan with no
    state has no recurrence (its output is D * u alone), which is a mistaken axis rather than a
    model, and the kernels' loops over the state assume one element at least."""
    if dstate < DSTATE_MIN or (upper is not None and dstate > upper):
        rule = f"must be >= {DSTATE_MIN}" if upper is None else f"must be between {DSTATE_MIN} and {upper}"
        raise error(ValueError, arg, rule, str(dstate), fn)
