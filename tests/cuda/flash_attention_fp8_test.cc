// Our FP8 flash attention (kernels/cuda/flash_attention_fp8.cu) against a float64 reference of the
// same E4M3 operands, within a per-element bound derived from the roundings the kernel makes, and
// bit-identical on repeated calls (sampled query rows), at self-attention shapes, with more (and
// fewer) keys than queries and with two key segments; its operand quantizer bit for bit against a
// CPU reference. Skips without a GPU or an sm_90a build. Cached keys through the backend:
// flash_attention_fp8_keys_test.cc.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/base/numerics.h"
#include "kernels/cuda/attention_fp8_operands.h"
#include "kernels/cuda/flash_attention_fp8.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

struct DeviceBytes {
  explicit DeviceBytes(size_t bytes) { EXPECT_EQ(cudaMalloc(&data, bytes), cudaSuccess); }
  ~DeviceBytes() { cudaFree(data); }
  void* data = nullptr;
};

struct Case {
  const char* name;
  int64_t tokens, heads;
};

// E4M3 codes of N(0, sigma) values under the dequantization scale `scale`.
std::vector<uint8_t> random_e4m3(size_t count, float sigma, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<uint8_t> codes(count);
  for (uint8_t& c : codes) c = fp8_quantize_value(normal(rng), scale);
  return codes;
}

