// quality=high with random weights: at the real klein-4B shapes enabling it leaves lossless bytes
// unchanged and a forward runs every FP8 path as often as the blocks call it, with no fallback; at
// klein-4B's widths the output stays within twice the error of the CPU backend's FP8 emulation
// (a same-precision reference) plus the bf16 error, klein-KV's cached steps included; the fast
// SiLU of SwiGLU and the VAE's GroupNorm stays within derived bf16-ulp bounds of the exact one.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/base/fast_path_registry.h"
#include "kernels/base/numerics.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/flux2_presets.h"
#include "model/flux2_transformer.h"
#include "model/rope.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

// Fast-path activity since a snapshot: invocations by path and the fallbacks, "path:reason".
struct Activity {
  std::map<std::string, int64_t> invocations;
  std::vector<std::string> fallbacks;
};
Activity activity_since(const std::vector<FastPathCounters>& before) {
  Activity out;
  for (const FastPathCounters& now : fast_path_snapshot()) {
    const FastPathCounters* then = nullptr;
    for (const FastPathCounters& b : before) then = b.path == now.path ? &b : then;
    const int64_t ran = now.invocations - (then != nullptr ? then->invocations : 0);
    if (ran > 0) out.invocations[now.path] = ran;
    for (const auto& [reason, count] : now.fallbacks) {
      const int64_t earlier =
          then != nullptr && then->fallbacks.count(reason) ? then->fallbacks.at(reason) : 0;
      if (count > earlier) out.fallbacks.push_back(now.path + ":" + reason);
    }
  }
  return out;
}

// One transformer forward of `model` at `quality` (step 0 of `cond`).
Tensor forward(Backend& be, const Flux2Transformer& model, const Flux2Conditioning& cond,
               const Tensor& x, Quality quality) {
  const RequestScope request(be, {quality});
  Tensor out = be.empty(be.activation_dtype(), {x.rows(), model.config().out_channels}).value();
  EXPECT_TRUE(model.forward(cond, 0, x, out).ok());
  return out;
}

// At the real klein-4B shapes (5 + 20 blocks, 4096 image + 512 text tokens): enabling quality=high
// leaves lossless bytes unchanged, and a quality=high forward runs every FP8 path as often as the
// blocks call it, with no fallback. Per double block: four norm+projection pairs in E4M3 rows
// (layer_norm_fp8), two out-projections (fp8_linear), two SwiGLU down-projections (swiglu_fp8) and
// one attention; per single block one of each but fp8_linear.
TEST(QualityHighTest, Klein4bShapesLosslessUnchangedAndEveryFp8PathRuns) {
  FLUX2_REQUIRE_GPU(be);
  const Flux2Config config = flux2_preset("klein-4b").value();
  auto model = Flux2Transformer::create_random(*be, config, 5);
  ASSERT_TRUE(model.ok()) << model.status();
  const int64_t h = 64, w = 64, n = h * w, l = 512;
  Tensor prompt = testing::random_bf16(*be, l, config.joint_attention_dim, 6);
  Tensor x = testing::random_bf16(*be, n, config.in_channels, 7);
  const std::vector<float> timesteps = {0.9f};
  auto cond = (*model)->prepare(prompt, flux2_text_ids(l), flux2_image_ids(h, w), timesteps, {});
  ASSERT_TRUE(cond.ok()) << cond.status();
  const std::vector<uint16_t> lossless_before =
      testing::bits(*be, forward(*be, **model, *cond, x, Quality::kLossless));
  auto fp8_bytes = (*model)->enable_quality_high();
  ASSERT_TRUE(fp8_bytes.ok()) << fp8_bytes.status();
  EXPECT_GT(fp8_bytes->device_bytes, 0);
  const Tensor lossless = forward(*be, **model, *cond, x, Quality::kLossless);
  EXPECT_EQ(testing::bits(*be, lossless), lossless_before)
      << "enabling quality=high changed a lossless result";
  const std::vector<FastPathCounters> before = fast_path_snapshot();
  const Tensor high = forward(*be, **model, *cond, x, Quality::kHigh);
  ASSERT_TRUE(be->synchronize().ok());
  Activity ran = activity_since(before);
  const int64_t d = config.num_layers, s = config.num_single_layers;
  EXPECT_EQ(ran.invocations["layer_norm_fp8"], 4 * d + s);
  EXPECT_EQ(ran.invocations["fp8_linear"], 2 * d);
  EXPECT_EQ(ran.invocations["swiglu_fp8"], 2 * d + s);
  EXPECT_EQ(ran.invocations["flash_attention_fp8"], d + s);
  EXPECT_TRUE(ran.fallbacks.empty()) << "fallbacks: " << ::testing::PrintToString(ran.fallbacks);
  // The bound is asserted against the FP8 emulation below; this is the full model's number.
  std::printf(
      "klein-4B transformer output, high vs lossless: relative L2 %.4e, FP8 weights %.2f GB\n",
      relative_l2_error(testing::values(*be, high), testing::values(*be, lossless)),
      fp8_bytes->device_bytes / 1e9);
}

