// Backend creation by name; see backend_factory.h.
#include "kernels/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "kernels/base/parallel.h"
#include "kernels/base/status.h"
#include "kernels/cpu/cpu_backend.h"
#ifdef FLUX2_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace flux2 {

bool cuda_backend_compiled() {
#ifdef FLUX2_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> create_backend(absl::string_view name,
                                                        const BackendOptions& options) {
  if (name == "cpu") {
    FLUX_RETURN_IF_ERROR(set_parallel_thread_count(options.cpu_threads));
    return std::unique_ptr<Backend>(new CpuBackend());
  }
  if (name == "cuda") {
#ifdef FLUX2_HAVE_CUDA
    return create_cuda_backend(options);
#else
    return absl::NotFoundError(
        "this build has no CUDA backend (configured without a CUDA toolkit)");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend \"", name, "\" (expected cpu or cuda)"));
}

}  // namespace flux2
