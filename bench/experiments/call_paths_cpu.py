"""What each way of calling a compiled op from Python costs on the host, warm and in place, on
CPU (no GPU needed): stand-in ops with our forward op's schema and the host work of its body
(read every tensor's shape, dtype and device; allocate three outputs), JIT-built here with
torch.utils.cpp_extension (about a minute, cached after).

Call paths, each making the same stand-in call:
- pybind11 -> body: a pybind11 function running the body directly (the original's way);
- pybind11 -> dispatcher -> classic op / stable op: a pybind11 function calling the registered
  op through the C++ dispatcher (an unboxed classic kernel; a boxed stable-ABI kernel);
- classic op / stable op via torch.ops: the op's C++ entry from Python (``OpOverload._op``,
  what our Python calls), which parses the arguments into a stack and makes a boxed call;
- stable op of the original's 9 arguments via torch.ops: the same, with the four layout
  arguments fixed inside (does the argument count matter?);
- aten add via torch.ops: the same entry for a two-argument aten op.

"warm": a tight loop. "in place": one call after a layer's worth of other host work (assorted
small torch ops, then a 32 MB buffer written, which pushes the caches), timed alone, the paths
interleaved: what a call costs between a model's other work, where its code and data have
gone cold.

    .venv/bin/python bench/experiments/call_paths_cpu.py [--rounds 600]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

# The stand-ins' shared schema: our forward op's (csrc/selective_scan/scan_ops.h); and the
# original's nine arguments (selective_scan_cuda.fwd's), for a stable op of that shape.
_SCHEMA = (
    "fwd(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, Tensor? delta_bias, "
    "bool delta_softplus, bool keep_y, int state_steps=64, int state_count=-1, bool state_pairs=False) "
    "-> (Tensor, Tensor, Tensor)"
)
_SCHEMA9 = (
    "fwd9(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, Tensor? delta_bias, "
    "bool delta_softplus) -> (Tensor, Tensor, Tensor)"
)

_CLASSIC = r"""
#include <torch/extension.h>
#include <torch/library.h>

namespace {
using Ten = at::Tensor;
using OT = std::optional<Ten>;
using Out3 = std::tuple<Ten, Ten, Ten>;
using Sig = Out3(const Ten&, const Ten&, const Ten&, const Ten&, const Ten&, const OT&, const OT&, const OT&,
                 bool, bool, int64_t, int64_t, bool);

int64_t touch(const Ten& t) {
  return t.dim() + t.sizes()[0] + t.strides()[0] + int64_t(t.scalar_type()) + t.device().index() +
         (t.data_ptr() != nullptr);
}

Out3 body(const Ten& u, const Ten& delta, const Ten& A, const Ten& B, const Ten& C, const OT& D, const OT& z,
          const OT& bias, bool, bool, int64_t, int64_t, bool) {
  int64_t seen = touch(u) + touch(delta) + touch(A) + touch(B) + touch(C);
  if (D) seen += touch(*D);
  if (z) seen += touch(*z);
  if (bias) seen += touch(*bias);
  TORCH_CHECK(seen != -1, "unreachable");
  Ten x = at::empty({u.size(0), u.size(1), 2, 32}, u.options());
  return {at::empty_like(delta), at::empty_like(delta), x};
}

std::vector<Ten> as_list(Out3 r) { return {std::get<0>(r), std::get<2>(r), std::get<1>(r)}; }

std::vector<Ten> direct(const Ten& u, const Ten& delta, const Ten& A, const Ten& B, const Ten& C, const OT& D,
                        const OT& z, const OT& bias, bool sp) {
  return as_list(body(u, delta, A, B, C, D, z, bias, sp, true, 1024, 2, true));
}

template <int kWhich>
std::vector<Ten> via(const Ten& u, const Ten& delta, const Ten& A, const Ten& B, const Ten& C, const OT& D,
                     const OT& z, const OT& bias, bool sp) {
  static const char* name = kWhich == 0 ? "call_paths_classic::fwd" : "call_paths_stable::fwd";
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
  return as_list(op.call(u, delta, A, B, C, D, z, bias, sp, true, 1024, 2, true));
}
}  // namespace

TORCH_LIBRARY(call_paths_classic, m) { m.def(SCHEMA); }
TORCH_LIBRARY_IMPL(call_paths_classic, CPU, m) { m.impl("fwd", &body); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("direct", &direct);
  m.def("via_classic", &via<0>);
  m.def("via_stable", &via<1>);
}
"""

_STABLE = r"""
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <tuple>

namespace {
using T = torch::stable::Tensor;
using OT = std::optional<T>;

int64_t touch(const T& t) {
  return t.dim() + t.sizes()[0] + t.strides()[0] + int64_t(t.scalar_type()) + t.get_device_index() +
         (t.data_ptr() != nullptr);
}

// a new contiguous tensor of `like`'s device (ndim <= 4)
T empty(const T& like, std::initializer_list<int64_t> shape, int32_t dtype) {
  int64_t sizes[4], strides[4], n = int64_t(shape.size()), stride = 1;
  std::copy(shape.begin(), shape.end(), sizes);
  for (int64_t i = n - 1; i >= 0; --i) strides[i] = stride, stride *= sizes[i];
  int32_t device_type = 0;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(like.get(), &device_type));
  AtenTensorHandle handle = nullptr;
  TORCH_ERROR_CODE_CHECK(
      aoti_torch_empty_strided(n, sizes, strides, dtype, device_type, like.get_device_index(), &handle));
  return T(handle);
}

