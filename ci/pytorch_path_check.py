"""The PyTorch implementations on CPU under the running torch: every public function, forward and
backward, on tiny inputs in float32, float16 and bfloat16, against float64 references.

    python -m ci.pytorch_path_check        (exit 1 and one line per problem when any)

A wheel's smoke test runs this on the cell's own torch (python -m ci.build_cell check-installed; the
runners have no GPU), so a torch release whose CPU operators our Python paths trip over (torch
2.1's CPU addcmul, say, cannot write a float result into a half out=) fails the release instead
of a user. It imports whatever causal_conv1d / selective_scan are first on the path.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, List

import torch
import torch.nn.functional as F

from mamba_kernels.runtime import knobs

F64 = torch.float64
# max |got - want| / max |want| allowed, per input dtype (fp16 keeps 11 bits, bf16 8)
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}


def _leaves(tensors, dtype):
    return [t.to(dtype).requires_grad_() if t.is_floating_point() else t for t in tensors]


def _compare(name: str, dtype, fn: Callable, ref: Callable, inputs) -> List[str]:
    """Forward and gradients of ``fn`` on ``inputs`` cast to dtype, against ``ref`` in float64."""
    got_in, want_in = _leaves(inputs, dtype), _leaves(inputs, F64)
    try:
        got = fn(*got_in)
        got.float().pow(2).sum().backward()
    except Exception as e:  # the point: report it, check the rest
        return [f"{name} ({dtype}): {type(e).__name__}: {e}"]
    want = ref(*want_in)
    want.pow(2).sum().backward()
    found = []
    pairs = [("out", got, want)]
    pairs += [(f"the gradient of input {i}", a.grad, b.grad) for i, (a, b) in enumerate(zip(got_in, want_in))
              if b.grad is not None]
    for what, a, b in pairs:
        err = _rel_err(a, b)
        if not err <= TOLERANCE[dtype]:
            found.append(f"{name} ({dtype}): {what} differs from the float64 reference by {err:.2e}")
    return found


def _rel_err(got, want) -> float:
    if got is None:
        return float("inf")
    return ((got.to(F64) - want).abs().max() / want.abs().max().clamp_min(1e-12)).item()


def problems() -> List[str]:
    """One line per problem; empty when every check passes."""
    old = os.environ.get(knobs.BACKEND_VAR)
    os.environ[knobs.BACKEND_VAR] = "reference"  # the PyTorch path even where a GPU is seen
    try:
        return _checks()
    finally:
        if old is None:
            del os.environ[knobs.BACKEND_VAR]
        else:
            os.environ[knobs.BACKEND_VAR] = old


def _checks() -> List[str]:
    # the kernel packages first on the path (the installed wheel's in a smoke test), imported once
    # problems() has set the backend knob
    from causal_conv1d import causal_conv1d_fn, causal_conv1d_update
    from causal_conv1d.causal_conv1d_interface import causal_conv1d_ref
    from selective_scan import selective_scan_fn, selective_scan_ref, selective_state_update

    g = torch.Generator().manual_seed(0)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=F64) * scale

    batch, dim, L, n, width = 2, 6, 37, 4, 4
    found: List[str] = []
    for dtype in TOLERANCE:
        x, w, b = rnd(batch, dim, L), rnd(dim, width, scale=0.5), rnd(dim, scale=0.5)
        found += _compare("causal_conv1d_fn", dtype,
                          lambda x, w, b: causal_conv1d_fn(x, w, b, activation="silu"),
                          lambda x, w, b: causal_conv1d_ref(x, w, b, activation="silu"), [x, w, b])
        A = -torch.rand(dim, n, generator=g, dtype=F64) - 0.1
        scan = [rnd(batch, dim, L), 0.5 * torch.rand(batch, dim, L, generator=g, dtype=F64), A,
                rnd(batch, n, L), rnd(batch, n, L), rnd(dim), rnd(batch, dim, L), 0.3 * rnd(dim)]

        def ours(u, delta, A, B, C, D, z, bias):  # A, D, bias stay float32, as the API wants
            D, bias = D.float(), bias.float()
            return selective_scan_fn(u, delta, A.float(), B, C, D, z, bias, delta_softplus=True)

        def ref(*args):
            return selective_scan_ref(*args, delta_softplus=True)

        found += _compare("selective_scan_fn", dtype, ours, ref, scan)
        # one decode step of each, forward only (no backward in the API)
        state = rnd(batch, dim, width - 1)
        step = rnd(batch, dim)
        try:
            out = causal_conv1d_update(step.to(dtype), state.to(dtype), w.to(dtype), b.to(dtype), "silu")
            window = torch.cat([state, step.unsqueeze(-1)], -1)
            want = F.silu((window * w).sum(-1) + b)
            err = _rel_err(out, want)
            if not err <= TOLERANCE[dtype]:
                found.append(f"causal_conv1d_update ({dtype}): out differs from the float64 reference by "
                             f"{err:.2e}")
        except Exception as e:
            found.append(f"causal_conv1d_update ({dtype}): {type(e).__name__}: {e}")
        h, xs, dt = rnd(batch, dim, n), rnd(batch, dim), torch.rand(batch, dim, generator=g, dtype=F64)
        Bs, Cs, D = rnd(batch, n), rnd(batch, n), rnd(dim)
        try:
            h_ours = h.float()
            low = [t.to(dtype) for t in (xs, dt, Bs, Cs)]
            out = selective_state_update(h_ours, low[0], low[1], A.float(), low[2], low[3], D.float(),
                                         dt_softplus=True)
            sp = F.softplus(dt)
            h_want = h * torch.exp(sp[..., None] * A) + (sp * xs)[..., None] * Bs[:, None]
            want = (h_want * Cs[:, None]).sum(-1) + D * xs
            err = max(_rel_err(out, want), _rel_err(h_ours, h_want))
            if not err <= TOLERANCE[dtype]:
                found.append(f"selective_state_update ({dtype}): out or state differs from the float64 "
                             f"reference by {err:.2e}")
        except Exception as e:
            found.append(f"selective_state_update ({dtype}): {type(e).__name__}: {e}")
    return found


def main() -> int:
    found = problems()
    verdict = "OK" if not found else f"{len(found)} problem(s)"
    print(f"PyTorch paths on CPU under torch {torch.__version__}: {verdict}")
    for p in found:
        print(f"  {p}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
