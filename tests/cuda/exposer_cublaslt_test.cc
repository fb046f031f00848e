// prometheus-cpp's Exposer and cuBLASLt in one process: linked, cuBLASLt's ~94 KB static TLS makes
// civetweb's small-stack thread creation fail ("null context when constructing CivetServer").
// cuBLASLt is dlopen-ed, so the Exposer's civetweb threads start; with a GPU a cuBLASLt GEMM runs
// as well.
#include <gtest/gtest.h>
#include <prometheus/exposer.h>

#include "kernels/cuda/cublaslt_api.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

TEST(ExposerCublasLtTest, BothWorkInOneProcess) {
  auto api = cuda::cublaslt_api();
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_GT((*api)->get_version(), 0u);
  std::unique_ptr<prometheus::Exposer> exposer;
  ASSERT_NO_THROW(exposer = std::make_unique<prometheus::Exposer>("127.0.0.1:0"));
  EXPECT_FALSE(exposer->GetListeningPorts().empty());
  std::string why;
  Backend* be = testing::gpu_backend(&why);
  if (be == nullptr) GTEST_SKIP() << "Exposer + cuBLASLt loaded; no GPU for a GEMM: " << why;
  Tensor x = testing::random_bf16(*be, 64, 128, 1), w = testing::random_bf16(*be, 32, 128, 2);
  Tensor y = be->empty(DType::kBF16, {64, 32}).value();
  EXPECT_TRUE(be->linear(x, w, {}, y).ok());
  EXPECT_TRUE(be->synchronize().ok());
}

}  // namespace
}  // namespace flux2
