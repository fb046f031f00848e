// Fallback rules of the fast paths (design.md): a failed precondition runs the eager chain and is
// counted by reason; an injected kernel error disables the path for the process, counts
// "runtime_error" and still returns the eager result; during CUDA graph capture the error
// propagates instead. Its own binary, because disabling is process-wide.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "kernels/base/fast_path_registry.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

using testing::bits;
using testing::clone;
using testing::random_bf16;

FastPathCounters counters(const std::string& path) {
  return testing::fast_path_counters(path);
}
int64_t fallbacks(const std::string& path, const std::string& reason) {
  return testing::fast_path_fallbacks(path, reason);
}

TEST(FastPathFallbackTest, WrongDtypeIsRejectedBeforeAnyLaunch) {
  FLUX2_REQUIRE_GPU(be);
  Tensor x = be->empty(DType::kF32, {8, 128}).value();
  Tensor gate = random_bf16(*be, 1, 128, 1), update = random_bf16(*be, 8, 128, 2);
  const int64_t before = counters("gate_residual").invocations;
  const absl::Status status = be->gate_residual(x, gate.reshape({128}), update);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("gate_residual: x"), std::string::npos) << status;
  EXPECT_EQ(counters("gate_residual").invocations, before);
}

TEST(FastPathFallbackTest, UnsupportedAttentionShapeFallsBackAndIsCounted) {
  FLUX2_REQUIRE_GPU(be);
  // Causal attention (the text encoder) is not served by the fused cuDNN path.
  Tensor q = random_bf16(*be, 40, 256, 3), k = random_bf16(*be, 40, 128, 4),
         v = random_bf16(*be, 40, 128, 5);
  Tensor out = be->empty(DType::kBF16, {40, 256}).value();
  const int64_t before = fallbacks("cudnn_attention", "unsupported_shape");
  AttentionParams params{2, 1, 128, 0.088f, true, 33};
  ASSERT_TRUE(be->attention(q, k, v, params, out).ok());
  EXPECT_EQ(fallbacks("cudnn_attention", "unsupported_shape"), before + 1);
}

TEST(FastPathFallbackTest, SwitchedOffIsCounted) {
  FLUX2_REQUIRE_GPU(be);
  Tensor x = random_bf16(*be, 8, 128, 6), gate = random_bf16(*be, 1, 128, 7),
         update = random_bf16(*be, 8, 128, 8);
  const int64_t before = fallbacks("gate_residual", "switched_off");
  be->set_fast_paths(false);
  ASSERT_TRUE(be->gate_residual(x, gate.reshape({128}), update).ok());
  be->set_fast_paths(true);
  EXPECT_EQ(fallbacks("gate_residual", "switched_off"), before + 1);
}

TEST(FastPathFallbackTest, ErrorDuringCapturePropagates) {
  FLUX2_REQUIRE_GPU(be);
  Tensor x = random_bf16(*be, 64, 256, 9), gate = random_bf16(*be, 1, 256, 10),
         update = random_bf16(*be, 64, 256, 11);
  ASSERT_TRUE(be->synchronize().ok());
  cudaStream_t stream = cuda_stream_of(*be);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  inject_fast_path_failure("swiglu");
  const absl::Status status = be->swiglu(x, update, x);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  EXPECT_FALSE(status.ok()) << "a fast-path error during capture must propagate";
  EXPECT_FALSE(counters("swiglu").disabled) << "capture errors must not disable the path";
}

// Last: disables gate_residual for the rest of this process.
TEST(FastPathFallbackTest, InjectedKernelErrorDisablesPathAndFallsBack) {
  FLUX2_REQUIRE_GPU(be);
  Tensor x = random_bf16(*be, 300, 3072, 12, 4.0f), gate = random_bf16(*be, 1, 3072, 13);
  Tensor update = random_bf16(*be, 300, 3072, 14);
  Tensor expected = clone(*be, x);
  be->set_fast_paths(false);
  ASSERT_TRUE(be->gate_residual(expected, gate.reshape({3072}), update).ok());
  be->set_fast_paths(true);
  const int64_t runtime_errors = fallbacks("gate_residual", "runtime_error");
  inject_fast_path_failure("gate_residual");
  ASSERT_TRUE(be->gate_residual(x, gate.reshape({3072}), update).ok())
      << "the request must complete on the eager chain";
  EXPECT_EQ(bits(*be, x), bits(*be, expected));
  EXPECT_TRUE(counters("gate_residual").disabled);
  EXPECT_EQ(fallbacks("gate_residual", "runtime_error"), runtime_errors + 1);
  // Later calls take the eager chain, counted as disabled.
  const int64_t disabled = fallbacks("gate_residual", "disabled_after_error");
  ASSERT_TRUE(be->gate_residual(x, gate.reshape({3072}), update).ok());
  EXPECT_EQ(fallbacks("gate_residual", "disabled_after_error"), disabled + 1);
}

}  // namespace
}  // namespace flux2
