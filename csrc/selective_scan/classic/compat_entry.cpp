// selective_scan_cuda.fwd and .bwd (mamba_ssm's compiled-module contract, selective_scan/
// cuda_compat.py) as C functions of the classic build's module, for their common case. mamba_ssm's
// small layers wait on the host, and there the Python function plus a torch.ops call cost about
// twice the original's pybind11 function (docs/SCAN.md, "The ops"); this entry has neither: the
// caller's arguments go straight to the op's body. It reads a Python tensor (THPVariable)
// through the running torch's C++ ABI; the stable build's entry (stable/compat_entry.cpp) reads
// it through DLPack's C exchange API instead.
//
// The common case: positional arguments, plain tensors (no subclass, no dispatch mode active),
// CUDA u, real fp32 A, the environment variables at values under which the Python function would
// run the op with the "recompute" states layout; for the backward also the states 1024 steps
// apart that this forward returns. Anything else, and any call the op refuses, goes to the
// Python function, which keeps the whole contract and names the argument at fault. Python arms
// the entry once its own first-use checks (extension, GPUs) have passed and hands it the facts
// it decides from (compat_arm), so they stay written once, in Python.
#include <torch/csrc/autograd/python_variable.h>

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "classic/tensor.h"

namespace mamba_kernels {
namespace api = classic;
}  // namespace mamba_kernels

#include "../compat_entry_common.h"
#include "../scan_ops.h"

