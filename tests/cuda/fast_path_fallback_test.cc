// Fallback rules of the fast paths (kernels/README.md) on the CUDA backend: a call a path never
// serves by design counts nothing; a failed precondition runs the fallback and is counted by
// reason; the fast-path switch sends fused kernels to their eager chains and leaves implementations
// alone; an injected kernel error disables the path for the process, counts "runtime_error" and
// still returns the eager result (klein-KV's FP8 cache: dequantized for bf16 attention); during
// CUDA graph capture the error propagates instead. Its own binary, because disabling is
// process-wide.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/base/fast_path_registry.h"
#include "kernels/cuda/attention_fp8_operands.h"
#include "kernels/cuda/flash_attention_fp8.h"
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

// Every path's fallbacks added up, for "nothing was counted" checks.
int64_t total_fallbacks() {
  int64_t total = 0;
  for (const FastPathCounters& c : fast_path_snapshot()) {
    for (const auto& [reason, count] : c.fallbacks) total += count;
  }
  return total;
}

// The text encoder's causal, padded GQA attention is not what cuDNN's path serves: it runs the
// plain kernel and no path counts a fallback (it used to count cudnn_attention{unsupported_shape}
// on every layer of every request, ~27 per klein request, above the 1% alert).
TEST(FastPathFallbackTest, CausalAttentionIsNotAFallback) {
  FLUX2_REQUIRE_GPU(be);
  Tensor q = random_bf16(*be, 40, 256, 3), k = random_bf16(*be, 40, 128, 4),
         v = random_bf16(*be, 40, 128, 5);
  Tensor out = be->empty(DType::kBF16, {40, 256}).value();
  const int64_t before = total_fallbacks();
  const int64_t cudnn = counters("cudnn_attention").invocations;
  const AttentionParams params{2, 1, 128, 0.088f, true, 33};
  for (const Quality quality : {Quality::kLossless, Quality::kHigh}) {
    const RequestScope request(*be, {quality});
    ASSERT_TRUE(be->attention(q, k, v, params, out).ok());
  }
  EXPECT_EQ(total_fallbacks(), before) << "a by-design choice counted a fallback";
  EXPECT_EQ(counters("cudnn_attention").invocations, cudnn);
}

// A shape the path means to serve but cannot (head_dim 12: cuDNN needs a multiple of 8) is a real
// fallback: counted with its reason, and the plain kernel's result returned.
TEST(FastPathFallbackTest, UnsupportedAttentionShapeFallsBackAndIsCounted) {
  FLUX2_REQUIRE_GPU(be);
  Tensor q = random_bf16(*be, 40, 24, 3), k = random_bf16(*be, 40, 24, 4),
         v = random_bf16(*be, 40, 24, 5);
  Tensor out = be->empty(DType::kBF16, {40, 24}).value();
  const int64_t before = fallbacks("cudnn_attention", "unsupported_shape");
  const AttentionParams params{2, 2, 12, 0.29f};
  ASSERT_TRUE(be->attention(q, k, v, params, out).ok());
  EXPECT_EQ(fallbacks("cudnn_attention", "unsupported_shape"), before + 1);
}