// klein-4B's widths (D 3072, 24 heads of 128, F 9216) at reduced depth: one double and two single
// blocks, so the CPU reference takes seconds.
Flux2Config reduced_klein4b() {
  Flux2Config config = flux2_preset("klein-4b").value();
  config.num_layers = 1;
  config.num_single_layers = 2;
  return config;
}

// The same inputs on both backends: random bf16 values on the GPU, uploaded to the CPU as float32.
std::pair<Tensor, Tensor> same_inputs(Backend& gpu, CpuBackend& cpu, int64_t rows, int64_t cols,
                                      uint64_t seed) {
  Tensor g = testing::random_bf16(gpu, rows, cols, seed);
  const std::vector<float> host = testing::values(gpu, g);
  Tensor c = cpu.empty(DType::kF32, {rows, cols}).value();
  EXPECT_TRUE(cpu.upload(host.data(), DType::kF32, c).ok());
  return {g, c};
}

// quality=high against a same-precision reference (a bound of k times the error of a naive
// implementation in the same precision, as FA3's "2x the low-precision reference's error"): the CPU
// backend's float32 emulation of the FP8 formats (cpu_fp8.h: the GEMM operands in E4M3 per token
// and per channel, attention's Q, K, V per head and 128 tokens, its probabilities in E4M3). Against
// the float32 lossless reference the GPU at high makes the FP8 error e_fp8 (which the emulation
// measures) and the bf16 error e_bf16 (which the GPU's own lossless output measures); independent
// errors add in quadrature, so e_high ≈ sqrt(e_fp8² + e_bf16²) <= e_fp8 + e_bf16, and the factor 2
// leaves room for the differences the emulation does not copy (the kernels' accumulation order and
// fast SiLU, P's rounding relative to a running maximum). klein-4B's widths (D 3072, 24 heads of
// 128, F 9216) at reduced depth (one double and two single blocks) and 64 text + 256 image tokens,
// so the CPU reference takes seconds.
TEST(QualityHighTest, Klein4bWidthsWithinTwiceTheEmulatedFp8Error) {
  FLUX2_REQUIRE_GPU(gpu);
  const Flux2Config config = reduced_klein4b();
  CpuBackend cpu;
  auto gpu_model = Flux2Transformer::create_random(*gpu, config, 15);
  auto cpu_model = Flux2Transformer::create_random(cpu, config, 15);
  ASSERT_TRUE(gpu_model.ok() && cpu_model.ok());
  ASSERT_TRUE((*gpu_model)->enable_quality_high().ok());
  ASSERT_TRUE((*cpu_model)->enable_quality_high().ok());
  const int64_t h = 16, w = 16, n = h * w, l = 64;
  auto [prompt_g, prompt_c] = same_inputs(*gpu, cpu, l, config.joint_attention_dim, 16);
  auto [x_g, x_c] = same_inputs(*gpu, cpu, n, config.in_channels, 17);
  const std::vector<float> timesteps = {0.75f};
  const std::vector<int64_t> txt = flux2_text_ids(l), img = flux2_image_ids(h, w);
  auto cond_g = (*gpu_model)->prepare(prompt_g, txt, img, timesteps, {});
  auto cond_c = (*cpu_model)->prepare(prompt_c, txt, img, timesteps, {});
  ASSERT_TRUE(cond_g.ok() && cond_c.ok());
  const std::vector<float> reference =
      testing::values(cpu, forward(cpu, **cpu_model, *cond_c, x_c, Quality::kLossless));
  const std::vector<float> emulated =
      testing::values(cpu, forward(cpu, **cpu_model, *cond_c, x_c, Quality::kHigh));
  const std::vector<FastPathCounters> before = fast_path_snapshot();
  const std::vector<float> lossless =
      testing::values(*gpu, forward(*gpu, **gpu_model, *cond_g, x_g, Quality::kLossless));
  const std::vector<float> high =
      testing::values(*gpu, forward(*gpu, **gpu_model, *cond_g, x_g, Quality::kHigh));
  Activity ran = activity_since(before);
  EXPECT_EQ(ran.invocations["flash_attention_fp8"], 3) << "the FP8 attention did not run";
  EXPECT_EQ(ran.invocations["swiglu_fp8"], 4) << "the FP8 projections did not run";
  EXPECT_TRUE(ran.fallbacks.empty()) << "fallbacks: " << ::testing::PrintToString(ran.fallbacks);
  const double e_fp8 = relative_l2_error(emulated, reference);  // the FP8 formats' own error
  const double e_bf16 = relative_l2_error(lossless, reference);
  const double e_high = relative_l2_error(high, reference);
  std::printf(
      "klein-4B widths, 3 blocks: relative L2 to float32: high %.4e, bound 2 x (FP8 "
      "emulation %.4e + bf16 lossless %.4e) = %.4e\n",
      e_high, e_fp8, e_bf16, 2 * (e_fp8 + e_bf16));
  EXPECT_GT(relative_l2_error(emulated, reference), 1e-4) << "the emulation changed nothing";
  EXPECT_LE(e_high, 2 * (e_fp8 + e_bf16));
  EXPECT_GT(e_high, e_bf16) << "quality=high matched lossless: no FP8 path ran";
}

