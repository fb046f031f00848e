// CUDA backend checks with their own derived bounds, beyond the op registry of gpu_op_test
// (op_cases.cc): the quality=high fused-bias convolution against the separate bias add element by
// element, the lossless bias and shortcut adds bit for bit, GroupNorm's statistics against double
// sums, the launcher's per-sample gates, from_rgb8 bit for bit, to_rgb8 within one level of the
// CPU, and lora_down on no rows. Other comparisons use op_harness.h's kBf16ChainBound.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <gtest/gtest.h>

#include "kernels/base/dtype.h"
#include "kernels/base/fast_path_registry.h"
#include "kernels/base/numerics.h"
#include "kernels/base/postprocess.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/group_norm_one_pass.h"
#include "kernels/cuda/image_ops.h"
#include "tests/cuda/gpu_test_util.h"
#include "tests/cuda/op_harness.h"

namespace flux2 {
namespace {

constexpr double kTolerance = testing::kBf16ChainBound;

class BackendOpsTest : public ::testing::Test {
 protected:
  // The same random bf16 values on both backends.
  std::pair<Tensor, Tensor> pair(Backend& gpu, int64_t rows, int64_t cols, uint64_t seed,
                                 float scale = 1.0f) {
    Tensor g = testing::random_bf16(gpu, rows, cols, seed, scale);
    std::vector<float> host = testing::values(gpu, g);
    Tensor c = cpu_.empty(DType::kF32, {rows, cols}).value();
    EXPECT_TRUE(cpu_.upload(host.data(), DType::kF32, c).ok());
    return {g, c};
  }
  void expect_close(Backend& gpu, const Tensor& g, const Tensor& c, const char* what) {
    const std::vector<float> got = testing::values(gpu, g), ref = testing::values(cpu_, c);
    double norm = 0;
    for (float v : ref) norm += double(v) * v;
    EXPECT_GT(std::sqrt(norm), 1e-3) << what << ": trivial reference";
    EXPECT_LE(relative_l2_error(got, ref), kTolerance) << what;
  }
  CpuBackend cpu_;
};

// Fused runs plus the fallbacks for `reason` of a fast path.
std::pair<int64_t, int64_t> runs(const std::string& path, const std::string& reason) {
  return {testing::fast_path_counters(path).invocations,
          testing::fast_path_fallbacks(path, reason)};
}

// quality=high adds the convolution's bias (and conv2d_add's residual) in cuDNN's epilogue:
// f = bf16(c + b), one rounding, where lossless rounds the convolution first (PyTorch's separate
// bias add): s = bf16(bf16(c') + b). Both agree with the CPU backend. With bf16's unit roundoff
// u = 2^-8 (8-bit significand): |s - f| <= u|bf16(c') + b| + u|c'| + u|c + b| + |c - c'|, with
// |c'| <= |c + b| + |b| + |c - c'| and |c + b| <= |f| (1 + u): |s - f| <= u (3 max(|s|, |f|) + |b|)
// up to terms of order u^2 (a factor 1.01), plus 2 |c - c'|: the two cuDNN kernels need not sum
// the K = 9 Cin products in the same order, so c and c' may differ by fp32 summation error,
// |c - c'| <= 2 K 2^-24 sum |x w| (computed on the CPU from |x| and |w|).
TEST_F(BackendOpsTest, ConvBiasAndResidualFusedAtQualityHigh) {
  FLUX2_REQUIRE_GPU(gpu);
  const int64_t h = 32, w = 24, cin = 128, cout = 128, k = 9 * cin;
  auto [xg, xc] = pair(*gpu, h * w, cin, 30);
  auto [wg, wc] = pair(*gpu, cout, k, 31, 0.05f);
  auto [bg, bc] = pair(*gpu, 1, cout, 32, 4.0f);
  const Tensor x = xg.reshape({h, w, cin}), weights = wg.reshape({cout, 3, 3, cin}),
               bias = bg.reshape({cout});
  Tensor separate = gpu->empty(DType::kBF16, {h, w, cout}).value(),
         fused = gpu->empty(DType::kBF16, {h, w, cout}).value();
  Tensor oc = cpu_.empty(DType::kF32, {h, w, cout}).value();
  // sum |x w| per output: the CPU convolution of |x| and |w| with a zero bias.
  std::vector<float> abs_x = testing::values(cpu_, xc), abs_w = testing::values(cpu_, wc);
  for (float& v : abs_x) v = std::fabs(v);
  for (float& v : abs_w) v = std::fabs(v);
  Tensor ax = cpu_.empty(DType::kF32, {h, w, cin}).value(),
         aw = cpu_.empty(DType::kF32, {cout, 3, 3, cin}).value();
  Tensor zero = cpu_.empty(DType::kF32, {cout}).value(),
         magnitude = cpu_.empty(DType::kF32, {h, w, cout}).value();
  const std::vector<float> zeros(static_cast<size_t>(cout), 0.0f);
  ASSERT_TRUE(cpu_.upload(abs_x.data(), DType::kF32, ax).ok());
  ASSERT_TRUE(cpu_.upload(abs_w.data(), DType::kF32, aw).ok());
  ASSERT_TRUE(cpu_.upload(zeros.data(), DType::kF32, zero).ok());
  ASSERT_TRUE(cpu_.conv2d(ax, aw, zero, magnitude).ok());
  const std::vector<float> products = testing::values(cpu_, magnitude);
  const double summation = 2.0 * 2.0 * static_cast<double>(k) * std::ldexp(1.0, -24);

  ASSERT_TRUE(gpu->conv2d(x, weights, bias, separate).ok());
  const auto [fused_before, fallbacks_before] = runs("conv_fused_bias", "algorithm_cannot_fuse");
  {
    const RequestScope high(*gpu, {Quality::kHigh});
    ASSERT_TRUE(gpu->conv2d(x, weights, bias, fused).ok());
  }
  // cuDNN's algorithm for this decoder-like shape takes the bias in its epilogue (on sm_90 it
  // picks IMPLICIT_PRECOMP_GEMM for every decoder shape): the fused kernel must run, no fallback.
  const auto [fused_after, fallbacks_after] = runs("conv_fused_bias", "algorithm_cannot_fuse");
  EXPECT_EQ(fused_after, fused_before + 1) << "the fused bias did not run";
  EXPECT_EQ(fallbacks_after, fallbacks_before) << "the fused bias fell back: algorithm_cannot_fuse";
  ASSERT_TRUE(
      cpu_.conv2d(xc.reshape({h, w, cin}), wc.reshape({cout, 3, 3, cin}), bc.reshape({cout}), oc)
          .ok());
  expect_close(*gpu, fused, oc, "conv2d, fused bias");
  const std::vector<float> a = testing::values(*gpu, fused), b = testing::values(*gpu, separate);
  const std::vector<float> bias_values = testing::values(*gpu, bg);
  int64_t differing = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    differing += a[i] != b[i];
    const double bound = 1.01 * std::ldexp(3.0 * std::max(std::fabs(a[i]), std::fabs(b[i])) +
                                               std::fabs(bias_values[i % cout]),
                                           -8) +
                         summation * products[i];
    EXPECT_LE(std::fabs(a[i] - b[i]), bound) << "element " << i;
  }
  std::printf(
      "conv fused bias: %lld of %zu outputs differ from the separate bias add by one rounding\n",
      static_cast<long long>(differing), a.size());

