// Backend creation by name; see backend_factory.h.
#include "kernels/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "kernels/base/parallel.h"
#include "kernels/base/status.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/in_process_communicator.h"
#ifdef FLUX2_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/nccl_communicator.h"
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

int backend_device_count(absl::string_view name) {
  if (name == "cpu") return -1;
#ifdef FLUX2_HAVE_CUDA
  if (name == "cuda") return cuda_device_count();
#endif
  return 0;
}

absl::StatusOr<std::unique_ptr<Backend>> create_backend_on_device(absl::string_view name,
                                                                  const BackendOptions& options,
                                                                  int device) {
#ifdef FLUX2_HAVE_CUDA
  if (name == "cuda") FLUX_RETURN_IF_ERROR(cuda_set_device(device));
#endif
  return create_backend(name, options);
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> create_communicator_group(
    const std::vector<Backend*>& backends, const std::vector<int>& devices) {
  if (backends.empty() || backends.size() != devices.size()) {
    return absl::InvalidArgumentError(absl::StrCat("create_communicator_group: ", backends.size(),
                                                   " backends and ", devices.size(), " devices"));
  }
  if (backends[0]->name() == "cpu") {
    return create_in_process_group(static_cast<int>(backends.size()));
  }
#ifdef FLUX2_HAVE_CUDA
  if (backends[0]->name() == "cuda") {
    std::vector<cudaStream_t> streams;
    for (Backend* backend : backends) streams.push_back(cuda_stream_of(*backend));
    return create_nccl_group(devices, streams);
  }
#endif
  return absl::UnimplementedError(
      absl::StrCat("the ", backends[0]->name(), " backend has no communicator"));
}

}  // namespace flux2
