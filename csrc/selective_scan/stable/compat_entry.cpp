// selective_scan_cuda.fwd and .bwd (mamba_ssm's compiled-module contract, selective_scan/
// cuda_compat.py) as C functions of the stable build's module, for their common case: the
// classic build's entry (classic/compat_entry.cpp) for a stable-ABI binary. mamba_ssm's small
// layers wait on the host, where the Python function plus a torch.ops call cost about twice the
// original's pybind11 function (docs/SCAN.md, "The ops"). A stable binary cannot read a Python
// tensor through torch's C++ ABI; it reads it through DLPack's C exchange API, which torch
// publishes on torch.Tensor (stable/dlpack_tensor.h), and runs the same op bodies (scan_ops.h)
// over it.
//
// The common case is the classic entry's: positional arguments, tensors of exactly torch.Tensor
// or torch.nn.Parameter (no subclass), no dispatch mode active, CUDA u, real fp32 A, the
// environment at a recompute spelling, for the backward the spaced states; and here also what
// the op bodies would need one of torch's kernels for is absent (a dtype conversion, a copy to
// a contiguous layout: dlpack::HandBack). Anything else goes to the Python function, which
// keeps the whole contract and names the argument at fault.
#include "stable/dlpack_tensor.h"

namespace mamba_kernels {
namespace api = dlpack;
}  // namespace mamba_kernels

#include "../compat_entry_common.h"
#include "../scan_ops.h"