// A klein-KV request's first two forwards at `quality` on `be`: step 0 (the extract forward, x
// [N + R]: the references cached) and step 1 (a cached forward, x's first N rows), their
// velocities; `cache_bytes` gets the bytes the cache holds.
std::vector<std::vector<float>> kv_steps(Backend& be, const Flux2Transformer& model,
                                         const Tensor& prompt, const Tensor& x, int64_t h,
                                         int64_t w, const Flux2References& refs, Quality quality,
                                         int64_t* cache_bytes = nullptr) {
  const RequestScope request(be, {quality});
  const int64_t n = h * w;
  const std::vector<float> timesteps = {1.0f, 0.75f};
  auto cond = model.prepare(prompt, flux2_text_ids(prompt.rows()), flux2_image_ids(h, w), timesteps,
                            {}, &refs);
  EXPECT_TRUE(cond.ok()) << cond.status();
  if (!cond.ok()) return {};
  std::vector<std::vector<float>> steps;
  for (int64_t step = 0; step < 2; ++step) {
    Tensor out = be.empty(be.activation_dtype(), {n, model.config().out_channels}).value();
    EXPECT_TRUE(model.forward(*cond, step, step == 0 ? x : x.row_slice(0, n), out).ok());
    steps.push_back(testing::values(be, out));
  }
  if (cache_bytes != nullptr) *cache_bytes = cond->kv->device_bytes();
  return steps;
}