  // The resnet's shortcut too: f = bf16(c + b + r) against s = bf16(bf16(bf16(c') + b) + r). Four
  // roundings in all, each within u of its value: |s - f| <= u (|c'| + |c' + b| + |s| + |f|) +
  // |c - c'|, and with |c'| <= |f| + |b| + |r| and |c' + b| <= |f| + |r| (up to |c - c'|):
  // <= u (4 max(|s|, |f|) + |b| + 2 |r|) + 2 |c - c'|.
  auto [rg, rc] = pair(*gpu, h * w, cout, 33, 2.0f);
  const Tensor residual = rg.reshape({h, w, cout});
  ASSERT_TRUE(gpu->conv2d_add(x, weights, bias, residual, separate).ok());
  {
    const RequestScope high(*gpu, {Quality::kHigh});
    ASSERT_TRUE(gpu->conv2d_add(x, weights, bias, residual, fused).ok());
  }
  EXPECT_EQ(runs("conv_fused_bias", "algorithm_cannot_fuse").first, fused_before + 2)
      << "the fused bias and residual did not run";
  ASSERT_TRUE(cpu_.conv2d_add(xc.reshape({h, w, cin}), wc.reshape({cout, 3, 3, cin}),
                              bc.reshape({cout}), rc.reshape({h, w, cout}), oc)
                  .ok());
  expect_close(*gpu, fused, oc, "conv2d_add, fused bias and residual");
  expect_close(*gpu, separate, oc, "conv2d_add, separate");
  const std::vector<float> fa = testing::values(*gpu, fused), sa = testing::values(*gpu, separate);
  const std::vector<float> r = testing::values(*gpu, rg);
  differing = 0;
  for (size_t i = 0; i < fa.size(); ++i) {
    differing += fa[i] != sa[i];
    const double bound =
        1.01 * std::ldexp(4.0 * std::max(std::fabs(fa[i]), std::fabs(sa[i])) +
                              std::fabs(bias_values[i % cout]) + 2.0 * std::fabs(r[i]),
                          -8) +
        summation * products[i];
    EXPECT_LE(std::fabs(fa[i] - sa[i]), bound) << "element " << i;
  }
  std::printf("conv fused bias + residual: %lld of %zu outputs differ from the separate ops\n",
              static_cast<long long>(differing), fa.size());
}

// Lossless adds the convolution's bias as PyTorch does, bf16(f32(c) + f32(b)) of the rounded
// convolution c, and conv2d_add the shortcut after it, bf16(f32(r) + f32(that)): bit for bit, at
// decoder-like shapes (16-byte rows and the 3-channel conv_out). c is the same shape's output with
// a zero bias (c + 0 = c; cuDNN's algorithm and so c do not depend on the bias).
TEST_F(BackendOpsTest, LosslessConvBiasAndShortcutAreThePyTorchRoundings) {
  FLUX2_REQUIRE_GPU(gpu);
  struct Shape {
    int64_t h, w, cin, cout;
  };
  for (const Shape s : {Shape{64, 96, 128, 128}, Shape{48, 40, 512, 512}, Shape{64, 64, 128, 3}}) {
    SCOPED_TRACE(::testing::Message() << s.h << "x" << s.w << "x" << s.cin << "->" << s.cout);
    const Tensor x = testing::random_bf16(*gpu, s.h * s.w, s.cin, 40).reshape({s.h, s.w, s.cin});
    const Tensor weights =
        testing::random_bf16(*gpu, s.cout, 9 * s.cin, 41, 0.05f).reshape({s.cout, 3, 3, s.cin});
    const Tensor bias = testing::random_bf16(*gpu, 1, s.cout, 42, 4.0f).reshape({s.cout});
    const Tensor zero = gpu->empty(DType::kBF16, {s.cout}).value();
    const std::vector<float> zeros(static_cast<size_t>(s.cout), 0.0f);
    ASSERT_TRUE(gpu->upload(zeros.data(), DType::kF32, zero).ok());
    const Tensor residual =
        testing::random_bf16(*gpu, s.h * s.w, s.cout, 43, 2.0f).reshape({s.h, s.w, s.cout});
    Tensor plain = gpu->empty(DType::kBF16, {s.h, s.w, s.cout}).value(),
           biased = gpu->empty(DType::kBF16, {s.h, s.w, s.cout}).value(),
           added = gpu->empty(DType::kBF16, {s.h, s.w, s.cout}).value();
    ASSERT_TRUE(gpu->conv2d(x, weights, zero, plain).ok());
    ASSERT_TRUE(gpu->conv2d(x, weights, bias, biased).ok());
    ASSERT_TRUE(gpu->conv2d_add(x, weights, bias, residual, added).ok());
    const std::vector<float> c = testing::values(*gpu, plain), got = testing::values(*gpu, biased),
                             sum = testing::values(*gpu, added), b = testing::values(*gpu, bias),
                             r = testing::values(*gpu, residual);
    int64_t bias_mismatches = 0, shortcut_mismatches = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      const float want = round_to_bf16(c[i] + b[i % s.cout]);
      bias_mismatches += f32_to_bf16_bits(got[i]) != f32_to_bf16_bits(want);
      shortcut_mismatches +=
          f32_to_bf16_bits(sum[i]) != f32_to_bf16_bits(round_to_bf16(r[i] + want));
    }
    EXPECT_EQ(bias_mismatches, 0) << "of " << c.size() << " biased outputs";
    EXPECT_EQ(shortcut_mismatches, 0) << "of " << c.size() << " outputs with the shortcut";
  }
}

