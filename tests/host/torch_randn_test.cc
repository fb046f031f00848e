// torch_randn_f32 / torch_randn_bf16 against the torch goldens (tiny-klein/randn.safetensors and
// the pipeline's initial latents), the draw layout checked against an independent mt19937, and
// statistical, determinism and prefix properties.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/base/dtype.h"
#include "model/safetensors.h"
#include "model/torch_randn.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

constexpr double kPi = 3.14159265358979323846;
// tests/data/README.md: "randn: the float32 values within 1e-6 absolute"; bf16 is compared exactly.
constexpr double kF32AbsTolerance = 1e-6;

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double{a[i]} - b[i]));
  return worst;
}

std::vector<float> head(const std::vector<float>& values, size_t count) {
  return std::vector<float>(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(count));
}

TEST(TorchRandnTest, MatchesEveryGoldenTensor) {
  auto file = SafetensorsFile::open(testing::test_data_dir() + "/tiny-klein/randn.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  int checked_f32 = 0, checked_bf16 = 0;
  bool saw_scalar_path = false, saw_large = false;
  for (const SafetensorsEntry& entry : (*file)->entries()) {
    SCOPED_TRACE(entry.name);
    const std::vector<std::string> parts =
        absl::StrSplit(entry.name, '.');  // seed42 . 1x128x64x64 . f32
    ASSERT_EQ(parts.size(), 3u);
    uint64_t seed = 0;
    ASSERT_TRUE(absl::SimpleAtoi(parts[0].substr(4), &seed));
    const int64_t numel = shape_numel(entry.shape);
    auto reference = read_f32(**file, entry.name);
    ASSERT_TRUE(reference.ok()) << reference.status();
    saw_scalar_path |= numel < 16;
    saw_large |= numel >= 1 << 19;
    if (parts[2] == "bf16") {
      EXPECT_EQ(torch_randn_bf16(seed, numel), *reference);
      ++checked_bf16;
    } else {
      const std::vector<float> ours = torch_randn_f32(seed, numel);
      ASSERT_EQ(ours.size(), reference->size());
      EXPECT_LE(max_abs_diff(ours, *reference), kF32AbsTolerance);
      ++checked_f32;
    }
  }
  EXPECT_GE(checked_f32, 6);
  EXPECT_EQ(checked_f32, checked_bf16);
  EXPECT_TRUE(saw_scalar_path);  // the 15-element case (< 16: the scalar sampler)
  EXPECT_TRUE(saw_large);        // [1, 128, 64, 64]: the 1024 x 1024 noise size
}

// The pipeline goldens start from randn([1, 128, h, w]) of the request seed (float32 pipeline).
TEST(TorchRandnTest, MatchesPipelineInitialLatents) {
  auto file = SafetensorsFile::open(testing::test_data_dir() + "/tiny-klein/pipeline.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const std::pair<const char*, uint64_t> cases[] = {{"case0.initial_latents", 100},
                                                    {"case1.initial_latents", 101}};
  for (const auto& [name, seed] : cases) {
    auto reference = read_f32(**file, name);
    ASSERT_TRUE(reference.ok()) << reference.status();
    const std::vector<float> ours = torch_randn_f32(seed, static_cast<int64_t>(reference->size()));
    EXPECT_LE(max_abs_diff(ours, *reference), kF32AbsTolerance) << name;
  }
}

// An independent model of the generator: standard MT19937 on the low 32 bits of the seed.
struct Draws {
  explicit Draws(uint64_t seed) : engine(static_cast<uint32_t>(seed)) {}
  double uniform(int bits) {
    return static_cast<double>(engine() & ((1u << bits) - 1)) / (1u << bits);
  }
  double uniform53() {
    const uint64_t high = engine(), low = engine();
    return static_cast<double>(((high << 32) | low) & ((uint64_t{1} << 53) - 1)) /
           9007199254740992.0;
  }
  std::mt19937 engine;
};

// Box-Muller pair (x[i], x[i + 8]) from uniforms u1 (radius) and u2 (angle): x[i]^2 + x[i+8]^2 =
// -2 ln(1 - u1) and atan2(x[i+8], x[i]) = 2 pi u2 (mod 2 pi). `rel` bounds the error of the radius.
void expect_pair(float a, float b, double u1, double u2, double rel) {
  const double r2 = double{a} * a + double{b} * b;
  const double expected_r2 = -2.0 * std::log(1.0 - u1);
  EXPECT_NEAR(r2, expected_r2, rel * expected_r2 + 1e-6);
  if (expected_r2 > 1e-3) {
    double angle = std::atan2(double{b}, double{a});
    if (angle < 0) angle += 2 * kPi;
    double diff = std::fabs(angle - 2 * kPi * u2);
    diff = std::min(diff, 2 * kPi - diff);
    EXPECT_LT(diff, 20 * rel + 1e-5);
  }
}

TEST(TorchRandnTest, Float32ChunkPairsElementIWithIPlus8) {
  // float32: 24-bit uniforms, one per element, chunks of 16 paired (i, i + 8).
  const std::vector<float> x = torch_randn_f32(3, 32);
  Draws draws(3);
  std::vector<double> u(32);
  for (double& value : u) value = draws.uniform(24);
  for (int chunk = 0; chunk < 2; ++chunk) {
    for (int j = 0; j < 8; ++j) {
      const int i = chunk * 16 + j;
      expect_pair(x[i], x[i + 8], u[i], u[i + 8], 1e-5);
    }
  }
}

TEST(TorchRandnTest, TailIsRecomputedFromSixteenFreshDraws) {
  // n = 20: draws 0..19 fill the tensor, chunk [0, 16) is transformed, then draws 20..35 refill
  // positions 4..19, which are transformed as one chunk; positions 0..3 keep the first chunk.
  const std::vector<float> x = torch_randn_f32(11, 20);
  Draws draws(11);
  std::vector<double> u(36);
  for (double& value : u) value = draws.uniform(24);
  for (int j = 0; j < 4; ++j)
    expect_pair(x[j], torch_randn_f32(11, 16)[j + 8], u[j], u[j + 8], 1e-5);
  for (int j = 0; j < 8; ++j) expect_pair(x[4 + j], x[12 + j], u[20 + j], u[28 + j], 1e-5);
  EXPECT_EQ(head(x, 4), head(torch_randn_f32(11, 16), 4));
}

TEST(TorchRandnTest, Bf16UsesEightBitUniformsAndRoundsToBf16) {
  const std::vector<float> x = torch_randn_bf16(5, 16);
  Draws draws(5);
  std::vector<double> u(16);
  for (double& value : u) value = draws.uniform(8);
  // Each output is rounded to bf16 (relative error 2^-9) after bf16 intermediate roundings of
  // log, sqrt, theta and cos/sin: a few 2^-8 on r^2; 3% covers it with margin.
  for (int j = 0; j < 8; ++j) expect_pair(x[j], x[j + 8], u[j], u[j + 8], 0.03);
  for (float value : x) EXPECT_EQ(value, round_to_bf16(value));
  // 8-bit uniforms: u1 >= 1/256, so |x| <= sqrt(2 ln 256) = 3.33 for every sample.
  const std::vector<float> many = torch_randn_bf16(5, 1 << 16);
  const float largest = std::fabs(*std::max_element(
      many.begin(), many.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); }));
  EXPECT_LE(largest, 3.34f);
}

