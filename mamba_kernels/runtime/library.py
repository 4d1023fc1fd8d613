"""torch.library glue shared by the compiled kernels' Python modules."""

from __future__ import annotations

from typing import Callable

import torch

NAMESPACE = "mamba_kernels"  # the ops' namespace (the library fragments of csrc/<kernel>/<binding>/*.cpp)


def register_fake(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering the fake (meta) implementation of ``mamba_kernels::<name>``, which
    torch.compile traces instead of the CUDA kernel (``impl_abstract`` before torch 2.4)."""
    qualname = f"{NAMESPACE}::{name}"
    if hasattr(torch.library, "register_fake"):
        return torch.library.register_fake(qualname)
    return torch.library.impl_abstract(qualname)


def _compiling_probe() -> Callable[[], bool]:
    try:
        return torch.compiler.is_compiling  # torch >= 2.3
    except AttributeError:
        try:
            from torch._dynamo import is_compiling  # optional: torch before 2.3 has only this one
        except ImportError:  # a torch without dynamo: nothing compiles us
            return lambda: False
        return is_compiling


# Whether torch.compile is tracing the caller (bound once: read on every call of the kernels).
is_compiling = _compiling_probe()


def eager_entry(packet: Callable) -> Callable:
    """The C++ entry of an op's one overload (``OpOverload._op``): what calling the op's
    packet reaches after two Python frames and an overload lookup, about 1 us a call on the VM
    (2-3 on a GPU host) for the same dispatch. For eager calls only: torch.compile traces the
    packet, which callers reach through ``pick``."""
    overload = packet.default
    return getattr(overload, "_op", overload)


def pick(packet: Callable, entry: Callable) -> Callable:
    """What to call for an op now: its packet while torch.compile traces the caller (dynamo
    refuses the C++ entry, a builtin it does not know), else the eager entry."""
    return packet if is_compiling() else entry