std::tuple<T, T, T> body(const T& u, const T& delta, const T& A, const T& B, const T& C, const OT& D,
                         const OT& z, const OT& bias, bool, bool, int64_t, int64_t, bool) {
  int64_t seen = touch(u) + touch(delta) + touch(A) + touch(B) + touch(C);
  if (D) seen += touch(*D);
  if (z) seen += touch(*z);
  if (bias) seen += touch(*bias);
  STD_TORCH_CHECK(seen != -1, "unreachable");
  int32_t dtype = 0;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(delta.get(), &dtype));
  const auto s = delta.sizes();
  return {empty(delta, {s[0], s[1], s[2]}, dtype), empty(delta, {s[0], s[1], s[2]}, dtype),
          empty(u, {u.sizes()[0], u.sizes()[1], 2, 32}, aoti_torch_dtype_float32())};
}

// the original's nine arguments, the states' layout fixed inside
std::tuple<T, T, T> body9(const T& u, const T& delta, const T& A, const T& B, const T& C, const OT& D,
                          const OT& z, const OT& bias, bool softplus) {
  return body(u, delta, A, B, C, D, z, bias, softplus, true, 1024, 2, true);
}
}  // namespace

STABLE_TORCH_LIBRARY(call_paths_stable, m) {
  m.def(SCHEMA);
  m.def(SCHEMA9);
}
STABLE_TORCH_LIBRARY_IMPL(call_paths_stable, CPU, m) {
  m.impl("fwd", TORCH_BOX(&body));
  m.impl("fwd9", TORCH_BOX(&body9));
}
"""


def build():
    """The classic module (its pybind11 functions); loading it and the stable library registers
    both stand-in ops."""
    from torch.utils.cpp_extension import load

    src = os.path.join(tempfile.gettempdir(), "mamba_kernels_call_paths")
    os.makedirs(src, exist_ok=True)
    paths = {}
    for name, text in (("call_paths_stable", _STABLE), ("call_paths_classic", _CLASSIC)):
        paths[name] = os.path.join(src, name + ".cpp")
        with open(paths[name], "w") as f:
            text = text.replace("m.def(SCHEMA9)", f"m.def({json.dumps(_SCHEMA9)})")
            f.write(text.replace("m.def(SCHEMA)", f"m.def({json.dumps(_SCHEMA)})"))
    # the stable library holds no ATen (TORCH_TARGET_VERSION forbids it); loaded for its registration
    load("call_paths_stable", [paths["call_paths_stable"]], is_python_module=False,
         extra_cflags=["-O2", "-DTORCH_TARGET_VERSION=0x020a000000000000"])
    return load("call_paths_classic", [paths["call_paths_classic"]], extra_cflags=["-O2"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=600, help="in-place rounds (each calls every path once)")
    a = ap.parse_args()
    mod = build()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    u, delta, z = (torch.randn(1, 16, 16) for _ in range(3))
    A = -torch.rand(16, 16)
    B, C = (torch.randn(1, 1, 16, 16) for _ in range(2))
    D, bias = torch.rand(16), torch.rand(16)
    classic_op = torch.ops.call_paths_classic.fwd.default._op
    stable_op = torch.ops.call_paths_stable.fwd.default._op
    stable9 = torch.ops.call_paths_stable.fwd9.default._op
    add = torch.ops.aten.add.Tensor._op
    args = (u, delta, A, B, C, D, z, bias, True)
    paths = {
        "pybind11 -> body": lambda: mod.direct(*args),
        "pybind11 -> dispatcher -> classic op": lambda: mod.via_classic(*args),
        "pybind11 -> dispatcher -> stable op": lambda: mod.via_stable(*args),
        "classic op via torch.ops": lambda: classic_op(*args, True, 1024, 2, True),
        "stable op via torch.ops": lambda: stable_op(*args, True, 1024, 2, True),
        "stable op of the original's 9 arguments via torch.ops": lambda: stable9(*args),
        "aten add via torch.ops": lambda: add(D, bias),
    }
    for name, path in list(paths.items())[:6]:  # out, out_z and x, in either order
        shapes = sorted(tuple(t.shape) for t in path())
        if shapes != sorted([tuple(delta.shape), (1, 16, 2, 32), tuple(delta.shape)]):
            raise SystemExit(f"{name}: returned tensors of shapes {shapes}")

    x, w1, w2 = torch.randn(4, 64, 96), torch.randn(192, 96), torch.randn(96, 192)
    norm = torch.nn.LayerNorm(96)
    buf = torch.empty(8 << 20)  # 32 MB

    def layer():  # a layer's worth of other host work
        h = F.silu(F.linear(x, w1))
        g, v = h.chunk(2, -1)
        h = norm(F.linear(torch.cat([g * torch.sigmoid(v)] * 2, -1), w2) + x)
        torch.softmax(h, -1).mean(0).transpose(0, 1).contiguous().view(-1).cumsum(0)
        buf.add_(1.0)

    clock = time.perf_counter
    in_place = {k: [] for k in paths}
    names = list(paths)
    for r in range(a.rounds):
        for k in names if r % 2 == 0 else names[::-1]:
            layer()
            t0 = clock()
            paths[k]()
            in_place[k].append((clock() - t0) * 1e6)

    def warm(fn, n=2000):
        for _ in range(100):
            fn()
        ts = []
        for _ in range(15):
            t0 = clock()
            for _ in range(n):
                fn()
            ts.append((clock() - t0) / n * 1e6)
        return statistics.median(ts)

    base = statistics.median(in_place[names[0]])
    print(f"torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()}, "
          f"CPU tensors, one thread; us a call, median ({a.rounds} in-place rounds)\n")
    print("| path | warm | in place | in place / pybind11 -> body |\n|---|---|---|---|")
    for k, fn in paths.items():
        med = statistics.median(in_place[k])
        print(f"| {k} | {warm(fn):.2f} | {med:.2f} | {med / base:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
