// Default implementations of the Backend interface's optional methods; see backend.h.
#include "kernels/backend.h"

#include <chrono>

#include "kernels/base/status.h"

namespace flux2 {

absl::StatusOr<double> Backend::time_ms(const std::function<absl::Status()>& work) {
  FLUX_RETURN_IF_ERROR(synchronize());
  const auto start = std::chrono::steady_clock::now();
  FLUX_RETURN_IF_ERROR(work());
  FLUX_RETURN_IF_ERROR(synchronize());
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace flux2