namespace mamba_kernels {
namespace dlpack {
namespace {
const DLPackExchangeAPI* g_exchange = nullptr;
}  // namespace
const DLPackExchangeAPI* exchange() { return g_exchange; }
void set_exchange(const DLPackExchangeAPI* api) { g_exchange = api; }
}  // namespace dlpack

namespace selective_scan {
namespace {

using dlpack::HandBack;
using dlpack::OptTensor;
using dlpack::Tensor;

struct StableArmed {
  compat::Armed common;
  PyObject* tensor_type = nullptr;  // torch.Tensor
  PyObject* param_type = nullptr;   // torch.nn.Parameter
  PyObject* modes = nullptr;        // torch._C._len_torch_dispatch_stack: dispatch modes active
  PyObject* is_neg = nullptr;       // torch.Tensor.is_neg
};
StableArmed armed;

// Whether t is a negative view (x.conj().imag, say), whose values DLPack does not carry.
bool negative_view(PyObject* t) {
  PyObject* r = PyObject_CallFunctionObjArgs(armed.is_neg, t, nullptr);
  if (r == nullptr) {
    PyErr_Clear();
    return true;
  }
  const bool neg = r != Py_False;
  Py_DECREF(r);
  return neg;
}

// A real tensor of exactly torch.Tensor or Parameter, read as a DLTensor; false for anything
// else. DLPack carries neither torch's conjugate nor its negative bit: complex tensors (which
// the common case never has) and negative views go to the Python function, through torch.ops,
// whose dispatcher resolves them.
bool plain(PyObject* o, Tensor& t) {
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(o));
  if (type != armed.tensor_type && type != armed.param_type) return false;
  DLTensor dl;
  if (dlpack::exchange()->dltensor_from_py_object_no_sync(o, &dl) != 0) {
    PyErr_Clear();
    return false;
  }
  if (dl.dtype.code == kDLComplex || negative_view(o)) return false;
  try {
    t = Tensor::borrow(dl);
  } catch (const HandBack&) {
    return false;
  }
  return true;
}

bool plain_or_none(PyObject* o, OptTensor& t) {
  if (o == Py_None) return true;
  Tensor v;
  if (!plain(o, v)) return false;
  t = v;
  return true;
}

bool no_dispatch_mode() {
  PyObject* n = PyObject_CallNoArgs(armed.modes);
  if (n == nullptr) {
    PyErr_Clear();
    return false;
  }
  const long count = PyLong_AsLong(n);
  Py_DECREF(n);
  if (count == -1 && PyErr_Occurred()) PyErr_Clear();
  return count == 0;
}

bool common_case(const Tensor& u, const Tensor& A) {
  const DLDataType a = A.dl_dtype();
  return u.is_cuda() && u.dim() == 3 && A.dim() == 2 && a.code == kDLFloat && a.bits == 32 && a.lanes == 1 &&
         compat::env_allows(armed.common.env) && no_dispatch_mode();
}

Tensor as_4d(const Tensor& t) { return t.dim() == 3 ? t.unsqueeze(1) : t; }

// [items...]: each a new Python tensor, a given object (new reference), or None.
struct Item {
  const Tensor* t = nullptr;
  PyObject* given = nullptr;
};
PyObject* to_list(std::initializer_list<Item> items) {
  PyObject* list = PyList_New(Py_ssize_t(items.size()));
  if (list == nullptr) return nullptr;
  Py_ssize_t i = 0;
  for (const Item& it : items) {
    PyObject* o = it.t != nullptr ? it.t->to_python() : it.given != nullptr ? it.given : Py_None;
    if (o == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    if (it.t == nullptr) Py_INCREF(o);
    PyList_SetItem(list, i++, o);
  }
  return list;
}

// fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus) -> [out, x] or [out, x, out_z]
PyObject* compat_fwd(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  const compat::Armed& a = armed.common;
  if (kwnames != nullptr || nargs != 9 || a.spaced_steps <= 0) return compat::call_python(a.fwd_py, args, nargs, kwnames);
  Tensor u, delta, A, B, C;
  OptTensor D, z, bias;
  bool softplus = false;
  if (!plain(args[0], u) || !plain(args[1], delta) || !plain(args[2], A) || !plain(args[3], B) ||
      !plain(args[4], C) || !plain_or_none(args[5], D) || !plain_or_none(args[6], z) ||
      !plain_or_none(args[7], bias) || !compat::as_bool(args[8], softplus) || !common_case(u, A)) {
    return compat::call_python(a.fwd_py, args, nargs, kwnames);
  }
  try {
    const int64_t L = u.size(2), span = 2 * a.spaced_steps;
    auto [out, out_z, x] = scan_fwd(u, delta, A, as_4d(B), as_4d(C), D, z, bias, softplus, true, a.spaced_steps,
                                    2 * ((L + span - 1) / span), true);
    return z.has_value() ? to_list({{&out}, {&x}, {&out_z}}) : to_list({{&out}, {&x}});
  } catch (const std::exception&) {
    // refused, failed or handed back (nothing launched then): the Python function runs the call
  }
  return compat::call_python(a.fwd_py, args, nargs, kwnames);
}

// bwd(u, delta, A, B, C, D, z, delta_bias, dout, x, out, dz, delta_softplus, recompute_out_z)
//   -> [du, ddelta, dA, dB, dC, dD, ddelta_bias] (+ [dz] with z) (+ [out_z] if recompute_out_z)
PyObject* compat_bwd(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  const compat::Armed& a = armed.common;
  if (kwnames != nullptr || nargs != 14 || a.spaced_steps <= 0 || !a.bwd_spaced) {
    return compat::call_python(a.bwd_py, args, nargs, kwnames);
  }
  Tensor u, delta, A, B, C, dout, x;
  OptTensor D, z, bias, out, dz;
  bool softplus = false, recompute_out_z = false;
  auto fp32_or_none = [](const OptTensor& t) { return !t.has_value() || t->scalar_type() == dlpack::ScalarType::Float; };
  if (!plain(args[0], u) || !plain(args[1], delta) || !plain(args[2], A) || !plain(args[3], B) ||
      !plain(args[4], C) || !plain(args[8], dout) || !plain(args[9], x) || !plain_or_none(args[5], D) ||
      !plain_or_none(args[6], z) || !plain_or_none(args[7], bias) || !plain_or_none(args[10], out) ||
      !plain_or_none(args[11], dz) || !compat::as_bool(args[12], softplus) ||
      !compat::as_bool(args[13], recompute_out_z) || !common_case(u, A) || A.size(1) > a.spaced_max_dstate ||
      (z.has_value() && !out.has_value()) ||
      // what the classic entry converts with torch's kernels: here the Python function does it
      dout.scalar_type() != u.scalar_type() || !x.is_contiguous() || !fp32_or_none(D) || !fp32_or_none(bias)) {
    return compat::call_python(a.bwd_py, args, nargs, kwnames);
  }
  try {
    const bool gated = z.has_value();
    const Tensor empty = dlpack::empty(u, {0}, u.scalar_type());
    const Tensor dz_t = gated ? (dz.has_value() ? *dz : dlpack::empty_like(*z, dlpack::tref(*z))) : empty;
    const Tensor out_z = gated && recompute_out_z ? dlpack::empty_like(*z, dlpack::tref(*z)) : empty;
    auto [du, ddelta, dA, dB, dC, dD, dbias] = scan_bwd(u, delta, A, as_4d(B), as_4d(C), D, z, bias, dout, x,
                                                        gated ? out : OptTensor(), dz_t, out_z, softplus,
                                                        a.spaced_steps, true);
    if (B.dim() == 3) dB = dB.squeeze(1);
    if (C.dim() == 3) dC = dC.squeeze(1);
    const Item dD_i = D.has_value() ? Item{&dD} : Item{};
    const Item dbias_i = bias.has_value() ? Item{&dbias} : Item{};
    // a given dz is the caller's own tensor, written in place: returned as it is
    const Item dz_i = dz.has_value() ? Item{nullptr, args[11]} : Item{&dz_t};
    if (gated && recompute_out_z) return to_list({{&du}, {&ddelta}, {&dA}, {&dB}, {&dC}, dD_i, dbias_i, dz_i, {&out_z}});
    if (gated) return to_list({{&du}, {&ddelta}, {&dA}, {&dB}, {&dC}, dD_i, dbias_i, dz_i});
    if (recompute_out_z) return to_list({{&du}, {&ddelta}, {&dA}, {&dB}, {&dC}, dD_i, dbias_i, {}});
    return to_list({{&du}, {&ddelta}, {&dA}, {&dB}, {&dC}, dD_i, dbias_i});
  } catch (const std::exception&) {
    // refused, failed or handed back before any launch: the Python function runs the call
  }
  return compat::call_python(a.bwd_py, args, nargs, kwnames);
}

// compat_arm (compat_entry_common.h: ArmArgs), the DLPack arguments required: the exchange API
// is checked first, so a torch without it leaves the entry unarmed.
PyObject* compat_arm(PyObject*, PyObject* args) {
  compat::ArmArgs p;
  compat::Armed staged = armed.common;  // armed only once everything below holds
  Py_XINCREF(staged.fwd_py);
  Py_XINCREF(staged.bwd_py);
  const bool ok = compat::arm_common(staged, args, true, p);
  PyObject *tensor_type = nullptr, *param_type = nullptr, *is_neg = nullptr;
  const DLPackExchangeAPI* api = nullptr;
  bool ready = ok && PyArg_ParseTuple(p.types, "OOO", &tensor_type, &param_type, &is_neg);
  if (ready) {
    api = static_cast<const DLPackExchangeAPI*>(PyCapsule_GetPointer(p.capsule, "dlpack_exchange_api"));
    ready = api != nullptr;
  }
  if (ready && (api->header.version.major != DLPACK_MAJOR_VERSION || api->managed_tensor_allocator == nullptr ||
                api->managed_tensor_to_py_object_no_sync == nullptr ||
                api->dltensor_from_py_object_no_sync == nullptr || api->current_work_stream == nullptr)) {
    PyErr_SetString(PyExc_ValueError, "compat_arm: the DLPack exchange API lacks a function the entry needs");
    ready = false;
  }
  if (ready && (!PyCallable_Check(p.modes) || !PyCallable_Check(is_neg))) {
    PyErr_SetString(PyExc_ValueError, "compat_arm: dispatch_mode_count and is_neg must be callable");
    ready = false;
  }
  if (!ready) {
    Py_XDECREF(staged.fwd_py);
    Py_XDECREF(staged.bwd_py);
    return nullptr;
  }
  Py_XDECREF(armed.common.fwd_py);
  Py_XDECREF(armed.common.bwd_py);
  armed.common = std::move(staged);
  PyObject* capsule = p.capsule;
  PyObject* modes = p.modes;
  Py_INCREF(capsule);  // the API lives as long as the capsule: kept for the process
  Py_INCREF(tensor_type);
  Py_INCREF(param_type);
  Py_INCREF(modes);
  Py_INCREF(is_neg);
  Py_XDECREF(armed.is_neg);  // a second arming (tests) replaces the first
  Py_XDECREF(armed.tensor_type);
  Py_XDECREF(armed.param_type);
  Py_XDECREF(armed.modes);
  armed.is_neg = is_neg;
  armed.tensor_type = tensor_type;
  armed.param_type = param_type;
  armed.modes = modes;
  dlpack::set_exchange(api);
  Py_RETURN_NONE;
}

}  // namespace
}  // namespace selective_scan

// The stable module's functions (module.cpp): the entries and their arming.
MAMBA_KERNELS_COMPAT_ENTRY_METHODS(
    "compat_arm(fwd_py, bwd_py, env_rules, spaced_steps, spaced_max_dstate, bwd_spaced, exchange_capsule, "
    "(tensor_type, parameter_type, is_neg), dispatch_mode_count): arm the entries")

}  // namespace mamba_kernels