TEST(TorchRandnTest, ShortTensorsUseTheCachedDoubleSampler) {
  // n < 16: element 2k = r cos(theta), element 2k + 1 = the cached r sin(theta), from two 53-bit
  // draws per pair (u1 for the angle, u2 for the radius).
  const std::vector<float> x = torch_randn_f32(8, 15);
  Draws draws(8);
  for (int k = 0; k < 7; ++k) {
    const double u1 = draws.uniform53(), u2 = draws.uniform53();
    const double radius = std::sqrt(-2.0 * std::log1p(-u2));
    EXPECT_NEAR(x[2 * k], radius * std::cos(2 * kPi * u1), 1e-6) << k;
    EXPECT_NEAR(x[2 * k + 1], radius * std::sin(2 * kPi * u1), 1e-6) << k;
  }
  // The same sequence whatever the length below 16, in both dtypes.
  EXPECT_EQ(torch_randn_f32(8, 7), head(x, 7));
  const std::vector<float> bf16 = torch_randn_bf16(8, 15);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(bf16[i], round_to_bf16(x[i])) << i;
  // ... and unrelated to the chunked layout used from 16 elements on.
  EXPECT_NE(torch_randn_f32(8, 16)[0], x[0]);
}

TEST(TorchRandnTest, PrefixesAgreeUpToTheRecomputedTail) {
  const std::vector<float> big = torch_randn_f32(42, 4096);
  for (int64_t n : {16, 32, 48, 1024}) EXPECT_EQ(torch_randn_f32(42, n), head(big, n)) << n;
  for (int64_t n : {17, 40, 1000}) {
    const std::vector<float> x = torch_randn_f32(42, n);
    const size_t stable = static_cast<size_t>(n / 16 * 16 - 16);
    EXPECT_EQ(head(x, stable), head(big, stable)) << n;
    // The last 16 values come from fresh draws, not from the longer tensor's values.
    EXPECT_NE(std::vector<float>(x.end() - 16, x.end()),
              std::vector<float>(big.begin() + n - 16, big.begin() + n))
        << n;
  }
  const std::vector<float> big_bf16 = torch_randn_bf16(42, 4096);
  EXPECT_EQ(torch_randn_bf16(42, 2048), head(big_bf16, 2048));
}