// GroupNorm at the VAE decoder's channel counts, on inputs with a ramp over the pixels plus
// per-channel offsets: the vectorized statistics (C = 128 and 512; 300 pixels leave most of the
// 512 statistics blocks one pixel or none; C = 24 leaves threads idle) and the scalar ones (C =
// 36).
struct GroupNormCase {
  int64_t pixels, channels, groups;
  bool silu;
};
constexpr GroupNormCase kGroupNormCases[] = {{4099, 128, 32, true},
                                             {2053, 512, 32, false},
                                             {300, 128, 32, true},
                                             {1031, 24, 8, true},
                                             {300, 36, 4, false}};

Tensor group_norm_input(Backend& gpu, const GroupNormCase& c) {
  std::vector<float> host(static_cast<size_t>(c.pixels * c.channels));
  for (int64_t p = 0; p < c.pixels; ++p) {
    for (int64_t ch = 0; ch < c.channels; ++ch) {
      host[p * c.channels + ch] =
          3.0f * p / c.pixels + 0.25f * (ch % 7) + 0.5f * std::sin(0.37f * (p + 5 * ch));
    }
  }
  Tensor x = gpu.empty(DType::kBF16, {c.pixels, c.channels}).value();
  EXPECT_TRUE(gpu.upload(host.data(), DType::kF32, x).ok());
  return x;
}