namespace mamba_kernels {
namespace selective_scan {
namespace {

compat::Armed armed;

// A plain tensor (torch.Tensor or Parameter, not a subclass with its own semantics), and not a
// conjugate or negative view (x.conj().imag, say): the op's body reads memory, and only torch's
// dispatcher, which this entry skips, resolves those views into their values.
const at::Tensor* plain(PyObject* o) {
  if (!THPVariable_CheckExact(o)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(o);
  return t.is_conj() || t.is_neg() ? nullptr : &t;
}

// A plain tensor or None; false for anything else.
bool plain_or_none(PyObject* o, OptTensor& t) {
  if (o == Py_None) return true;
  const at::Tensor* p = plain(o);
  if (p == nullptr) return false;
  t = *p;
  return true;
}

// What the fast path needs before the op checks the rest: CUDA u of (batch, dim, L) and real A
// (the Python function reshapes complex states; a dtype the kernels lack, float64, the op
// refuses, and the Python function runs the PyTorch path), no dispatch mode to honour, and the
// environment at a recompute spelling.
bool common_case(const at::Tensor& u, const at::Tensor& A) {
  return u.is_cuda() && u.dim() == 3 && A.dim() == 2 && A.scalar_type() == at::kFloat &&
         !c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::Python) && compat::env_allows(armed.env);
}

Tensor as_4d(const Tensor& t) { return t.dim() == 3 ? t.unsqueeze(1) : t; }

PyObject* to_list(std::initializer_list<const Tensor*> items) {
  PyObject* list = PyList_New(Py_ssize_t(items.size()));
  if (list == nullptr) return nullptr;
  Py_ssize_t i = 0;
  for (const Tensor* t : items) {
    PyObject* item = t != nullptr ? THPVariable_Wrap(*t) : (Py_INCREF(Py_None), Py_None);
    if (item == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, i++, item);
  }
  return list;
}

// fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus) -> [out, x] or [out, x, out_z]
PyObject* compat_fwd(PyObject*, PyObject* const* args, Py_ssize_t n, PyObject* kwnames) {
  // not armed yet (no spacing to lay the states out with): only the Python function can answer
  if (kwnames != nullptr || n != 9 || armed.spaced_steps <= 0) return compat::call_python(armed.fwd_py, args, n, kwnames);
  const at::Tensor *u = plain(args[0]), *delta = plain(args[1]), *A = plain(args[2]), *B = plain(args[3]),
                   *C = plain(args[4]);
  OptTensor D, z, bias;
  bool softplus = false;
  if (u == nullptr || delta == nullptr || A == nullptr || B == nullptr || C == nullptr ||
      !plain_or_none(args[5], D) || !plain_or_none(args[6], z) || !plain_or_none(args[7], bias) ||
      !compat::as_bool(args[8], softplus) || !common_case(*u, *A)) {
    return compat::call_python(armed.fwd_py, args, n, kwnames);
  }
  try {
    const int64_t L = u->size(2), span = 2 * armed.spaced_steps;
    auto [out, out_z, x] = scan_fwd(*u, *delta, *A, as_4d(*B), as_4d(*C), D, z, bias, softplus, true,
                                    armed.spaced_steps, 2 * ((L + span - 1) / span), true);
    return z.has_value() ? to_list({&out, &x, &out_z}) : to_list({&out, &x});
  } catch (const std::exception&) {
    // refused (or failed): the Python function runs the call again and names what is wrong
  }
  return compat::call_python(armed.fwd_py, args, n, kwnames);
}

// bwd(u, delta, A, B, C, D, z, delta_bias, dout, x, out, dz, delta_softplus, recompute_out_z)
//   -> [du, ddelta, dA, dB, dC, dD, ddelta_bias] (+ [dz] with z) (+ [out_z] if recompute_out_z)
PyObject* compat_bwd(PyObject*, PyObject* const* args, Py_ssize_t n, PyObject* kwnames) {
  if (kwnames != nullptr || n != 14 || armed.spaced_steps <= 0 || !armed.bwd_spaced) {
    return compat::call_python(armed.bwd_py, args, n, kwnames);
  }
  const at::Tensor *u = plain(args[0]), *delta = plain(args[1]), *A = plain(args[2]), *B = plain(args[3]),
                   *C = plain(args[4]), *dout = plain(args[8]), *x = plain(args[9]);
  OptTensor D, z, bias, out, dz;
  bool softplus = false, recompute_out_z = false;
  if (u == nullptr || delta == nullptr || A == nullptr || B == nullptr || C == nullptr || dout == nullptr ||
      x == nullptr || !plain_or_none(args[5], D) || !plain_or_none(args[6], z) || !plain_or_none(args[7], bias) ||
      !plain_or_none(args[10], out) || !plain_or_none(args[11], dz) || !compat::as_bool(args[12], softplus) ||
      !compat::as_bool(args[13], recompute_out_z) || !common_case(*u, *A) || A->size(1) > armed.spaced_max_dstate ||
      (z.has_value() && !out.has_value())) {
    return compat::call_python(armed.bwd_py, args, n, kwnames);
  }
  try {
    const bool gated = z.has_value();
    const Tensor empty = at::empty({0}, u->options());
    Tensor dz_t = gated ? (dz.has_value() ? *dz : at::empty_like(*z)) : empty;
    const Tensor out_z = gated && recompute_out_z ? at::empty_like(*z) : empty;
    const Tensor dout_t = dout->scalar_type() == u->scalar_type() ? *dout : dout->to(u->scalar_type());
    auto [du, ddelta, dA, dB, dC, dD, dbias] =
        scan_bwd(*u, *delta, *A, as_4d(*B), as_4d(*C), D, z, bias, dout_t, x->contiguous(),
                 gated ? out : OptTensor(), dz_t, out_z, softplus, armed.spaced_steps, true);
    if (B->dim() == 3) dB = dB.squeeze(1);
    if (C->dim() == 3) dC = dC.squeeze(1);
    const Tensor* dD_p = nullptr;
    const Tensor* dbias_p = nullptr;
    if (D.has_value()) {
      if (dD.scalar_type() != D->scalar_type()) dD = dD.to(D->scalar_type());
      dD_p = &dD;
    }
    if (bias.has_value()) {
      if (dbias.scalar_type() != bias->scalar_type()) dbias = dbias.to(bias->scalar_type());
      dbias_p = &dbias;
    }
    if (gated && recompute_out_z) return to_list({&du, &ddelta, &dA, &dB, &dC, dD_p, dbias_p, &dz_t, &out_z});
    if (gated) return to_list({&du, &ddelta, &dA, &dB, &dC, dD_p, dbias_p, &dz_t});
    if (recompute_out_z) return to_list({&du, &ddelta, &dA, &dB, &dC, dD_p, dbias_p, nullptr});
    return to_list({&du, &ddelta, &dA, &dB, &dC, dD_p, dbias_p});
  } catch (const std::exception&) {
    // refused (or failed): the Python function runs the call again and names what is wrong
  }
  return compat::call_python(armed.bwd_py, args, n, kwnames);
}

// compat_arm (compat_entry_common.h: ArmArgs): the arguments for reading tensors through DLPack
// (the stable build's entry) are optional here and unused.
PyObject* compat_arm(PyObject*, PyObject* args) {
  compat::ArmArgs parsed;
  if (!compat::arm_common(armed, args, false, parsed)) return nullptr;
  Py_RETURN_NONE;
}

}  // namespace
}  // namespace selective_scan

// The classic module's functions (module.cpp): the entries and their arming.
MAMBA_KERNELS_COMPAT_ENTRY_METHODS(
    "compat_arm(fwd_py, bwd_py, env_rules, spaced_steps, spaced_max_dstate, bwd_spaced[, exchange_capsule, "
    "(tensor_type, parameter_type, is_neg), dispatch_mode_count]): arm the entries (the last three unused here)")

}  // namespace mamba_kernels