// One switch, one meaning: fast paths off runs the fused kernels' eager chains (counted
// "switched_off"), while implementations such as cuDNN attention keep running and count nothing.
TEST(FastPathFallbackTest, SwitchedOffCountsFusedKernelsOnly) {
  FLUX2_REQUIRE_GPU(be);
  Tensor x = random_bf16(*be, 8, 128, 6), gate = random_bf16(*be, 1, 128, 7),
         update = random_bf16(*be, 8, 128, 8);
  Tensor q = random_bf16(*be, 64, 256, 9), out = be->empty(DType::kBF16, {64, 256}).value();
  const int64_t switched = fallbacks("gate_residual", "switched_off");
  const int64_t cudnn = counters("cudnn_attention").invocations;
  const int64_t before = total_fallbacks();
  {
    const RequestScope off(*be, {Quality::kLossless, /*fast_paths=*/false});
    ASSERT_TRUE(be->gate_residual(x, gate.reshape({128}), update).ok());
    ASSERT_TRUE(be->attention(q, q, q, AttentionParams{2, 2, 128, 0.088f}, out).ok());
  }
  EXPECT_EQ(fallbacks("gate_residual", "switched_off"), switched + 1);
  EXPECT_EQ(counters("cudnn_attention").invocations, cudnn + 1);
  EXPECT_EQ(total_fallbacks(), before + 1) << "only the fused kernel fell back";
  // Outside the scope the request's switch is gone: the fused kernel runs again.
  const int64_t fused = counters("gate_residual").invocations;
  ASSERT_TRUE(be->gate_residual(x, gate.reshape({128}), update).ok());
  EXPECT_EQ(counters("gate_residual").invocations, fused + 1);
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
  {
    const RequestScope eager(*be, {Quality::kLossless, /*fast_paths=*/false});
    ASSERT_TRUE(be->gate_residual(expected, gate.reshape({3072}), update).ok());
  }
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

// Last too: disables flash_attention_fp8 for the rest of this process. klein-KV's FP8 cache keeps
// no bf16 copy, so after an injected kernel error the fallback dequantizes it into the room after
// the step's own keys and runs bf16 attention: the bits of bf16 attention over the same room filled
// by dequantize_attention_keys_fp8. Later calls fall back counted as disabled, and later caches are
// bf16 copies.
TEST(FastPathFallbackTest, InjectedFp8AttentionErrorDequantizesTheCachedKeys) {
  FLUX2_REQUIRE_GPU(be);
  if (!cuda::flash_attention_fp8_available()) GTEST_SKIP() << "no sm_90a FP8 attention here";
  const int64_t s = 300, r = 200, heads = 2, width = heads * 128;
  const AttentionParams params{heads, heads, 128, 1.0f / std::sqrt(128.0f)};
  Tensor q = random_bf16(*be, s, width, 21), ref_k = random_bf16(*be, r, width, 23, 2.0f),
         ref_v = random_bf16(*be, r, width, 24);
  Tensor wide = random_bf16(*be, s + r, 2 * width, 22, 2.0f), expected_wide = clone(*be, wide);
  auto room = [&](const Tensor& t, int which) { return t.col_slice(which * width, width); };
  // The expected room: the cache's E4M3 operands made the same way, dequantized after k and v.
  const cuda::Mat mk{ref_k.data(), r, width, width}, mv{ref_v.data(), r, width, width};
  Tensor k8 = be->empty(DType::kF8E4M3, {r, width}).value();
  Tensor vt8 = be->empty(DType::kF8E4M3, {width, cuda::flash_fp8_padded_keys(r)}).value();
  Tensor scales = be->empty(DType::kF32, {cuda::flash_fp8_scale_count(heads, 0, r)}).value();
  const cuda::FlashFp8Operands operands{nullptr, k8.data(), vt8.data(), scales.data_as<float>()};
  cudaStream_t stream = cuda_stream_of(*be);
  ASSERT_TRUE(cuda::quantize_attention_operands_fp8(cuda::Mat{nullptr, 0, width, width}, mk, mv,
                                                    heads, operands, stream)
                  .ok());
  auto mat_of = [](const Tensor& t) {
    return cuda::Mat{t.data(), t.rows(), t.cols(), t.row_stride()};
  };
  ASSERT_TRUE(
      cuda::dequantize_attention_keys_fp8(cuda::flash_fp8_key_segment(operands, 0, r, heads), heads,
                                          mat_of(room(expected_wide, 0).row_slice(s, r)),
                                          mat_of(room(expected_wide, 1).row_slice(s, r)), stream)
          .ok());
  Tensor expected = be->empty(DType::kBF16, {s, width}).value();
  ASSERT_TRUE(
      be->attention(q, room(expected_wide, 0), room(expected_wide, 1), params, expected).ok());

  const RequestScope high(*be, {Quality::kHigh});
  auto cache = be->cache_keys(ref_k, ref_v, params);
  ASSERT_TRUE(cache.ok()) << cache.status();
  const int64_t runtime_errors = fallbacks("flash_attention_fp8", "runtime_error");
  inject_fast_path_failure("flash_attention_fp8");
  Tensor out = be->empty(DType::kBF16, {s, width}).value();
  const Tensor k_room = room(wide, 0), v_room = room(wide, 1);
  ASSERT_TRUE(be->attention_with_cached_keys(q, k_room.row_slice(0, s), v_room.row_slice(0, s),
                                             **cache, k_room, v_room, params, out)
                  .ok())
      << "the request must complete on the fallback";
  EXPECT_TRUE(counters("flash_attention_fp8").disabled);
  EXPECT_EQ(fallbacks("flash_attention_fp8", "runtime_error"), runtime_errors + 1);
  EXPECT_EQ(bits(*be, out), bits(*be, expected));
  const int64_t disabled = fallbacks("flash_attention_fp8", "disabled_after_error");
  ASSERT_TRUE(be->attention_with_cached_keys(q, k_room.row_slice(0, s), v_room.row_slice(0, s),
                                             **cache, k_room, v_room, params, out)
                  .ok());
  EXPECT_EQ(fallbacks("flash_attention_fp8", "disabled_after_error"), disabled + 1);
  EXPECT_EQ(bits(*be, out), bits(*be, expected));
  auto later = be->cache_keys(ref_k, ref_v, params);
  ASSERT_TRUE(later.ok());
  EXPECT_EQ((*later)->device_bytes(), 2 * r * width * 2) << "a cache after disabling is bf16";
}

}  // namespace
}  // namespace flux2
