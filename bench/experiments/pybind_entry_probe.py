"""A measurement probe, not a product path: ``selective_scan_cuda.fwd``'s contract served by a
pybind11 function (JIT-built here with torch.utils.cpp_extension.load_inline) that calls our
registered forward op through the C++ dispatcher, with no Python of ours and no ``torch.ops``
entry in between.

What it answers (bench/experiments/lm_host_sides.py, side "ours, pybind11 entry"): how much of our call's
host cost in a model is the Python entry into a torch.library op (``torch.ops``' argument
parsing and boxing), which the original's pybind11 function does not pay. The probe links the
running torch's C++ ABI, so it can only ever be a per-torch-minor build: the stable-ABI wheel
cannot ship it. It covers the compatibility module's common case only (CUDA, real A, the
"recompute" states layout, B and C of 3 or 4 dimensions) and checks nothing beyond what the op
checks.

    python3 bench/experiments/pybind_entry_probe.py   # builds it (about a minute) and runs one call
"""

from __future__ import annotations

import torch

_SOURCE = r"""
#include <torch/extension.h>

namespace {

using Out3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using FwdSig = Out3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                    const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                    const std::optional<at::Tensor>&, bool, bool, int64_t, int64_t, bool);

constexpr int64_t kSpacedSteps = SPACED_STEPS;  // filled in from selective_scan/scan_fn.py

std::vector<at::Tensor> fwd(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                            const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                            const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& delta_bias,
                            bool delta_softplus) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mamba_kernels::selective_scan_fwd", "")
                             .typed<FwdSig>();
  const at::Tensor B4 = B.dim() == 3 ? B.unsqueeze(1) : B;
  const at::Tensor C4 = C.dim() == 3 ? C.unsqueeze(1) : C;
  const int64_t L = u.size(2);
  const int64_t count = 2 * ((L + 2 * kSpacedSteps - 1) / (2 * kSpacedSteps));
  auto [out, out_z, x] = op.call(u, delta, A, B4, C4, D, z, delta_bias, delta_softplus, true, kSpacedSteps,
                                 count, true);
  if (z.has_value()) return {out, x, out_z};
  return {out, x};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("fwd", &fwd); }
"""


def build(verbose: bool = False):
    """The probe module (its ``fwd``); our extension must be loaded first (it registers the op)."""
    from torch.utils.cpp_extension import load_inline

    from selective_scan import _ops  # noqa: F401  (registers mamba_kernels::selective_scan_fwd)
    from selective_scan.scan_fn import SPACED_STEPS  # the compatibility layout's state spacing

    source = _SOURCE.replace("= SPACED_STEPS;", f"= {SPACED_STEPS};")
    return load_inline("mamba_kernels_pybind_entry_probe", cpp_sources=source, verbose=verbose,
                       extra_cflags=["-O2"])


if __name__ == "__main__":
    mod = build(verbose=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    u, delta, z = (torch.randn(1, 16, 40, generator=g, **bf) for _ in range(3))
    A = -torch.rand(16, 16, generator=g, device="cuda")
    B, C = (torch.randn(1, 1, 16, 40, generator=g, **bf) for _ in range(2))
    D, bias = torch.rand(16, generator=g, device="cuda"), torch.rand(16, generator=g, device="cuda")
    import selective_scan_cuda

    want = selective_scan_cuda.fwd(u, delta, A, B, C, D, z, bias, True)
    got = mod.fwd(u, delta, A, B, C, D, z, bias, True)
    same = all(torch.equal(a, b) for a, b in zip(want, got))
    print(f"probe: {mod.__file__}; same outputs as selective_scan_cuda.fwd: {same}")
