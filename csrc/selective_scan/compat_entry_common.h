// What both builds' C entries for selective_scan_cuda.fwd / .bwd share (classic/compat_entry.cpp
// reads the caller's tensors through torch's C++ ABI, stable/compat_entry.cpp through DLPack's C
// exchange API): the facts Python arms them with, the environment check, the bool arguments
// and the hand-back to the Python function. Limited C API only: the stable module is abi3.
#pragma once

#include <Python.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace mamba_kernels {
namespace selective_scan {
namespace compat {

// environment variable -> the values under which the common case holds ("" stands for unset)
using EnvRules = std::vector<std::pair<std::string, std::vector<std::string>>>;

struct Armed {
  PyObject* fwd_py = nullptr;  // the Python functions (strong references, kept for the process)
  PyObject* bwd_py = nullptr;
  EnvRules env;
  int64_t spaced_steps = 0;       // the recompute layout's state spacing (0: not armed)
  int64_t spaced_max_dstate = 0;  // the largest dstate the backward starts from spaced states at
  bool bwd_spaced = false;        // every visible GPU holds the spaced backward's block
};

inline bool env_allows(const EnvRules& env) {
  for (const auto& [name, values] : env) {
#ifdef _MSC_VER
#pragma warning(suppress : 4996)  // getenv: the value is only compared here, never kept
#endif
    const char* raw = std::getenv(name.c_str());
    const char* value = raw != nullptr ? raw : "";
    bool ok = false;
    for (const auto& v : values) ok = ok || std::strcmp(value, v.c_str()) == 0;
    if (!ok) return false;
  }
  return true;
}

inline bool as_bool(PyObject* o, bool& b) {
  if (o != Py_True && o != Py_False) return false;
  b = o == Py_True;
  return true;
}

// fn(*args, **kwargs) for a METH_FASTCALL | METH_KEYWORDS call's arguments: the Python function
// answers (before arming, outside the common case, or when the op refused).
inline PyObject* call_python(PyObject* fn, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (fn == nullptr) {
    PyErr_SetString(PyExc_RuntimeError,
                    "mamba_kernels: the selective_scan_cuda C entry is not armed yet: call selective_scan_cuda.fwd "
                    "(which arms it after its first compiled call), not the extension's compat_fwd / compat_bwd");
    return nullptr;
  }
  const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_Size(kwnames) : 0;
  PyObject* pos = PyTuple_New(nargs);
  if (pos == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    Py_INCREF(args[i]);
    PyTuple_SetItem(pos, i, args[i]);
  }
  PyObject* kw = nullptr;
  if (nkw > 0) {
    kw = PyDict_New();
    for (Py_ssize_t i = 0; kw != nullptr && i < nkw; ++i) {
      if (PyDict_SetItem(kw, PyTuple_GetItem(kwnames, i), args[nargs + i]) < 0) {
        Py_DECREF(kw);
        kw = nullptr;
      }
    }
    if (kw == nullptr) {
      Py_DECREF(pos);
      return nullptr;
    }
  }
  PyObject* result = PyObject_Call(fn, pos, kw);
  Py_DECREF(pos);
  Py_XDECREF(kw);
  return result;
}

// ((name, (value, ...)), ...) -> EnvRules; false with a Python error set.
inline bool read_env_rules(PyObject* rules, EnvRules& out) {
  const Py_ssize_t n = PySequence_Size(rules);
  if (n < 0) return false;
  EnvRules env;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PySequence_GetItem(rules, i);
    PyObject *name = nullptr, *values = nullptr;
    const bool ok = item != nullptr && PyArg_ParseTuple(item, "UO", &name, &values);
    Py_XDECREF(item);  // name and values stay alive through rules
    if (!ok) return false;
    Py_ssize_t len = 0;
    const char* name_s = PyUnicode_AsUTF8AndSize(name, &len);
    const Py_ssize_t nv = name_s != nullptr ? PySequence_Size(values) : -1;
    if (nv < 0) return false;
    std::vector<std::string> vs;
    for (Py_ssize_t j = 0; j < nv; ++j) {
      PyObject* v = PySequence_GetItem(values, j);
      Py_ssize_t vlen = 0;
      const char* s = v != nullptr ? PyUnicode_AsUTF8AndSize(v, &vlen) : nullptr;
      if (s != nullptr) vs.emplace_back(s, size_t(vlen));
      Py_XDECREF(v);
      if (s == nullptr) return false;
    }
    env.emplace_back(std::string(name_s, size_t(len)), std::move(vs));
  }
  out = std::move(env);
  return true;
}

// compat_arm's arguments: (fwd_py, bwd_py, env_rules, spaced_steps, spaced_max_dstate,
// bwd_spaced, exchange_capsule, (tensor_type, parameter_type, is_neg), dispatch_mode_count). The
// last three are for reading tensors through DLPack (the stable build's entry; optional for the
// classic one, which ignores them).
struct ArmArgs {
  PyObject *fwd_py = nullptr, *bwd_py = nullptr, *rules = nullptr;
  long long steps = 0, max_dstate = 0;
  int bwd_spaced = 0;
  PyObject *capsule = nullptr, *types = nullptr, *modes = nullptr;
};

// Parses them and arms `a` with the first six; false with a Python error set.
inline bool arm_common(Armed& a, PyObject* args, bool dlpack_args_required, ArmArgs& p) {
  if (!PyArg_ParseTuple(args, dlpack_args_required ? "OOOLLpOOO" : "OOOLLp|OOO", &p.fwd_py, &p.bwd_py, &p.rules,
                        &p.steps, &p.max_dstate, &p.bwd_spaced, &p.capsule, &p.types, &p.modes)) {
    return false;
  }
  if (!PyCallable_Check(p.fwd_py) || !PyCallable_Check(p.bwd_py) || p.steps <= 0) {
    PyErr_SetString(PyExc_ValueError, "compat_arm: two callables and a positive state spacing are required");
    return false;
  }
  EnvRules env;
  if (!read_env_rules(p.rules, env)) return false;
  Py_INCREF(p.fwd_py);
  Py_INCREF(p.bwd_py);
  Py_XDECREF(a.fwd_py);
  Py_XDECREF(a.bwd_py);
  a.fwd_py = p.fwd_py;
  a.bwd_py = p.bwd_py;
  a.env = std::move(env);
  a.spaced_steps = p.steps;
  a.spaced_max_dstate = p.max_dstate;
  a.bwd_spaced = p.bwd_spaced != 0;
  return true;
}

}  // namespace compat
}  // namespace selective_scan
}  // namespace mamba_kernels

// The entry's module functions (module.cpp reads them as kBindingMethods), defined inside
// namespace mamba_kernels by each build's compat_entry.cpp, whose selective_scan::compat_fwd,
// compat_bwd and compat_arm they name; ARM_DOC says what its compat_arm takes.
#define MAMBA_KERNELS_COMPAT_ENTRY_METHODS(ARM_DOC)                                                       \
  PyMethodDef kBindingMethods[] = {                                                                       \
      {"compat_fwd", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&selective_scan::compat_fwd)), \
       METH_FASTCALL | METH_KEYWORDS, "selective_scan_cuda.fwd's common case (selective_scan/cuda_compat.py)"}, \
      {"compat_bwd", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&selective_scan::compat_bwd)), \
       METH_FASTCALL | METH_KEYWORDS, "selective_scan_cuda.bwd's common case (selective_scan/cuda_compat.py)"}, \
      {"compat_arm", &selective_scan::compat_arm, METH_VARARGS, ARM_DOC},                                 \
      {nullptr, nullptr, 0, nullptr},                                                                     \
  };