// Device copies of host arrays, freed together.
class Uploads {
 public:
  template <typename T>
  void* put(const std::vector<T>& host) {
    buffers_.push_back(std::make_unique<DeviceBytes>(host.size() * sizeof(T)));
    void* data = buffers_.back()->data;
    EXPECT_EQ(cudaMemcpy(data, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
    return data;
  }

 private:
  std::vector<std::unique_ptr<DeviceBytes>> buffers_;
};

// One key segment's E4M3 operands on the host as the operand quantizer lays them out: K and V
// [n, width] (V's codes for the reference), Vᵀ with the keys permuted (flash_fp8_key_at) and zero
// padding, scales per head and block of 128 keys counted from the segment's first key (varied per
// block as the quantizer makes them; V's powers of two, 2^-7 .. 2^-5).
struct HostSegment {
  int64_t keys = 0, tiles = 0, padded = 0;
  std::vector<uint8_t> k, v, vt;
  std::vector<float> k_scales, v_scales;  // [H][tiles]
};
HostSegment host_segment(int64_t keys, int64_t heads, uint32_t seed) {
  const int64_t width = heads * 128;
  HostSegment seg;
  seg.keys = keys;
  seg.tiles = cuda::flash_fp8_tiles(keys);
  seg.padded = cuda::flash_fp8_padded_keys(keys);
  seg.k = random_e4m3(keys * width, 1.0f, 4.0f / 448, seed);
  seg.v = random_e4m3(keys * width, 0.7f, 3.0f / 448, seed + 1);
  seg.vt.assign(static_cast<size_t>(width * seg.padded), 0);
  for (int64_t ch = 0; ch < width; ++ch) {
    for (int64_t position = 0; position < seg.padded; ++position) {
      const int64_t key = cuda::flash_fp8_key_at(position);
      if (key < keys) seg.vt[ch * seg.padded + position] = seg.v[key * width + ch];
    }
  }
  for (int64_t i = 0; i < heads * seg.tiles; ++i) {
    seg.k_scales.push_back((3.0f + static_cast<float>((i + seed) % 5)) / 448);
    seg.v_scales.push_back(std::ldexp(1.0f, -7 + static_cast<int>((i + seed) % 3)));
  }
  return seg;
}

// The kernel's view of a segment uploaded to the device.
cuda::FlashFp8KeySegment upload_segment(const HostSegment& seg, int64_t width, Uploads& uploads) {
  cuda::FlashFp8KeySegment view;
  view.k = cuda::Mat{uploads.put(seg.k), seg.keys, width, width};
  view.vt = uploads.put(seg.vt);
  view.scale_k = static_cast<const float*>(uploads.put(seg.k_scales));
  view.scale_v = static_cast<const float*>(uploads.put(seg.v_scales));
  return view;
}

// Queries over keys in one or two segments (keys[1] 0: one).
struct KernelCase {
  const char* name;
  int64_t queries, keys[2], heads;
};

// The kernel's bf16 output bits for Q codes `q` (scales `q_scales`, [H][tiles(S_q)]) over `keys`.
std::vector<uint16_t> run_kernel(const std::vector<uint8_t>& q, const std::vector<float>& q_scales,
                                 int64_t s_q, int64_t heads,
                                 const std::vector<const HostSegment*>& keys) {
  const int64_t width = heads * 128;
  Uploads uploads;
  cuda::FlashFp8Args args;
  args.q = cuda::Mat{uploads.put(q), s_q, width, width};
  args.scale_q = static_cast<const float*>(uploads.put(q_scales));
  for (size_t i = 0; i < keys.size(); ++i) args.keys[i] = upload_segment(*keys[i], width, uploads);
  args.heads = heads;
  args.softmax_scale = 1.0f / std::sqrt(128.0f);
  DeviceBytes out_dev(static_cast<size_t>(s_q * width * 2));
  args.out = cuda::Mat{out_dev.data, s_q, width, width};
  const absl::Status status = cuda::flash_attention_fp8(args, nullptr);
  EXPECT_TRUE(status.ok()) << status;
  std::vector<uint16_t> out(static_cast<size_t>(s_q * width));
  EXPECT_EQ(cudaMemcpy(out.data(), out_dev.data, out.size() * 2, cudaMemcpyDeviceToHost),
            cudaSuccess);
  return out;
}

// The whole key sequence of a case: segment 0's keys, then segment 1's.
struct KeySequence {
  const HostSegment* seg[2];
  int64_t count() const { return seg[0]->keys + seg[1]->keys; }
  // Key `key`: its segment, its row there, and that row's scale (block) index for head h.
  struct Key {
    const HostSegment* seg;
    int64_t row, scale;
  };
  Key at(int64_t key, int64_t h) const {
    const HostSegment* in = key < seg[0]->keys ? seg[0] : seg[1];
    const int64_t row = key - (in == seg[0] ? 0 : seg[0]->keys);
    return Key{in, row, h * in->tiles + row / 128};
  }
};

// Float64 logits of query `row`, head h, over every key (the kernel's softmax scale).
std::vector<double> reference_logits(const std::vector<uint8_t>& q, double q_scale,
                                     const KeySequence& keys, int64_t width, int64_t h,
                                     int64_t row) {
  const float softmax_scale = 1.0f / std::sqrt(128.0f);  // run_kernel's
  std::vector<double> logits(static_cast<size_t>(keys.count()));
  for (int64_t key = 0; key < keys.count(); ++key) {
    const KeySequence::Key at = keys.at(key, h);
    double dot = 0.0;
    for (int64_t i = 0; i < 128; ++i) {
      dot += static_cast<double>(e4m3_to_f32(q[row * width + h * 128 + i])) * q_scale *
             e4m3_to_f32(at.seg->k[at.row * width + h * 128 + i]) * at.seg->k_scales[at.scale];
    }
    logits[key] = dot * softmax_scale;
  }
  return logits;
}

// Errors against the reference over the checked rows: sums for the relative L2 and the largest
// error / bound.
struct ErrorStats {
  double err2 = 0.0, ref2 = 0.0, worst = 0.0;
};

// Checks head h of query `row` of the kernel's output against the float64 reference within the
// derived bound (the test below), `relative` its relative term; "" or the first element outside.
std::string check_row(const std::vector<uint16_t>& out, const std::vector<double>& logits,
                      const KeySequence& keys, int64_t width, int64_t h, int64_t row,
                      double relative, ErrorStats& stats) {
  double max_logit = -INFINITY, total = 0.0, max_v_scale = 0.0;
  for (int64_t key = 0; key < keys.count(); ++key) {
    const KeySequence::Key at = keys.at(key, h);
    max_logit = std::max(max_logit, logits[key]);
    max_v_scale = std::max<double>(max_v_scale, at.seg->v_scales[at.scale]);
  }
  for (int64_t key = 0; key < keys.count(); ++key) total += std::exp(logits[key] - max_logit);
  for (int64_t i = 0; i < 128; ++i) {
    double ref = 0.0, weighted_abs = 0.0, plain_abs = 0.0;
    for (int64_t key = 0; key < keys.count(); ++key) {
      const KeySequence::Key at = keys.at(key, h);
      const double stored = e4m3_to_f32(at.seg->v[at.row * width + h * 128 + i]);
      const double value = stored * at.seg->v_scales[at.scale];
      const double p = std::exp(logits[key] - max_logit);
      ref += p * value;
      weighted_abs += p * std::fabs(value);
      plain_abs += std::fabs(stored) * max_v_scale;
    }
    ref /= total;
    const double bound = relative * weighted_abs / total + std::ldexp(plain_abs, -18) / total +
                         std::ldexp(std::fabs(ref), -8);
    const double got = bf16_bits_value(out[row * width + h * 128 + i]);
    const double err = std::fabs(got - ref);
    stats.worst = std::max(stats.worst, err / bound);
    stats.err2 += err * err;
    stats.ref2 += ref * ref;
    if (!(err <= bound)) {  // NaN included
      return absl::StrCat("row ", row, " head ", h, " dim ", i, ": ", got, " vs ", ref, " (bound ",
                          bound, ")");
    }
  }
  return "";
}

class FlashAttentionFp8Test : public ::testing::TestWithParam<KernelCase> {};

// The bound, per output element o_d of a row with probabilities p_i = exp(s_i - max) / L:
// - P is stored as E4M3 of 256·exp(s_i - max) · sv_i / sv_max (V's per-block scale sv_i rides in
//   the exponent, the max taken with it): relative error <= 2^-4 (3 mantissa bits, RNE) for normal
//   values, absolute <= 2^-10 in the subnormal range (below 2^-6); per unit of the stored value
//   v_i / sv_i that is at most 2^-18 · sv_max in units of exp(s_i - max) <= 1;
// - the tensor cores add each 32-key product into the fp32 accumulator keeping ~14 bits (the FP8
//   "fast accumulation" of Hopper; measured in fp8_accumulation_test): <= 2^-13 of the running sum
//   per step, at most (keys / 32) steps, each bounded by sum_i p_i |v_id|; keys counts every
//   tile's 128, the padding of a partial tile in each segment included (8704 keys: 272 steps,
//   0.033, against 0.018 at 4608);
// - the output is rounded to bf16: 2^-8 |o_d| (half an ulp with 8 significant bits).
// So |o_d - ref_d| <= (2^-4 + steps 2^-13) sum_i p_i |v_id| + 2^-18 sv_max sum_i |v_id / sv_i| / L
// + 2^-8 |ref_d|. The logits, the max and the sums are fp32 (2^-24) with ex2.approx (2^-22): a
// 2^-16 slack on the same sum covers them for logits up to |s| ~ 2^6. Segments change none of it:
// each key carries its own block's scales, and the softmax runs over all keys as one sequence.
TEST_P(FlashAttentionFp8Test, WithinRoundingBoundOfFloat64AndDeterministic) {
  FLUX2_REQUIRE_GPU(be);
  if (!cuda::flash_attention_fp8_available()) {
    GTEST_SKIP() << "flash_attention_fp8 needs an sm_90a build on a compute capability 9.0 GPU";
  }
  const KernelCase c = GetParam();
  const int64_t width = c.heads * 128, s_q = c.queries, q_tiles = cuda::flash_fp8_tiles(s_q);
  // Q and K as after RMSNorm (unit scale, |x| up to ~4), V zero-mean: logits with a standard
  // deviation of about 1 after the 1/sqrt(d) softmax scale, and V where cancellation is largest.
  const std::vector<uint8_t> q = random_e4m3(s_q * width, 1.0f, 4.0f / 448, 1);
  std::vector<float> q_scales;
  for (int64_t i = 0; i < c.heads * q_tiles; ++i)
    q_scales.push_back((3.0f + static_cast<float>(i % 5)) / 448);
  const HostSegment seg[2] = {host_segment(c.keys[0], c.heads, 2),
                              host_segment(c.keys[1], c.heads, 7)};
  std::vector<const HostSegment*> segments = {&seg[0]};
  if (c.keys[1] > 0) segments.push_back(&seg[1]);
  const std::vector<uint16_t> out = run_kernel(q, q_scales, s_q, c.heads, segments);
  EXPECT_EQ(run_kernel(q, q_scales, s_q, c.heads, segments), out) << "two identical calls differ";
  // Float64 reference on sampled rows: the first and last rows and random ones, every head.
  const KeySequence keys{{&seg[0], &seg[1]}};
  std::vector<int64_t> rows = {0, s_q - 1};
  std::mt19937 rng(7);
  for (int i = 0; i < 14; ++i) rows.push_back(static_cast<int64_t>(rng() % s_q));
  const double steps = static_cast<double>((seg[0].padded + seg[1].padded) / 32);
  const double relative = std::ldexp(1.0, -4) + steps * std::ldexp(1.0, -13) + std::ldexp(1.0, -16);
  ErrorStats stats;
  for (int64_t h = 0; h < c.heads; ++h) {
    for (int64_t row : rows) {
      const std::vector<double> logits =
          reference_logits(q, q_scales[h * q_tiles + row / 128], keys, width, h, row);
      const std::string failure = check_row(out, logits, keys, width, h, row, relative, stats);
      if (!failure.empty()) {
        ADD_FAILURE() << c.name << ": " << failure;
        return;
      }
    }
  }
  std::printf("%s: relative L2 vs float64 %.3e, worst error / bound %.3f\n", c.name,
              std::sqrt(stats.err2 / stats.ref2), stats.worst);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashAttentionFp8Test,
    ::testing::Values(
        // Self-attention: klein-4B at 1024² (4096 image + 512 text tokens), a partial query block
        // and a masked key tile, a single mostly masked tile, dev's 48 heads.
        KernelCase{"klein_1024", 4608, {4608, 0}, 24}, KernelCase{"ragged_300", 300, {300, 0}, 3},
        KernelCase{"short_77", 77, {77, 0}, 2}, KernelCase{"dev_heads_1536", 1536, {1536, 0}, 48},
        // More keys than queries in one segment (klein-KV's extract step: the text and image rows
        // over every key): ragged on both sides, and klein-9B-KV at 1024² with one 1024² reference.
        KernelCase{"keys_300x1000", 300, {1000, 0}, 2},
        KernelCase{"klein_kv_4608x8704", 4608, {8704, 0}, 32},
        // Fewer keys than queries (nothing in FLUX.2 needs it; the kernel serves it).
        KernelCase{"keys_300x77", 300, {77, 0}, 2},
        // Two segments (klein-KV's cached steps: own keys, then the cached references'): partial
        // tiles at the end of each; klein-9B-KV's cached step (4608 + 4096).
        KernelCase{"segments_300+1000", 300, {300, 1000}, 2},
        KernelCase{"segments_77+200", 77, {77, 200}, 3},
        KernelCase{"klein_kv_cached_4608+4096", 4608, {4608, 4096}, 32}),
    [](const ::testing::TestParamInfo<KernelCase>& info) {
      std::string name = info.param.name;
      std::replace(name.begin(), name.end(), '+', '_');
      return name;
    });

// Keys split into two segments at a block boundary are the same key sequence, block for block:
// the same bits as one segment holding both (every scale and code in the same place).
TEST(FlashAttentionFp8SegmentsTest, SplitAtABlockEqualsOneSegmentBitForBit) {
  FLUX2_REQUIRE_GPU(be);
  if (!cuda::flash_attention_fp8_available()) {
    GTEST_SKIP() << "flash_attention_fp8 needs an sm_90a build on a compute capability 9.0 GPU";
  }
  const int64_t heads = 3, width = heads * 128, s_q = 200;
  const HostSegment first = host_segment(256, heads, 3), second = host_segment(300, heads, 5);
  // The two as one segment of 556 keys: codes appended, Vᵀ rebuilt, scales per head in order.
  HostSegment joined = host_segment(556, heads, 9);
  joined.k = first.k;
  joined.k.insert(joined.k.end(), second.k.begin(), second.k.end());
  joined.v = first.v;
  joined.v.insert(joined.v.end(), second.v.begin(), second.v.end());
  for (int64_t ch = 0; ch < width; ++ch) {
    for (int64_t position = 0; position < joined.padded; ++position) {
      const int64_t key = cuda::flash_fp8_key_at(position);
      joined.vt[ch * joined.padded + position] = key < 556 ? joined.v[key * width + ch] : 0;
    }
  }
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < joined.tiles; ++t) {
      const bool in_first = t < first.tiles;
      const HostSegment& from = in_first ? first : second;
      const int64_t i = h * from.tiles + (in_first ? t : t - first.tiles);
      joined.k_scales[h * joined.tiles + t] = from.k_scales[i];
      joined.v_scales[h * joined.tiles + t] = from.v_scales[i];
    }
  }
  const std::vector<uint8_t> q = random_e4m3(s_q * width, 1.0f, 4.0f / 448, 11);
  const std::vector<float> q_scales(static_cast<size_t>(heads * cuda::flash_fp8_tiles(s_q)),
                                    5.0f / 448);
  EXPECT_EQ(run_kernel(q, q_scales, s_q, heads, {&first, &second}),
            run_kernel(q, q_scales, s_q, heads, {&joined}));
}

