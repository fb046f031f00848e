// GPU test helpers; see gpu_test_util.h.
#include "tests/cuda/gpu_test_util.h"

#include <cuda_runtime_api.h>

#include <cstdlib>

#include "kernels/base/dtype.h"

namespace flux2::testing {

Backend* gpu_backend(std::string* why, bool* no_device) {
  static absl::StatusOr<std::unique_ptr<Backend>> backend = create_cuda_backend();
  if (!backend.ok()) {
    *why = std::string(backend.status().message());
    if (no_device != nullptr) *no_device = absl::IsNotFound(backend.status());
    return nullptr;
  }
  return backend->get();
}

Tensor random_bf16(Backend& be, int64_t rows, int64_t cols, uint64_t seed, float scale) {
  Tensor t = be.empty(DType::kBF16, {rows, cols}).value();
  EXPECT_TRUE(be.fill_uniform(t, seed, scale).ok());
  return t;
}

std::vector<uint16_t> bits(Backend& be, const Tensor& t) {
  EXPECT_TRUE(be.synchronize().ok());
  std::vector<uint16_t> out(static_cast<size_t>(t.numel()));
  const size_t row_bytes = static_cast<size_t>(t.cols()) * 2;
  EXPECT_EQ(cudaMemcpy2D(out.data(), row_bytes, t.data(), static_cast<size_t>(t.row_stride()) * 2,
                         row_bytes, static_cast<size_t>(t.rows()), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return out;
}

std::vector<float> values(Backend& be, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  EXPECT_TRUE(be.download(t, out.data()).ok());
  return out;
}

Tensor clone(Backend& be, const Tensor& t) {
  Tensor copy = be.empty(t.dtype(), {t.rows(), t.cols()}).value();
  EXPECT_TRUE(be.copy(t, copy).ok());
  return copy;
}

Weight fp8_weight(Backend& be, int64_t n, int64_t k, uint64_t seed) {
  Weight w = random_bf16(be, n, k, seed, 0.05f);
  auto low = be.add_fp8_weight(w.tensor);
  EXPECT_TRUE(low.ok()) << low.status();
  if (low.ok()) w.low_precision = *low;
  return w;
}

FastPathCounters fast_path_counters(const std::string& path) {
  for (const FastPathCounters& c : fast_path_snapshot()) {
    if (c.path == path) return c;
  }
  FastPathCounters none;
  none.path = path;
  return none;
}

int64_t fast_path_fallbacks(const std::string& path, const std::string& reason) {
  const FastPathCounters c = fast_path_counters(path);
  const auto found = c.fallbacks.find(reason);
  return found == c.fallbacks.end() ? 0 : found->second;
}

}  // namespace flux2::testing