// The statistics themselves against double-precision sums of the same bf16 values. Every fp32
// chain of additions in either tree is at most 128 long for these shapes (per-thread pixels,
// thread rows or slices, the group's channels, 512 / 32 partials per lane and a 5-level
// butterfly), so the mean is within 128 · 2^-24 · mean|x| and var within 128 · 2^-24 · var
// relative (sums of squares do not cancel), rstd within half that plus rsqrtf's 2 ulp: 128 · 2^-24
// covers both. Statistics that missed or repeated even one pixel would be off by ~1e-4 or more.
// The one-pass statistics (quality=high; vectorized layouts only) round three times per pixel in
// Welford's update (the difference, 1/n and the fused update) where a sum rounds once, and each
// Chan merge of the same tree rounds a bounded number of times in place of an addition: 3 x the
// bound.
void expect_group_statistics(Backend& gpu, bool one_pass) {
  const double bound = (one_pass ? 3 : 1) * 128.0 * std::ldexp(1.0, -24);
  for (const GroupNormCase& c : kGroupNormCases) {
    const Tensor x = group_norm_input(gpu, c);
    const cuda::Mat xm{x.data(), x.rows(), x.cols(), x.row_stride()};
    if (one_pass && !cuda::group_norm_one_pass_supported(xm)) continue;
    const std::vector<float> values = testing::values(gpu, x);
    Tensor mean = gpu.empty(DType::kF32, {1, c.groups}).value(),
           rstd = gpu.empty(DType::kF32, {1, c.groups}).value();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto* m_out = static_cast<float*>(mean.data());
    auto* r_out = static_cast<float*>(rstd.data());
    ASSERT_TRUE(
        (one_pass
             ? cuda::group_norm_statistics_one_pass_bf16(xm, c.groups, 1e-6f, m_out, r_out, nullptr)
             : cuda::group_norm_statistics_bf16(xm, c.groups, 1e-6f, m_out, r_out, nullptr))
            .ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got_mean = testing::values(gpu, mean),
                             got_rstd = testing::values(gpu, rstd);
    const int64_t per_group = c.channels / c.groups;
    for (int64_t g = 0; g < c.groups; ++g) {
      double sum = 0, magnitude = 0;
      for (int64_t p = 0; p < c.pixels; ++p) {
        for (int64_t ch = g * per_group; ch < (g + 1) * per_group; ++ch) {
          sum += values[p * c.channels + ch];
          magnitude += std::fabs(values[p * c.channels + ch]);
        }
      }
      const double n = static_cast<double>(c.pixels * per_group), m = sum / n;
      double squares = 0;
      for (int64_t p = 0; p < c.pixels; ++p) {
        for (int64_t ch = g * per_group; ch < (g + 1) * per_group; ++ch) {
          squares += (values[p * c.channels + ch] - m) * (values[p * c.channels + ch] - m);
        }
      }
      const double r = 1.0 / std::sqrt(squares / n + 1e-6);
      EXPECT_LE(std::fabs(got_mean[g] - m), bound * magnitude / n)
          << "C=" << c.channels << " group " << g << (one_pass ? " (one pass)" : "");
      EXPECT_LE(std::fabs(got_rstd[g] - r), bound * r)
          << "C=" << c.channels << " group " << g << (one_pass ? " (one pass)" : "");
    }
  }
}

TEST_F(BackendOpsTest, GroupNormStatisticsMatchDoubleSums) {
  FLUX2_REQUIRE_GPU(gpu);
  expect_group_statistics(*gpu, /*one_pass=*/false);
}

TEST_F(BackendOpsTest, GroupNormOnePassStatisticsMatchDoubleSums) {
  FLUX2_REQUIRE_GPU(gpu);
  expect_group_statistics(*gpu, /*one_pass=*/true);
}

// The reference image's bytes scaled on the device: every level the bf16 of the host's f32 value
// (u8_to_unit), bit for bit.
TEST_F(BackendOpsTest, FromRgb8IsTheHostsValueRoundedOnce) {
  FLUX2_REQUIRE_GPU(gpu);
  std::vector<uint8_t> levels(16 * 16 * 3);
  for (size_t i = 0; i < levels.size(); ++i) levels[i] = static_cast<uint8_t>(i);
  Tensor image = gpu->empty(DType::kBF16, {16, 16, 3}).value();
  ASSERT_TRUE(gpu->from_rgb8(levels.data(), image).ok());
  const std::vector<uint16_t> got = testing::bits(*gpu, image);
  ASSERT_EQ(got.size(), levels.size());
  for (size_t i = 0; i < levels.size(); ++i) {
    ASSERT_EQ(got[i], f32_to_bf16_bits(u8_to_unit(levels[i]))) << "level " << int(levels[i]);
  }
}

TEST_F(BackendOpsTest, ToRgb8MatchesCpuWithinOneLevel) {
  FLUX2_REQUIRE_GPU(gpu);
  // Values in about [-1.2, 1.2] so clamping is exercised on both ends.
  auto [ig, ic] = pair(*gpu, 64 * 48, 3, 16, 1.2f);
  std::vector<uint8_t> g(64 * 48 * 3), c(64 * 48 * 3);
  ASSERT_TRUE(gpu->to_rgb8(ig.reshape({64, 48, 3}), g.data()).ok());
  ASSERT_TRUE(cpu_.to_rgb8(ic.reshape({64, 48, 3}), c.data()).ok());
  // The GPU adds 0.5 in bf16 as a bf16 pipeline does (CPU: float32): at most one level apart.
  int64_t equal = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_LE(std::abs(int(g[i]) - int(c[i])), 1) << i;
    equal += g[i] == c[i];
  }
  EXPECT_GT(equal, static_cast<int64_t>(g.size()) / 2);
  EXPECT_NE(std::count(g.begin(), g.end(), 0), 0);
  EXPECT_NE(std::count(g.begin(), g.end(), 255), 0);
}

