"""The per-call validation of the scan (_checks._quick_groups) accepts exactly what the full
check accepts, with the same ngroups, on random arguments around valid ones; whatever it does
not accept goes to the full check, whose messages are the errors users see."""

from __future__ import annotations

import random

import pytest
import torch

from selective_scan import _checks

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.complex64]
A_DTYPES = [torch.float32, torch.complex64, torch.float64, torch.complex128, torch.float16]


def _tensor(rng, shape, dtype, device="cpu"):
    return torch.empty(shape, dtype=dtype, device=device)


def random_args(rng: random.Random):
    batch, dim, L, n = rng.choice([1, 2]), rng.choice([0, 4, 6]), rng.choice([0, 1, 5]), rng.choice([1, 3])
    groups = rng.choice([1, 2, 3])
    dt = rng.choice(DTYPES[:4]) if rng.random() < 0.8 else rng.choice(DTYPES)
    adt = rng.choice(A_DTYPES[:2]) if rng.random() < 0.7 else rng.choice(A_DTYPES)
    steps = 2 * L if adt.is_complex else L

    def maybe(shape, dtype):
        """A tensor of ``shape`` and ``dtype``, now and then off in one respect."""
        r = rng.random()
        if r < 0.04:
            shape = tuple(s + 1 if i == rng.randrange(len(shape)) else s for i, s in enumerate(shape))
        elif r < 0.08:
            dtype = rng.choice(DTYPES + A_DTYPES)
        elif r < 0.10:
            return _tensor(rng, shape, dtype, "meta")
        elif r < 0.11:
            return "not a tensor"
        elif r < 0.13:
            shape = shape[:-1]
        return _tensor(rng, shape, dtype)

    def bc():
        kind = rng.choice(["fixed", "3d", "4d", "4d"])
        if kind == "fixed":
            return maybe((dim, n), adt)
        if kind == "3d":
            return maybe((batch, n, steps), dt)
        return maybe((batch, groups, n, steps), dt)

    u = maybe((batch, dim, L), dt)
    pdt = rng.choice([torch.float32, torch.float64]) if rng.random() < 0.3 else torch.float32
    D = maybe((dim,), pdt) if rng.random() < 0.7 else None
    bias = maybe((dim,), pdt) if rng.random() < 0.7 else None
    z = maybe((batch, dim, L), dt) if rng.random() < 0.6 else None
    return (u, maybe((batch, dim, L), dt), maybe((dim, n), adt), bc(), bc(), D, z, bias), rng.random() < 0.2


@pytest.mark.parametrize("seed", range(4))
def test_quick_accepts_what_the_full_check_accepts(seed):
    rng = random.Random(seed)
    accepted = rejected = 0
    for _ in range(3000):
        args, reference = random_args(rng)
        quick = _checks._quick_groups(*args, reference)
        try:
            full = _checks.check_selective_scan_full(*args, reference=reference)
        except (TypeError, ValueError):
            full = None
        if full is None:
            assert quick == 0, args
            rejected += 1
        else:
            assert quick == full, args  # every valid call takes the quick path
            accepted += 1
    assert accepted > 300 and rejected > 300


def test_errors_come_from_the_full_check():
    u = torch.empty(2, 4, 5)
    with pytest.raises(ValueError, match=r"delta must have shape \(2, 4, 5\)"):
        _checks.check_selective_scan(u, torch.empty(2, 4, 6), torch.empty(4, 3), torch.empty(4, 3),
                                     torch.empty(4, 3), None, None, None)