// klein-KV at klein-4B's widths (one double and two single blocks; 64 text, 256 image and 64
// reference tokens), the bound of the test above per step: the extract forward (step 0: the text
// and image rows over all 384 keys as one sequence, the references over their own) and a cached
// forward (step 1: 320 own keys, a block and a half, then the 64 cached ones as a second segment,
// quantized once at step 0; the CPU emulates the same segments) run the FP8 attention at every
// layer with no fallback, and each step's velocity stays within twice the emulated FP8 error plus
// the bf16 error of the float32 lossless reference.
TEST(QualityHighTest, KleinKvWidthsWithinTwiceTheEmulatedFp8Error) {
  FLUX2_REQUIRE_GPU(gpu);
  const Flux2Config config = reduced_klein4b();
  CpuBackend cpu;
  auto gpu_model = Flux2Transformer::create_random(*gpu, config, 25);
  auto cpu_model = Flux2Transformer::create_random(cpu, config, 25);
  ASSERT_TRUE(gpu_model.ok() && cpu_model.ok());
  ASSERT_TRUE((*gpu_model)->enable_quality_high().ok());
  ASSERT_TRUE((*cpu_model)->enable_quality_high().ok());
  const int64_t h = 16, w = 16, n = h * w, l = 64, r = 64;
  Flux2References refs;
  refs.kv_cache = true;
  for (int64_t i = 0; i < r; ++i) refs.ids.insert(refs.ids.end(), {10, i / 8, i % 8, 0});
  auto [prompt_g, prompt_c] = same_inputs(*gpu, cpu, l, config.joint_attention_dim, 26);
  auto [x_g, x_c] = same_inputs(*gpu, cpu, n + r, config.in_channels, 27);
  const auto reference = kv_steps(cpu, **cpu_model, prompt_c, x_c, h, w, refs, Quality::kLossless);
  const auto emulated = kv_steps(cpu, **cpu_model, prompt_c, x_c, h, w, refs, Quality::kHigh);
  const auto lossless = kv_steps(*gpu, **gpu_model, prompt_g, x_g, h, w, refs, Quality::kLossless);
  const std::vector<FastPathCounters> before = fast_path_snapshot();
  int64_t cache_bytes = 0;
  const auto high =
      kv_steps(*gpu, **gpu_model, prompt_g, x_g, h, w, refs, Quality::kHigh, &cache_bytes);
  Activity ran = activity_since(before);
  EXPECT_EQ(ran.invocations["flash_attention_fp8"], 3 * 2 + 3)
      << "step 0: two attentions per layer, step 1: one over the cache";
  EXPECT_TRUE(ran.fallbacks.empty()) << "fallbacks: " << ::testing::PrintToString(ran.fallbacks);
  const int64_t d = config.hidden(), heads = config.num_attention_heads;
  EXPECT_EQ(cache_bytes, 3 * (r * d + d * 128 + 2 * heads * 4)) << "not the FP8 cache";
  ASSERT_EQ(high.size(), 2u);
  for (size_t step = 0; step < 2; ++step) {
    const double e_fp8 = relative_l2_error(emulated[step], reference[step]);
    const double e_bf16 = relative_l2_error(lossless[step], reference[step]);
    const double e_high = relative_l2_error(high[step], reference[step]);
    std::printf(
        "klein-KV at klein-4B widths, step %zu: relative L2 to float32: high %.4e, bound 2 x (FP8 "
        "emulation %.4e + bf16 lossless %.4e) = %.4e\n",
        step, e_high, e_fp8, e_bf16, 2 * (e_fp8 + e_bf16));
    EXPECT_GT(e_fp8, 1e-4) << "the emulation changed nothing at step " << step;
    EXPECT_LE(e_high, 2 * (e_fp8 + e_bf16)) << "step " << step;
    EXPECT_GT(e_high, e_bf16) << "quality=high matched lossless at step " << step;
  }
}

// Checks |high - lossless| <= 2^-ulp_exponent · max(|high|, |lossless|) + 2^-100 for every element
// (the silu tests below derive the exponent) and returns how many differ; `what` names the case.
int64_t differing_within_bound(Backend& be, const Tensor& lossless, const Tensor& high,
                               int ulp_exponent, const std::string& what) {
  const std::vector<float> want = testing::values(be, lossless), got = testing::values(be, high);
  int64_t differing = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const float bound = std::ldexp(std::max(std::fabs(want[i]), std::fabs(got[i])), -ulp_exponent) +
                        std::ldexp(1.0f, -100);
    EXPECT_LE(std::fabs(got[i] - want[i]), bound)
        << what << ", element " << i << ": high " << got[i] << ", lossless " << want[i];
    if (std::fabs(got[i] - want[i]) > bound) break;  // one element tells; the rest would flood
    differing += got[i] != want[i];
  }
  std::printf("%s: %.3f%% of outputs differ between quality=high and lossless\n", what.c_str(),
              100.0 * differing / want.size());
  return differing;
}