// lora_down on a shard without rows (sequence parallelism gives later ranks no text rows when the
// text is shorter than a shard): nothing to do, and no division by the zero tiles of its split.
TEST(LoraDownTest, NoRowsIsANoOp) {
  FLUX2_REQUIRE_GPU(be);
  Tensor x = be->empty(DType::kBF16, {0, 3072}).value();
  Tensor t = be->empty(DType::kBF16, {0, 32}).value();
  const std::vector<Tensor> stacks = {testing::random_bf16(*be, 32, 3072, 31)};
  ASSERT_TRUE(be->lora_down(x, stacks, t).ok());
  ASSERT_TRUE(be->synchronize().ok());
}

// Per-sample gates [B, D] (B = 2, distinct gates): the launcher's batched form, bit for bit its
// eager chain; and the samples really used different gates.
TEST(FusedGateResidualTest, PerSampleGatesMatchEagerChain) {
  FLUX2_REQUIRE_GPU(be);
  const int64_t rows_per_sample = 2311, cols = 3072;
  Tensor gates = testing::random_bf16(*be, 2, cols, 21);
  Tensor update = testing::random_bf16(*be, 2 * rows_per_sample, cols, 22, 4.0f);
  Tensor fused = testing::random_bf16(*be, 2 * rows_per_sample, cols, 23, 4.0f);
  Tensor eager = testing::clone(*be, fused), shared_gate = testing::clone(*be, fused);
  Tensor product = be->empty(DType::kBF16, {2 * rows_per_sample, cols}).value();
  auto m = [](const Tensor& t) { return cuda::Mat{t.data(), t.rows(), t.cols(), t.row_stride()}; };
  cudaStream_t stream = cuda_stream_of(*be);
  ASSERT_TRUE(
      cuda::gate_residual_fused(m(fused), m(gates), rows_per_sample, m(update), stream).ok());
  ASSERT_TRUE(cuda::gate_mul_bf16(m(gates), rows_per_sample, m(update), m(product), stream).ok());
  ASSERT_TRUE(cuda::add_bf16(m(eager), m(product), m(eager), stream).ok());
  EXPECT_EQ(testing::bits(*be, fused), testing::bits(*be, eager));
  ASSERT_TRUE(cuda::gate_residual_fused(m(shared_gate), m(gates.row_slice(0, 1)),
                                        2 * rows_per_sample, m(update), stream)
                  .ok());
  EXPECT_NE(testing::bits(*be, shared_gate), testing::bits(*be, fused));
}

}  // namespace
}  // namespace flux2
