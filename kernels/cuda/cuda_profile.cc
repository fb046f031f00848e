// CudaBackend's op profile for `flux2 bench --profile`: device time per category (or per GEMM
// shape and op name, OpProfiling::kByShape) between CUDA events on the backend's stream.
// Exercised by `flux2 bench --profile` on the GPU (tests/gpu/run_on_device.sh).
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_backend_impl.h"

namespace flux2 {

OpProfileScope::OpProfileScope(CudaBackend& backend, std::string category)
    : backend_(backend), category_(std::move(category)) {
  if (backend_.profiling_ == OpProfiling::kOff || category_.empty()) return;
  counted_ = true;
  if (backend_.profile_depth_++ == 0) {
    cudaEventCreate(&start_);
    cudaEventRecord(start_, backend_.stream());
  }
}

OpProfileScope::~OpProfileScope() {
  if (!counted_) return;
  if (--backend_.profile_depth_ == 0 && start_ != nullptr) {
    cudaEvent_t stop;
    cudaEventCreate(&stop);
    cudaEventRecord(stop, backend_.stream());
    backend_.profiled_.push_back({std::move(category_), start_, stop});
  }
}

std::string CudaBackend::op_category(absl::string_view category, absl::string_view op) const {
  return by_shape() && !op.empty() ? absl::StrCat(category, " ", op) : std::string(category);
}

std::string CudaBackend::profile_category(absl::string_view category, const Tensor& x,
                                          int64_t n) const {
  if (!by_shape()) return std::string(category);
  return absl::StrCat(category, " ", x.rows(), "x", n, "x", x.cols());
}

std::map<std::string, double> CudaBackend::take_op_profile() {
  std::map<std::string, double> totals;
  cudaStreamSynchronize(stream());
  for (const ProfiledOp& op : profiled_) {
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, op.start, op.stop) == cudaSuccess) totals[op.category] += ms;
    cudaEventDestroy(op.start);
    cudaEventDestroy(op.stop);
  }
  profiled_.clear();
  return totals;
}

}  // namespace flux2
