// The stable-ABI binding's error hook, and the one torch setting the stable ABI does not
// expose. Errors are std::runtime_error (RuntimeError in Python, message kept): the stable ABI
// has no way to raise torch's TypeError, so a wrong dtype is a RuntimeError here. The message is
// thrown as built, not through STD_TORCH_CHECK, whose location suffix is formatted with
// iostreams (see check_msg.h for why numbers avoid them).
// Python.h with the limited API only: the stable build's flags define Py_LIMITED_API=0x030A0000
// for every translation unit (binding_defines, mamba_kernels/build/binding.py), the floor of
// the cp310-abi3 wheel tag, so Python.h declares only what CPython 3.10's limited API has.
#include <Python.h>

#include <stdexcept>
#include <string>

#include "check_msg.h"
#include "stable/tensor.h"

namespace mamba_kernels {

void fail(ErrorKind kind, const std::string& message) {
  (void)kind;
  throw std::runtime_error(message);
}

namespace stable {

bool deterministic_algorithms() {
  if (!Py_IsInitialized()) return false;
  // Ops run with the GIL released (and the backward on autograd's own threads): take it.
  const PyGILState_STATE gil = PyGILState_Ensure();
  // torch.are_deterministic_algorithms_enabled, looked up once and kept (a new reference held
  // for the life of the process; set under the GIL, so threads do not race on it): a call then
  // costs the GIL and one Python call, about a microsecond.
  static PyObject* query = nullptr;
  if (query == nullptr) {
    PyObject* torch = PyImport_ImportModule("torch");
    if (torch != nullptr) {
      query = PyObject_GetAttrString(torch, "are_deterministic_algorithms_enabled");
      Py_DECREF(torch);
    }
  }
  int enabled = -1;
  if (query != nullptr) {
    PyObject* result = PyObject_CallObject(query, nullptr);
    if (result != nullptr) {
      enabled = PyObject_IsTrue(result);
      Py_DECREF(result);
    }
  }
  if (enabled < 0) PyErr_Clear();
  PyGILState_Release(gil);
  MK_CHECK(enabled >= 0, "mamba_kernels: torch.are_deterministic_algorithms_enabled() could not be read");
  return enabled == 1;
}

}  // namespace stable
}  // namespace mamba_kernels
