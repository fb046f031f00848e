// Our FP8 attention with more keys than queries and with klein-KV's cached keys, on the GPU: the
// operand quantizer with separate query and key counts (keys only, for the cache) and its inverse
// bit for bit against CPU references; through the backend at quality=high, attention over more keys
// and over an FP8 cache (quantized once, read as the kernel's second key segment) counted as the
// FP8 path, deterministic, within the FP8 bound of bf16 attention, and the same bits as one
// sequence where the segments split at a block; lossless and unsupported shapes as before. Skips
// without a GPU; the FP8 parts without an sm_90a build. The kernel alone:
// flash_attention_fp8_test.cc.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/base/dtype.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/base/numerics.h"
#include "kernels/cuda/attention_fp8_operands.h"
#include "kernels/cuda/flash_attention_fp8.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

// A device buffer of `bytes`, freed with the test.
struct DeviceBytes {
  explicit DeviceBytes(size_t bytes) { EXPECT_EQ(cudaMalloc(&data, bytes), cudaSuccess); }
  ~DeviceBytes() { cudaFree(data); }
  template <typename T>
  std::vector<T> get(size_t count) const {
    std::vector<T> host(count);
    EXPECT_EQ(cudaMemcpy(host.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }
  void* data = nullptr;
};

// A tensor as a launcher matrix.
cuda::Mat mat_of(const Tensor& t) {
  return cuda::Mat{t.data(), t.rows(), t.cols(), t.row_stride()};
}

#define FLUX2_REQUIRE_FP8_ATTENTION()                                                      \
  if (!cuda::flash_attention_fp8_available())                                              \
  GTEST_SKIP() << "flash_attention_fp8 needs an sm_90a build on a compute capability 9.0 " \
                  "GPU"

// max |x| over rows [first, first + 128) ∩ [0, rows) of head h's columns of a bf16 matrix.
float block_amax(const std::vector<uint16_t>& bits, int64_t stride, int64_t rows, int64_t h,
                 int64_t first) {
  uint32_t amax = 0;
  for (int64_t r = first; r < std::min(rows, first + 128); ++r) {
    for (int64_t i = 0; i < 128; ++i)
      amax = std::max(amax, abs_bits(bf16_bits_value(bits[r * stride + h * 128 + i])));
  }
  return f32_from_bits(amax);
}

// What the quantizer made for S_q query and S_kv key rows of `heads` heads, and its inputs' bits:
// q [S_q, width], k and v the two column halves of kv [S_kv, 2·width].
struct QuantizerRun {
  int64_t sq = 0, skv = 0, heads = 0, width = 0, q_tiles = 0, kv_tiles = 0, padded = 0;
  std::vector<uint16_t> q_bits, kv_bits;
  std::vector<uint8_t> q8, k8, vt;
  std::vector<float> scales;
};

// Differences from the CPU recipe (counted; scales checked as they go) for head h: Q's blocks and
// K's counted from their own first rows, the scales [Q: H x tiles(S_q)][K][V: H x tiles(S_kv)].
int64_t mismatches_of_head(const QuantizerRun& g, int64_t h) {
  int64_t mismatches = 0;
  for (int64_t tile = 0; tile < g.q_tiles; ++tile) {
    const float scale = fp8_dequant_scale(block_amax(g.q_bits, g.width, g.sq, h, tile * 128));
    EXPECT_EQ(f32_bits(g.scales[h * g.q_tiles + tile]), f32_bits(scale)) << "q block " << tile;
    for (int64_t r = tile * 128; r < std::min(g.sq, (tile + 1) * 128); ++r) {
      for (int64_t i = h * 128; i < (h + 1) * 128; ++i)
        mismatches += g.q8[r * g.width + i] !=
                      fp8_quantize_value(bf16_bits_value(g.q_bits[r * g.width + i]), scale);
    }
  }
  const int64_t k_scales = g.heads * g.q_tiles, v_scales = g.heads * (g.q_tiles + g.kv_tiles);
  for (int64_t tile = 0; tile < g.kv_tiles; ++tile) {
    const float k_scale =
        fp8_dequant_scale(block_amax(g.kv_bits, 2 * g.width, g.skv, h, tile * 128));
    const float v_scale = cuda::flash_fp8_value_scale(
        block_amax(g.kv_bits, 2 * g.width, g.skv, h + g.heads, tile * 128));
    EXPECT_EQ(f32_bits(g.scales[k_scales + h * g.kv_tiles + tile]), f32_bits(k_scale))
        << "k block " << tile;
    EXPECT_EQ(f32_bits(g.scales[v_scales + h * g.kv_tiles + tile]), f32_bits(v_scale))
        << "v block " << tile;
    for (int64_t row = tile * 128; row < (tile + 1) * 128; ++row) {  // row: also V's position
      const int64_t key = cuda::flash_fp8_key_at(row);
      for (int64_t i = h * 128; i < (h + 1) * 128; ++i) {
        const int64_t at = row * 2 * g.width + i;
        if (row < g.skv) {
          mismatches += g.k8[row * g.width + i] !=
                        fp8_quantize_value(bf16_bits_value(g.kv_bits[at]), k_scale);
        }
        const int64_t v_at = key * 2 * g.width + g.width + i;
        const uint8_t want =
            key < g.skv ? fp8_quantize_value(bf16_bits_value(g.kv_bits[v_at]), v_scale) : 0;
        mismatches += g.vt[i * g.padded + row] != want;
      }
    }
  }
  return mismatches;
}

// The quantizer with S_q != S_kv (and S_q = 0: the keys alone, as klein-KV's cache) against the
// CPU, bit for bit (mismatches_of_head).
TEST(FlashAttentionFp8KeysTest, QuantizerWithOtherKeyCountsEqualsCpuBitForBit) {
  FLUX2_REQUIRE_GPU(be);
  struct Shape {
    int64_t q_tokens, kv_tokens, heads;
  };
  for (const Shape c : {Shape{300, 1000, 3}, Shape{0, 300, 2}, Shape{1000, 77, 2}}) {
    SCOPED_TRACE(::testing::Message() << c.q_tokens << " q x " << c.kv_tokens << " kv rows");
    const int64_t width = c.heads * 128, sq = c.q_tokens, skv = c.kv_tokens;
    QuantizerRun g;
    g.sq = sq, g.skv = skv, g.heads = c.heads, g.width = width;
    g.q_tiles = cuda::flash_fp8_tiles(sq), g.kv_tiles = cuda::flash_fp8_tiles(skv);
    g.padded = cuda::flash_fp8_padded_keys(skv);
    Tensor q = testing::random_bf16(*be, std::max<int64_t>(sq, 1), width, 61, 3.0f);
    Tensor kv = testing::random_bf16(*be, skv, 2 * width, 62, 3.0f);
    g.q_bits = testing::bits(*be, q);
    g.kv_bits = testing::bits(*be, kv);
    const int64_t scale_count = cuda::flash_fp8_scale_count(c.heads, sq, skv);
    ASSERT_EQ(scale_count, c.heads * (g.q_tiles + 2 * g.kv_tiles));
    DeviceBytes q8(std::max<int64_t>(sq, 1) * width), k8(skv * width), vt(width * g.padded),
        scales(scale_count * sizeof(float));
    const cuda::FlashFp8Operands operands{q8.data, k8.data, vt.data,
                                          static_cast<float*>(scales.data)};
    const cuda::Mat k_mat{kv.data(), skv, width, 2 * width};
    const cuda::Mat v_mat{static_cast<char*>(kv.data()) + width * 2, skv, width, 2 * width};
    ASSERT_TRUE(cuda::quantize_attention_operands_fp8(cuda::Mat{q.data(), sq, width, width}, k_mat,
                                                      v_mat, c.heads, operands, nullptr)
                    .ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    g.q8 = q8.get<uint8_t>(sq * width);
    g.k8 = k8.get<uint8_t>(skv * width);
    g.vt = vt.get<uint8_t>(width * g.padded);
    g.scales = scales.get<float>(scale_count);
    int64_t mismatches = 0;
    for (int64_t h = 0; h < c.heads; ++h) mismatches += mismatches_of_head(g, h);
    EXPECT_EQ(mismatches, 0);
  }
}

// dequantize_attention_keys_fp8 (the FP8 cache's fallback) against the CPU: every element
// bf16(e4m3(code) · its block's scale), K in key order, V from its permuted transposed layout,
// written into strided rows (the room after a call's own keys).
TEST(FlashAttentionFp8KeysTest, DequantizedCacheEqualsCpuBitForBit) {
  FLUX2_REQUIRE_GPU(be);
  const int64_t r = 300, heads = 2, width = heads * 128, padded = cuda::flash_fp8_padded_keys(r);
  Tensor kv = testing::random_bf16(*be, r, 2 * width, 71, 2.0f);
  const int64_t scale_count = cuda::flash_fp8_scale_count(heads, 0, r);
  DeviceBytes k8(r * width), vt(width * padded), scales(scale_count * sizeof(float));
  const cuda::FlashFp8Operands operands{nullptr, k8.data, vt.data,
                                        static_cast<float*>(scales.data)};
  ASSERT_TRUE(cuda::quantize_attention_operands_fp8(
                  cuda::Mat{nullptr, 0, width, width}, cuda::Mat{kv.data(), r, width, 2 * width},
                  cuda::Mat{static_cast<char*>(kv.data()) + width * 2, r, width, 2 * width}, heads,
                  operands, nullptr)
                  .ok());
  Tensor room = be->empty(DType::kBF16, {r + 5, 3 * width}).value();  // k | v | other columns
  const Tensor k_out = room.row_slice(5, r).col_slice(0, width);
  const Tensor v_out = room.row_slice(5, r).col_slice(width, width);
  const cuda::FlashFp8KeySegment segment = cuda::flash_fp8_key_segment(operands, 0, r, heads);
  ASSERT_TRUE(
      cuda::dequantize_attention_keys_fp8(segment, heads, mat_of(k_out), mat_of(v_out), nullptr)
          .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto codes_k = k8.get<uint8_t>(r * width), codes_vt = vt.get<uint8_t>(width * padded);
  const auto s = scales.get<float>(scale_count);
  const std::vector<uint16_t> got_k = testing::bits(*be, k_out), got_v = testing::bits(*be, v_out);
  int64_t mismatches = 0;
  for (int64_t key = 0; key < r; ++key) {
    for (int64_t c = 0; c < width; ++c) {
      const int64_t block = (c / 128) * cuda::flash_fp8_tiles(r) + key / 128;
      const float k_value = e4m3_to_f32(codes_k[key * width + c]) * s[block];
      const float v_value = e4m3_to_f32(codes_vt[c * padded + cuda::flash_fp8_position_of(key)]) *
                            s[heads * cuda::flash_fp8_tiles(r) + block];
      mismatches += got_k[key * width + c] != f32_to_bf16_bits(k_value);
      mismatches += got_v[key * width + c] != f32_to_bf16_bits(v_value);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// The launchers refuse, naming the field, what they cannot serve: the fused QK-norm with other key
// than query counts, no keys, a second segment without its Vᵀ, a dequantization target of the
// wrong shape. Nothing is launched.
TEST(FlashAttentionFp8KeysTest, LaunchersRefuseNamingWhatDoesNotFit) {
  FLUX2_REQUIRE_GPU(be);
  const int64_t heads = 2, width = 256;
  DeviceBytes bytes(1 << 20), weight(256);
  char* base = static_cast<char*>(bytes.data);
  const cuda::FlashFp8Operands operands{base, base, base, reinterpret_cast<float*>(base)};
  const cuda::Mat q{base, 300, width, width}, k{base, 400, width, width};
  cuda::FlashFp8QkNorm norm{{weight.data, weight.data},     {weight.data, weight.data},    0, 1e-6f,
                            cuda::Mat{base, 300, 128, 128}, cuda::Mat{base, 300, 128, 128}};
  absl::Status status =
      cuda::quantize_attention_operands_fp8(q, k, k, heads, operands, nullptr, &norm);
  EXPECT_NE(status.message().find("the fused QK-norm needs as many q as k rows, got 300 and 400"),
            std::string::npos)
      << status;
  status = cuda::quantize_attention_operands_fp8(q, cuda::Mat{base, 0, width, width},
                                                 cuda::Mat{base, 0, width, width}, heads, operands,
                                                 nullptr);
  EXPECT_NE(status.message().find("300 q and 0 k rows out of range"), std::string::npos) << status;
  const cuda::FlashFp8KeySegment segment = cuda::flash_fp8_key_segment(operands, 0, 400, heads);
  status = cuda::dequantize_attention_keys_fp8(segment, heads, cuda::Mat{base, 399, width, width},
                                               cuda::Mat{base, 400, width, width}, nullptr);
  EXPECT_NE(status.message().find("k_out must be bf16 [400, 256]"), std::string::npos) << status;
  FLUX2_REQUIRE_FP8_ATTENTION();
  cuda::FlashFp8Args args = cuda::flash_fp8_args(operands, 300, 400, heads);
  args.out = cuda::Mat{base, 300, width, width};
  args.keys[1] = segment;
  args.keys[1].vt = nullptr;
  status = cuda::flash_attention_fp8(args, nullptr);
  EXPECT_NE(status.message().find("keys[1].vt must be a 16-byte aligned buffer"), std::string::npos)
      << status;
  args.keys[0].k.rows = 0;
  status = cuda::flash_attention_fp8(args, nullptr);
  EXPECT_NE(status.message().find("300 queries, 0 + 400 keys"), std::string::npos) << status;
}

// Inputs of a klein-KV cached step through the backend: q [S_q, w]; the step's own k and v [S, w]
// as the first rows of rooms [S + R, w] (column slices of one buffer, as the workspace's); the
// cached reference keys and values [R, w]; and the concatenations [S + R, w] for comparisons.
struct CachedStep {
  Tensor q, k, v, k_room, v_room, ref_k, ref_v, all_k, all_v;
};
CachedStep cached_step(Backend& be, int64_t s_q, int64_t s, int64_t r, int64_t width,
                       uint64_t seed) {
  CachedStep c;
  c.q = testing::random_bf16(be, s_q, width, seed, 2.0f);
  const Tensor wide = testing::random_bf16(be, s + r, 3 * width, seed + 1, 2.0f);
  c.k_room = wide.col_slice(width, width);
  c.v_room = wide.col_slice(2 * width, width);
  c.k = c.k_room.row_slice(0, s);
  c.v = c.v_room.row_slice(0, s);
  c.ref_k = testing::random_bf16(be, r, width, seed + 2, 2.0f);
  c.ref_v = testing::random_bf16(be, r, width, seed + 3, 1.0f);
  c.all_k = be.empty(DType::kBF16, {s + r, width}).value();
  c.all_v = be.empty(DType::kBF16, {s + r, width}).value();
  EXPECT_TRUE(be.copy(c.k, c.all_k.row_slice(0, s)).ok());
  EXPECT_TRUE(be.copy(c.ref_k, c.all_k.row_slice(s, r)).ok());
  EXPECT_TRUE(be.copy(c.v, c.all_v.row_slice(0, s)).ok());
  EXPECT_TRUE(be.copy(c.ref_v, c.all_v.row_slice(s, r)).ok());
  return c;
}

int64_t fp8_invocations() {
  return testing::fast_path_counters("flash_attention_fp8").invocations;
}

// The FP8 bound against bf16 attention, relative L2 over the output (flash_attention_fp8_test.cc's
// backend test): Q, K, V and P rounded to E4M3, each at most 2^-4 relative; V's and P's reach the
// output through the convex sum over keys, Q's and K's through the logits; the four in quadrature
// at their worst give 2 x 2^-4, whatever the number of keys or segments.
constexpr double kFp8AgainstBf16 = 0.125;

// quality=high attention with more keys than queries (klein-KV's extract step, one sequence) runs
// our kernel: counted, the same bits on every call, within the FP8 bound of bf16 attention.
TEST(FlashAttentionFp8KeysTest, MoreKeysThanQueriesRunsFp8WithinBound) {
  FLUX2_REQUIRE_GPU(be);
  FLUX2_REQUIRE_FP8_ATTENTION();
  const int64_t s_q = 1000, s_k = 1300, heads = 8, width = heads * 128;
  const Tensor q = testing::random_bf16(*be, s_q, width, 81, 2.0f);
  const Tensor k = testing::random_bf16(*be, s_k, width, 82, 2.0f);
  const Tensor v = testing::random_bf16(*be, s_k, width, 83, 1.0f);
  const AttentionParams params{heads, heads, 128, 1.0f / std::sqrt(128.0f)};
  Tensor lossless = be->empty(DType::kBF16, {s_q, width}).value();
  Tensor high = be->empty(DType::kBF16, {s_q, width}).value();
  Tensor again = be->empty(DType::kBF16, {s_q, width}).value();
  ASSERT_TRUE(be->attention(q, k, v, params, lossless).ok());
  const int64_t before = fp8_invocations();
  {
    const RequestScope quality(*be, {Quality::kHigh});
    ASSERT_TRUE(be->attention(q, k, v, params, high).ok());
    ASSERT_TRUE(be->attention(q, k, v, params, again).ok());
  }
  EXPECT_EQ(fp8_invocations(), before + 2) << "the FP8 attention did not serve S_k > S_q";
  EXPECT_EQ(testing::bits(*be, high), testing::bits(*be, again)) << "two identical calls differ";
  const double error =
      relative_l2_error(testing::values(*be, high), testing::values(*be, lossless));
  std::printf("FP8 attention %lld x %lld keys vs bf16: relative L2 %.4e (bound %.3f)\n",
              static_cast<long long>(s_q), static_cast<long long>(s_k), error, kFp8AgainstBf16);
  EXPECT_GT(error, 0.0);
  EXPECT_LE(error, kFp8AgainstBf16);
}

// klein-KV's cache at quality=high: cache_keys quantizes the reference keys and values once (the
// FP8 operands, no bf16 copy); attention_with_cached_keys reads them as the second key segment:
// counted as the FP8 path, deterministic, within the FP8 bound of bf16 attention over the
// concatenation; with the step's own keys a multiple of 128 (the segments split at a block) the
// bits of FP8 attention over the concatenation as one sequence. The room is not written.
TEST(FlashAttentionFp8KeysTest, Fp8CacheIsASecondKeySegment) {
  FLUX2_REQUIRE_GPU(be);
  FLUX2_REQUIRE_FP8_ATTENTION();
  const int64_t heads = 4, width = heads * 128, r = 700;
  const AttentionParams params{heads, heads, 128, 1.0f / std::sqrt(128.0f)};
  for (const int64_t s : {int64_t{300}, int64_t{512}}) {
    SCOPED_TRACE(::testing::Message() << s << " own keys + " << r << " cached");
    const CachedStep c = cached_step(*be, s, s, r, width, 90 + s);
    const std::vector<uint16_t> room_before = testing::bits(*be, c.k_room.row_slice(s, r));
    Tensor lossless = be->empty(DType::kBF16, {s, width}).value();
    ASSERT_TRUE(be->attention(c.q, c.all_k, c.all_v, params, lossless).ok());
    const RequestScope quality(*be, {Quality::kHigh});
    auto cache = be->cache_keys(c.ref_k, c.ref_v, params);
    ASSERT_TRUE(cache.ok()) << cache.status();
    const int64_t tiles = cuda::flash_fp8_tiles(r);
    EXPECT_EQ((*cache)->device_bytes(),
              r * width + width * cuda::flash_fp8_padded_keys(r) + 2 * heads * tiles * 4)
        << "not the FP8 cache";
    // The cache is a copy: the references may change after.
    ASSERT_TRUE(be->copy(testing::random_bf16(*be, r, width, 5), c.ref_k).ok());
    Tensor out[2] = {be->empty(DType::kBF16, {s, width}).value(),
                     be->empty(DType::kBF16, {s, width}).value()};
    const int64_t before = fp8_invocations();
    for (const Tensor& o : out) {
      ASSERT_TRUE(
          be->attention_with_cached_keys(c.q, c.k, c.v, **cache, c.k_room, c.v_room, params, o)
              .ok());
    }
    EXPECT_EQ(fp8_invocations(), before + 2);
    EXPECT_EQ(testing::bits(*be, out[0]), testing::bits(*be, out[1])) << "two calls differ";
    EXPECT_EQ(testing::bits(*be, c.k_room.row_slice(s, r)), room_before) << "the room was written";
    const double error =
        relative_l2_error(testing::values(*be, out[0]), testing::values(*be, lossless));
    std::printf("FP8 cached keys, %lld + %lld keys vs bf16: relative L2 %.4e (bound %.3f)\n",
                static_cast<long long>(s), static_cast<long long>(r), error, kFp8AgainstBf16);
    EXPECT_GT(error, 0.0);
    EXPECT_LE(error, kFp8AgainstBf16);
    if (s % 128 == 0) {
      // c.ref_k was overwritten above: the concatenation still holds the cached values.
      Tensor joined = be->empty(DType::kBF16, {s, width}).value();
      ASSERT_TRUE(be->attention(c.q, c.all_k, c.all_v, params, joined).ok());
      EXPECT_EQ(testing::bits(*be, out[0]), testing::bits(*be, joined));
    }
  }
}

// At lossless the cache is bf16 copies, copied after the step's own keys: the bits of attention
// over the concatenation, through cuDNN. A head size the FP8 kernel does not serve keeps a bf16
// cache at quality=high too, and its attention counts the FP8 path's unsupported_shape fallback.
TEST(FlashAttentionFp8KeysTest, LosslessAndUnsupportedShapesKeepBf16Caches) {
  FLUX2_REQUIRE_GPU(be);
  const int64_t s = 300, r = 400;
  auto bf16_cache_bytes = [&](int64_t width) { return 2 * r * width * 2; };
  {
    const int64_t heads = 4, width = heads * 128;
    const AttentionParams params{heads, heads, 128, 1.0f / std::sqrt(128.0f)};
    const CachedStep c = cached_step(*be, s, s, r, width, 101);
    auto cache = be->cache_keys(c.ref_k, c.ref_v, params);
    ASSERT_TRUE(cache.ok()) << cache.status();
    EXPECT_EQ((*cache)->device_bytes(), bf16_cache_bytes(width));
    Tensor want = be->empty(DType::kBF16, {s, width}).value();
    Tensor got = be->empty(DType::kBF16, {s, width}).value();
    ASSERT_TRUE(be->attention(c.q, c.all_k, c.all_v, params, want).ok());
    const int64_t cudnn = testing::fast_path_counters("cudnn_attention").invocations;
    ASSERT_TRUE(
        be->attention_with_cached_keys(c.q, c.k, c.v, **cache, c.k_room, c.v_room, params, got)
            .ok());
    EXPECT_EQ(testing::fast_path_counters("cudnn_attention").invocations, cudnn + 1);
    EXPECT_EQ(testing::bits(*be, got), testing::bits(*be, want));
  }
  if (!cuda::flash_attention_fp8_available()) return;
  const int64_t heads = 8, width = heads * 64;  // head_dim 64: not the FP8 kernel's
  const AttentionParams params{heads, heads, 64, 0.125f};
  const CachedStep c = cached_step(*be, s, s, r, width, 111);
  const RequestScope quality(*be, {Quality::kHigh});
  auto cache = be->cache_keys(c.ref_k, c.ref_v, params);
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ((*cache)->device_bytes(), bf16_cache_bytes(width));
  const int64_t unsupported =
      testing::fast_path_fallbacks("flash_attention_fp8", "unsupported_shape");
  Tensor out = be->empty(DType::kBF16, {s, width}).value();
  ASSERT_TRUE(
      be->attention_with_cached_keys(c.q, c.k, c.v, **cache, c.k_room, c.v_room, params, out).ok());
  EXPECT_EQ(testing::fast_path_fallbacks("flash_attention_fp8", "unsupported_shape"),
            unsupported + 1);
}

}  // namespace
}  // namespace flux2