TEST(TorchRandnTest, DeterministicPerSeedAndSeedIsTruncatedTo32Bits) {
  EXPECT_EQ(torch_randn_f32(1234, 1000), torch_randn_f32(1234, 1000));
  EXPECT_NE(torch_randn_f32(1234, 1000), torch_randn_f32(1235, 1000));
  EXPECT_NE(torch_randn_bf16(1234, 1000), torch_randn_bf16(1235, 1000));
  // The CPU generator's mt19937 keeps only the low 32 bits of the seed.
  EXPECT_EQ(torch_randn_f32(7 + (uint64_t{1} << 32), 64), torch_randn_f32(7, 64));
  EXPECT_TRUE(torch_randn_f32(1, 0).empty());
  EXPECT_TRUE(torch_randn_bf16(1, -5).empty());
}

TEST(TorchRandnTest, MomentsOfALargeDraw) {
  const int64_t n = 1 << 20;
  const std::vector<float> x = torch_randn_f32(2024, n);
  double sum = 0.0, squares = 0.0;
  for (float v : x) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    squares += double{v} * v;
  }
  const double mean = sum / n, variance = squares / n - mean * mean;
  // Standard errors for N(0, 1): mean 1/sqrt(n) = 0.001, variance sqrt(2/n) = 0.0014; 5 sigma.
  EXPECT_LT(std::fabs(mean), 5.0 / std::sqrt(double(n)));
  EXPECT_LT(std::fabs(variance - 1.0), 5.0 * std::sqrt(2.0 / n));

  // bf16: u1 takes the 256 values k / 256, so E[r^2] = -2 mean(ln(k / 256)) = 1.971 and each
  // coordinate's variance is E[r^2] / 2 = 0.9856 (the Gaussian tail beyond 3.33 is cut off).
  double expected_r2 = 0.0;
  for (int k = 1; k <= 256; ++k) expected_r2 += -2.0 * std::log(k / 256.0) / 256.0;
  const std::vector<float> y = torch_randn_bf16(2024, n);
  sum = squares = 0.0;
  for (float v : y) {
    sum += v;
    squares += double{v} * v;
  }
  const double mean_bf16 = sum / n, variance_bf16 = squares / n - mean_bf16 * mean_bf16;
  EXPECT_LT(std::fabs(mean_bf16), 5.0 / std::sqrt(double(n)));
  // 5 sigma of the sample variance plus bf16 rounding of every value (relative 2^-9, so about
  // 2^-8 on squares at worst, far less on average).
  EXPECT_NEAR(variance_bf16, expected_r2 / 2.0, 5.0 * std::sqrt(2.0 / n) + 1.0 / 256);
}

}  // namespace
}  // namespace flux2