// SwiGLU at quality=high computes silu with __expf and __fdividef (cuda::SiluMath::kFast). For
// |g| < 100 that silu is within ~2^-16 of the exact one (__expf: 2 + 1.17 |g| ulp, __fdividef:
// 2 ulp), so bf16(silu) moves by at most one bf16 ulp (<= 2^-7 relative) and the product, after
// its own rounding, by at most two: |high - lossless| <= 2^-6 |lossless|. Below g = -87 the fast
// quotient is 0 where the exact one is below 2^-119 · |u|: the 2^-100 absolute term.
TEST(QualityHighTest, SwigluFastSiluWithinTwoBf16UlpsOfExact) {
  FLUX2_REQUIRE_GPU(be);
  int64_t differing = 0;  // over both ranges: in [-4, 4] the two silus rounded alike everywhere
  for (const float range : {4.0f, 100.0f}) {
    const int64_t rows = 1024, f = 9216;  // klein-4B's MLP width
    Tensor gate = testing::random_bf16(*be, rows, f, 11, range),
           up = testing::random_bf16(*be, rows, f, 12, 2.0f);
    Tensor exact = be->empty(DType::kBF16, {rows, f}).value(),
           fast = be->empty(DType::kBF16, {rows, f}).value();
    ASSERT_TRUE(be->swiglu(gate, up, exact).ok());
    const int64_t before = testing::fast_path_counters("swiglu").invocations;
    {
      const RequestScope high(*be, {Quality::kHigh});
      ASSERT_TRUE(be->swiglu(gate, up, fast).ok());
    }
    ASSERT_GT(testing::fast_path_counters("swiglu").invocations, before)
        << "the fused SwiGLU did not run";
    differing += differing_within_bound(
        *be, exact, fast, 6,
        range < 10 ? "SwiGLU, gate in [-4, 4]" : "SwiGLU, gate in [-100, 100]");
  }
  EXPECT_GT(differing, 0) << "quality=high computed the exact silu";
}

// The VAE's GroupNorm + SiLU at quality=high: one rounding after the fast silu, so at most one bf16
// ulp (<= 2^-7 relative) from lossless; 2^-100 absolute for the flushed silu below -87. The fused
// paths are switched off for it: the one-pass statistics (group_norm_one_pass, checked against
// double sums by backend_ops_test.cc) would move a few normalised values by an ulp before the
// silu, which this bound on the silu alone does not cover.
TEST(QualityHighTest, GroupNormFastSiluWithinOneBf16UlpOfExact) {
  FLUX2_REQUIRE_GPU(be);
  const int64_t pixels = 64 * 64, channels = 512, groups = 32;  // a decoder mid-block shape
  Tensor x = testing::random_bf16(*be, pixels, channels, 13, 30.0f);
  // gamma up to 60: normalised values reach |y| ~ 100, where the fast silu's error (it grows with
  // |y|) shows and y < -87 takes the flushed quotient.
  Tensor gamma = testing::random_bf16(*be, 1, channels, 14, 60.0f).reshape({channels});
  Tensor beta = testing::random_bf16(*be, 1, channels, 15, 4.0f).reshape({channels});
  Tensor exact = be->empty(DType::kBF16, {pixels, channels}).value();
  Tensor fast = be->empty(DType::kBF16, {pixels, channels}).value();
  ASSERT_TRUE(be->group_norm(x, groups, gamma, beta, 1e-6f, /*silu=*/true, exact).ok());
  {
    const RequestScope high(*be, {Quality::kHigh, /*fast_paths=*/false});
    ASSERT_TRUE(be->group_norm(x, groups, gamma, beta, 1e-6f, /*silu=*/true, fast).ok());
  }
  EXPECT_GT(differing_within_bound(*be, exact, fast, 7, "GroupNorm + SiLU"), 0)
      << "quality=high computed the exact silu";
}

}  // namespace
}  // namespace flux2