// The operand quantizer (attention_fp8_operands.cu) against the CPU: per head and block of 128
// tokens (V's scales powers of two), V transposed with the keys permuted and zero padding.
TEST(FlashAttentionFp8OperandsTest, EqualCpuReferenceBitForBit) {
  FLUX2_REQUIRE_GPU(be);
  for (const Case c : {Case{"ragged_300", 300, 3}, Case{"klein_1024", 4608, 24}}) {
    const int64_t width = c.heads * 128, s = c.tokens, tiles = cuda::flash_fp8_tiles(s);
    const int64_t padded = cuda::flash_fp8_padded_keys(s);
    // q, k, v adjacent column ranges of one [S, 3·width] buffer (the model's layout, strided rows).
    Tensor fused = testing::random_bf16(*be, s, 3 * width, 31, 3.0f);
    const std::vector<uint16_t> bits = testing::bits(*be, fused);
    auto value = [&](int which, int64_t row, int64_t col) {
      return bf16_bits_value(bits[row * 3 * width + which * width + col]);
    };
    DeviceBytes q8(s * width), k8(s * width), vt(width * padded),
        scales(cuda::flash_fp8_scale_count(c.heads, s, s) * sizeof(float));
    cuda::FlashFp8Operands operands{q8.data, k8.data, vt.data, static_cast<float*>(scales.data)};
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const cuda::Mat m = cuda::Mat{fused.data(), s, width, 3 * width};
    auto column = [&](int which) {
      return cuda::Mat{static_cast<char*>(m.data) + which * width * 2, s, width, m.stride};
    };
    ASSERT_TRUE(cuda::quantize_attention_operands_fp8(column(0), column(1), column(2), c.heads,
                                                      operands, nullptr)
                    .ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> got_q(s * width), got_k(s * width), got_vt(width * padded);
    std::vector<float> got_scales(cuda::flash_fp8_scale_count(c.heads, s, s));
    cudaMemcpy(got_q.data(), q8.data, got_q.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(got_k.data(), k8.data, got_k.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(got_vt.data(), vt.data, got_vt.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(got_scales.data(), scales.data, got_scales.size() * sizeof(float),
               cudaMemcpyDeviceToHost);

    // max |x| over a block of 128 tokens of one head of q (0), k (1) or v (2).
    auto block_amax = [&](int which, int64_t h, int64_t tile) {
      uint32_t amax = 0;
      for (int64_t r = tile * 128; r < std::min(s, (tile + 1) * 128); ++r) {
        for (int64_t i = 0; i < 128; ++i)
          amax = std::max(amax, abs_bits(value(which, r, h * 128 + i)));
      }
      return f32_from_bits(amax);
    };
    int64_t mismatches = 0;
    for (int which = 0; which < 2; ++which) {
      const std::vector<uint8_t>& got = which == 0 ? got_q : got_k;
      for (int64_t h = 0; h < c.heads; ++h) {
        for (int64_t tile = 0; tile < tiles; ++tile) {
          const int64_t end = std::min(s, (tile + 1) * 128);
          const float scale = fp8_dequant_scale(block_amax(which, h, tile));
          EXPECT_EQ(f32_bits(got_scales[(which * c.heads + h) * tiles + tile]), f32_bits(scale))
              << c.name << ": scale of " << (which == 0 ? "q" : "k") << " head " << h << " block "
              << tile;
          for (int64_t r = tile * 128; r < end; ++r) {
            for (int64_t i = 0; i < 128; ++i) {
              const int64_t col = h * 128 + i;
              mismatches += got[r * width + col] != fp8_quantize_value(value(which, r, col), scale);
            }
          }
        }
      }
    }
    for (int64_t h = 0; h < c.heads; ++h) {
      for (int64_t tile = 0; tile < tiles; ++tile) {
        const float scale = cuda::flash_fp8_value_scale(block_amax(2, h, tile));
        EXPECT_EQ(f32_bits(got_scales[(2 * c.heads + h) * tiles + tile]), f32_bits(scale))
            << c.name << ": scale of v head " << h << " block " << tile;
        for (int64_t i = 0; i < 128; ++i) {
          const int64_t col = h * 128 + i;
          for (int64_t position = tile * 128; position < (tile + 1) * 128; ++position) {
            const int64_t key = cuda::flash_fp8_key_at(position);
            const uint8_t want = key < s ? fp8_quantize_value(value(2, key, col), scale) : 0;
            mismatches += got_vt[col * padded + position] != want;
          }
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << c.name;
  }
}

// Through the backend: quality=high attention at a transformer shape runs our kernel (counted),
// within the bound of FP8 against bf16 attention, the same bits on every call; lossless and causal
// attention never take it, other head sizes fall back counted. The bound, relative L2 over the
// output: four values are rounded to E4M3 on the way (Q, K, V and the probabilities P), each with a
// relative error of at most 2^-4 (half an ulp with 3 mantissa bits); V's and P's reach the output
// through the convex sum over keys, Q's and K's through the logits, where independent errors partly
// cancel. The four in quadrature at their worst give 2 x 2^-4.
TEST(FlashAttentionFp8BackendTest, ServesHighAttentionWithinBoundAndCountsFallbacks) {
  FLUX2_REQUIRE_GPU(be);
  if (!cuda::flash_attention_fp8_available()) {
    GTEST_SKIP() << "flash_attention_fp8 needs an sm_90a build on a compute capability 9.0 GPU";
  }
  constexpr double kBound = 0.125;
  const int64_t s = 1536, heads = 24, width = heads * 128;  // klein-4B at 512²
  Tensor fused = testing::random_bf16(*be, s, 3 * width, 11, 2.0f);
  const Tensor q = fused.col_slice(0, width), k = fused.col_slice(width, width),
               v = fused.col_slice(2 * width, width);
  ASSERT_TRUE(be->copy(testing::random_bf16(*be, s, width, 12, 1.0f), v).ok());
  const AttentionParams params{heads, heads, 128, 1.0f / std::sqrt(128.0f)};
  auto invocations = [] { return testing::fast_path_counters("flash_attention_fp8").invocations; };
  auto unsupported = [] {
    return testing::fast_path_fallbacks("flash_attention_fp8", "unsupported_shape");
  };
  Tensor reference = be->empty(DType::kBF16, {s, width}).value();
  Tensor high = be->empty(DType::kBF16, {s, width}).value();
  Tensor again = be->empty(DType::kBF16, {s, width}).value();
  const int64_t before = invocations(), unsupported_before = unsupported();
  ASSERT_TRUE(be->attention(q, k, v, params, reference).ok());  // lossless: bf16
  EXPECT_EQ(invocations(), before);
  {
    const RequestScope quality(*be, {Quality::kHigh});
    ASSERT_TRUE(be->attention(q, k, v, params, high).ok());
    ASSERT_TRUE(be->attention(q, k, v, params, again).ok());
    EXPECT_EQ(invocations(), before + 2) << "the FP8 flash attention did not run";
    AttentionParams causal = params;
    causal.causal = true;
    Tensor scratch = be->empty(DType::kBF16, {s, width}).value();
    ASSERT_TRUE(be->attention(q, k, v, causal, scratch).ok());
    EXPECT_EQ(unsupported(), unsupported_before) << "causal attention is not the kernel's to serve";
    const AttentionParams narrow{heads * 2, heads * 2, 64, 0.125f};
    ASSERT_TRUE(be->attention(q, k, v, narrow, scratch).ok());
    EXPECT_EQ(unsupported(), unsupported_before + 1);
    EXPECT_EQ(invocations(), before + 2);
  }
  EXPECT_EQ(testing::bits(*be, high), testing::bits(*be, again)) << "two identical calls differ";
  const double error =
      relative_l2_error(testing::values(*be, high), testing::values(*be, reference));
  std::printf("FP8 flash attention vs bf16 (S=%lld, %lld heads): relative L2 %.4e (bound %.3f)\n",
              static_cast<long long>(s), static_cast<long long>(heads), error, kBound);
  EXPECT_GT(error, 0.0);
  EXPECT_LE(error, kBound);
}

// QK-norm + RoPE inside the operand quantizer (Backend::normed_attention's fusion) against
// qk_norm_rope on the GPU followed by the plain quantizer: every byte and scale the same. Text
// and image rows with their own weights, split inside a block of 128 tokens.
struct NormedInputs {
  Tensor fused;  // [S, 3·width]: raw q | k | v
  QkNormRope norm;
};

NormedInputs normed_inputs(Backend& be, int64_t s, int64_t heads, int64_t split, uint64_t seed) {
  NormedInputs in;
  in.fused = testing::random_bf16(be, s, 3 * heads * 128, seed, 4.0f);
  for (int i = 0; i < 2; ++i) {
    in.norm.q_weight[i] = testing::random_bf16(be, 1, 128, seed + 1 + i, 2.0f).reshape({128});
    in.norm.k_weight[i] = testing::random_bf16(be, 1, 128, seed + 3 + i, 2.0f).reshape({128});
  }
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> angle(-3.2f, 3.2f);
  std::vector<float> cos(static_cast<size_t>(s * 128)), sin(cos.size());
  for (size_t i = 0; i < cos.size(); ++i) {
    const float a = angle(rng);
    cos[i] = std::cos(a);
    sin[i] = std::sin(a);
  }
  in.norm.cos = be.empty(DType::kF32, {s, 128}).value();
  in.norm.sin = be.empty(DType::kF32, {s, 128}).value();
  EXPECT_TRUE(be.upload(cos.data(), DType::kF32, in.norm.cos).ok());
  EXPECT_TRUE(be.upload(sin.data(), DType::kF32, in.norm.sin).ok());
  in.norm.split = split;
  in.norm.eps = 1e-6f;
  return in;
}

// The eager chain on `fused`: qk_norm_rope on each row range of q and k, in place.
void norm_in_place(Backend& be, const Tensor& fused, int64_t width, const QkNormRope& norm) {
  const int64_t s = fused.rows();
  for (int part = 0; part < 2; ++part) {
    const int64_t first = part == 0 ? 0 : norm.split,
                  count = part == 0 ? norm.split : s - norm.split;
    if (count == 0) continue;
    for (int which = 0; which < 2; ++which) {
      ASSERT_TRUE(be.qk_norm_rope(fused.col_slice(which * width, width).row_slice(first, count),
                                  128, which == 0 ? norm.q_weight[part] : norm.k_weight[part],
                                  norm.eps, norm.cos.row_slice(first, count),
                                  norm.sin.row_slice(first, count), norm.style)
                      .ok());
    }
  }
}

TEST(FlashAttentionFp8OperandsTest, FusedQkNormEqualsQkNormRopeThenQuantizer) {
  FLUX2_REQUIRE_GPU(be);
  for (const Case c : {Case{"ragged_300", 300, 3}, Case{"klein_1024", 4608, 24}}) {
    const int64_t width = c.heads * 128, s = c.tokens, padded = cuda::flash_fp8_padded_keys(s);
    const NormedInputs in = normed_inputs(*be, s, c.heads, s == 300 ? 200 : 512, 41);
    const Tensor eager = testing::clone(*be, in.fused);
    norm_in_place(*be, eager, width, in.norm);
    const int64_t scale_bytes = cuda::flash_fp8_scale_count(c.heads, s, s) * sizeof(float);
    std::vector<std::vector<uint8_t>> results;
    for (const Tensor* source : {&in.fused, &eager}) {
      DeviceBytes q8(s * width), k8(s * width), vt(width * padded), scales(scale_bytes);
      const cuda::FlashFp8Operands operands{q8.data, k8.data, vt.data,
                                            static_cast<float*>(scales.data)};
      const cuda::FlashFp8QkNorm norm{{in.norm.q_weight[0].data(), in.norm.q_weight[1].data()},
                                      {in.norm.k_weight[0].data(), in.norm.k_weight[1].data()},
                                      in.norm.split,
                                      in.norm.eps,
                                      cuda::Mat{in.norm.cos.data(), s, 128, 128},
                                      cuda::Mat{in.norm.sin.data(), s, 128, 128}};
      auto column = [&](int which) {
        return cuda::Mat{static_cast<char*>(source->data()) + which * width * 2, s, width,
                         3 * width};
      };
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_TRUE(cuda::quantize_attention_operands_fp8(column(0), column(1), column(2), c.heads,
                                                        operands, nullptr,
                                                        source == &in.fused ? &norm : nullptr)
                      .ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<uint8_t> bytes(2 * s * width + width * padded + scale_bytes);
      uint8_t* at = bytes.data();
      for (const auto& [data, size] : {std::pair<void*, int64_t>{q8.data, s * width},
                                       {k8.data, s * width},
                                       {vt.data, width * padded},
                                       {scales.data, scale_bytes}}) {
        ASSERT_EQ(cudaMemcpy(at, data, size, cudaMemcpyDeviceToHost), cudaSuccess);
        at += size;
      }
      results.push_back(std::move(bytes));
    }
    EXPECT_TRUE(results[0] == results[1])
        << c.name << ": fused QK-norm operands differ from the eager chain's";
  }
}

// Through the backend at quality=high: normed_attention runs the fused operands (counted as the FP8
// attention) and gives the bits of qk_norm_rope followed by attention; q and k are left as given.
TEST(FlashAttentionFp8BackendTest, NormedAttentionEqualsNormsThenAttention) {
  FLUX2_REQUIRE_GPU(be);
  if (!cuda::flash_attention_fp8_available()) {
    GTEST_SKIP() << "flash_attention_fp8 needs an sm_90a build on a compute capability 9.0 GPU";
  }
  const int64_t s = 1536, heads = 24, width = heads * 128;
  const NormedInputs in = normed_inputs(*be, s, heads, 512, 51);
  const Tensor eager = testing::clone(*be, in.fused);
  const std::vector<uint16_t> raw = testing::bits(*be, in.fused);
  const AttentionParams params{heads, heads, 128, 1.0f / std::sqrt(128.0f)};
  auto columns = [&](const Tensor& t, int which) { return t.col_slice(which * width, width); };
  Tensor fused_out = be->empty(DType::kBF16, {s, width}).value();
  Tensor eager_out = be->empty(DType::kBF16, {s, width}).value();
  const int64_t before = testing::fast_path_counters("flash_attention_fp8").invocations;
  {
    const RequestScope quality(*be, {Quality::kHigh});
    ASSERT_TRUE(be->normed_attention(columns(in.fused, 0), columns(in.fused, 1),
                                     columns(in.fused, 2), in.norm, params, fused_out)
                    .ok());
    norm_in_place(*be, eager, width, in.norm);
    ASSERT_TRUE(
        be->attention(columns(eager, 0), columns(eager, 1), columns(eager, 2), params, eager_out)
            .ok());
  }
  EXPECT_EQ(testing::fast_path_counters("flash_attention_fp8").invocations, before + 2);
  EXPECT_EQ(testing::bits(*be, fused_out), testing::bits(*be, eager_out));
  EXPECT_EQ(testing::bits(*be, in.fused), raw) << "the fused path wrote q, k or v";
}

}  // namespace
}  // namespace flux2
