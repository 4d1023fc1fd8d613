// The classic binding's error hook: torch's own error types, so a bad value raises
// RuntimeError and a wrong dtype TypeError in Python.
#include <c10/util/Exception.h>

#include <stdexcept>
#include <string>

#include "check_msg.h"

namespace mamba_kernels {

void fail(ErrorKind kind, const std::string& message) {
  if (kind == ErrorKind::kType) TORCH_CHECK_TYPE(false, message);
  TORCH_CHECK(false, message);
  // TORCH_CHECK(false, ...) always throws; the compiler may not see it.
  throw std::logic_error(message);
}

}  // namespace mamba_kernels
