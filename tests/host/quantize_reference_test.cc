// The FP8 / NVFP4 software conversions and CPU quantizer references of kernels/base/fp8_nvfp4.h
// against slow definition-based references (exhaustive over bf16), the 128x4 scale layout, the
// recipe's test vectors (the static input-scale recipe's hand-computed codes among them), and the
// fused-concat comparisons tests/cuda/quantize_test.cc makes on the GPU. Run: build/bin/host_tests
// --gtest_filter='Quantize*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/base/uniform_hash.h"

#if __has_include(<cuda_fp4.h>)
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#define FLUX2_HAVE_CUDA_FP_HEADERS 1
#endif

namespace flux2 {
namespace {

// ---- slow references, written from the format definitions only ----

float from_bf16(uint32_t bits) {
  return f32_from_bits(bits << 16);
}

// Value of E4M3 magnitude code c (0..0x7E) from the definition: bias 7, subnormals m/8 * 2^-6.
double e4m3_definition(int c) {
  const int e = c >> 3, m = c & 7;
  return e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
}

// Value of E2M1 magnitude code c (0..7): bias 1, subnormal m/2.
double e2m1_definition(int c) {
  const int e = c >> 1, m = c & 1;
  return e == 0 ? m / 2.0 : std::ldexp(1.0 + m / 2.0, e - 1);
}

// The nearest of `count` magnitudes (value(c), increasing in c) to |x|, ties to the even code.
template <typename Value>
int nearest_code(double a, int count, Value value) {
  int best = 0;
  double best_distance = std::fabs(a - value(0));
  for (int c = 1; c < count; ++c) {
    const double distance = std::fabs(a - value(c));
    if (distance < best_distance || (distance == best_distance && (c & 1) == 0)) {
      best = c;
      best_distance = distance;
    }
  }
  return best;
}

uint8_t slow_e4m3(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 448.0) return sign | 0x7e;  // saturate (inf too)
  return sign | static_cast<uint8_t>(nearest_code(a, 0x7f, e4m3_definition));
}

uint8_t slow_ue4m3(float x) {
  if (std::isnan(x)) return 0x7f;
  if (!(x > 0.0f)) return 0;
  return slow_e4m3(x);
}

uint8_t slow_e2m1(float x) {
  if (std::isnan(x)) return 0x7;
  const uint8_t sign = std::signbit(x) ? 0x8 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 6.0) return sign | 0x7;
  return sign | static_cast<uint8_t>(nearest_code(a, 8, e2m1_definition));
}

// Scale offset from the torchao description (to_blocked): the [rows/128, 4, 32, k/4, 4] view
// permuted to (0, 3, 2, 1, 4), i.e. an index over [row tile][k tile][row % 32][row quarter][k % 4].
int64_t permute_offset(int64_t m, int64_t kb, int64_t k_tiles) {
  const int64_t rb = m / 128, quarter = (m % 128) / 32, j = m % 32, cb = kb / 4, cc = kb % 4;
  return (((rb * k_tiles + cb) * 32 + j) * 4 + quarter) * 4 + cc;
}

// ---- exhaustive conversion tests ----

TEST(QuantizeConversionTest, E4M3ExhaustiveOverBf16) {
  int64_t mismatches = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float x = from_bf16(b);
    const uint8_t fast = f32_to_e4m3(x), slow = slow_e4m3(x);
    if (fast != slow && ++mismatches <= 10) {
      ADD_FAILURE() << "bf16 0x" << std::hex << b << " = " << x << ": 0x" << int{fast} << " vs 0x"
                    << int{slow};
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(QuantizeConversionTest, E2M1ExhaustiveOverBf16) {
  int64_t mismatches = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float x = from_bf16(b);
    const uint8_t fast = f32_to_e2m1(x), slow = slow_e2m1(x);
    if (fast != slow && ++mismatches <= 10) {
      ADD_FAILURE() << "bf16 0x" << std::hex << b << " = " << x << ": 0x" << int{fast} << " vs 0x"
                    << int{slow};
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(QuantizeConversionTest, Ue4m3ExhaustiveOverBf16) {
  int64_t mismatches = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float x = from_bf16(b);
    mismatches += f32_to_ue4m3(x) != slow_ue4m3(x);
  }
  EXPECT_EQ(mismatches, 0);
}

// f32 inputs bf16 cannot hold: every midpoint between neighbouring codes (the ties) and the f32
// values one ulp either side of it, for both formats and both signs.
TEST(QuantizeConversionTest, TiesAndNeighboursInF32) {
  std::vector<float> inputs;
  auto around = [&](double midpoint) {
    const float m = static_cast<float>(midpoint);
    ASSERT_EQ(static_cast<double>(m), midpoint);  // every midpoint is an f32
    for (float v : {m, std::nextafter(m, 0.0f), std::nextafter(m, INFINITY)}) {
      inputs.push_back(v);
      inputs.push_back(-v);
    }
  };
  for (int c = 0; c < 0x7e; ++c) around((e4m3_definition(c) + e4m3_definition(c + 1)) / 2);
  for (int c = 0; c < 7; ++c) around((e2m1_definition(c) + e2m1_definition(c + 1)) / 2);
  around(464.0);  // 448 + half an ulp: still 448 under satfinite
  for (float v :
       {0.0f, 448.0f, 6.0f, 1e-30f, 1e30f, std::numeric_limits<float>::denorm_min(), INFINITY}) {
    inputs.push_back(v);
    inputs.push_back(-v);
  }
  for (float x : inputs) {
    EXPECT_EQ(f32_to_e4m3(x), slow_e4m3(x)) << x;
    EXPECT_EQ(f32_to_e2m1(x), slow_e2m1(x)) << x;
  }
  // The documented specials.
  EXPECT_EQ(f32_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e4m3(std::nanf("")), 0x7f);
  EXPECT_EQ(f32_to_e4m3(-std::nanf("")), 0x7f);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: tie to 0
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7e);
  EXPECT_EQ(f32_to_e2m1(-0.1f), 0x8);
  EXPECT_EQ(f32_to_e2m1(-INFINITY), 0xf);
  EXPECT_EQ(f32_to_e2m1(-std::nanf("")), 0x7);
  // The ties, to the even code.
  const std::vector<std::pair<float, uint8_t>> ties = {
      {0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4}, {3.5f, 6}, {5.0f, 6}};
  for (const auto& [x, code] : ties) EXPECT_EQ(f32_to_e2m1(x), code) << x;
}

TEST(QuantizeConversionTest, DecodersMatchTheDefinitionAndRoundTrip) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_f32(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    const double expected = ((c & 0x80) ? -1.0 : 1.0) * e4m3_definition(c & 0x7f);
    EXPECT_EQ(static_cast<double>(v), expected) << c;
    EXPECT_EQ(std::signbit(v), (c & 0x80) != 0) << c;
    EXPECT_EQ(f32_to_e4m3(v), c);
    if (c < 0x80) {
      EXPECT_EQ(ue4m3_to_f32(static_cast<uint8_t>(c)), v);
    }
  }
  for (int c = 0; c < 16; ++c) {
    const float v = e2m1_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(static_cast<double>(v), ((c & 8) ? -1.0 : 1.0) * e2m1_definition(c & 7)) << c;
    EXPECT_EQ(std::signbit(v), (c & 8) != 0) << c;
    EXPECT_EQ(f32_to_e2m1(v), c);
  }
}

#if defined(FLUX2_HAVE_CUDA_FP_HEADERS)
// NVIDIA's own host software conversions (cuda_fp8.hpp / cuda_fp4.hpp) agree on f32 inputs: every
// combination of the top 20 bits with low bits that straddle each rounding position.
TEST(QuantizeConversionTest, MatchesCudaHeadersOnF32Sample) {
  const uint32_t lows[] = {0x000, 0x001, 0x7ff, 0x800, 0x801, 0xfff};
  int64_t bad4 = 0, bad2 = 0;
  for (uint32_t top = 0; top < (1u << 20); ++top) {
    for (uint32_t low : lows) {
      const float x = f32_from_bits((top << 12) | low);
      bad4 += f32_to_e4m3(x) != __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
      bad2 += f32_to_e2m1(x) != __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
    }
  }
  EXPECT_EQ(bad4, 0);
  EXPECT_EQ(bad2, 0);
}
#endif

// ---- the 128x4 swizzled scale layout ----

TEST(QuantizeScaleLayoutTest, OffsetsAreABijectionOntoThePaddedBuffer) {
  for (int64_t rows : {1, 17, 127, 128, 129, 300, 4611}) {
    for (int64_t cols : {16, 48, 64, 96, 112, 1040, 3072}) {
      const int64_t padded_rows = nvfp4_scale_padded_rows(rows),
                    padded_blocks = nvfp4_scale_padded_blocks(cols);
      const int64_t bytes = nvfp4_scale_bytes(rows, cols), k_tiles = padded_blocks / 4;
      ASSERT_EQ(padded_rows % 128, 0);
      ASSERT_EQ(padded_blocks % 4, 0);
      ASSERT_GE(padded_blocks * 16, cols);
      ASSERT_LT(padded_blocks * 16, cols + 64);
      ASSERT_EQ(bytes, padded_rows * padded_blocks);
      std::vector<uint8_t> hit(static_cast<size_t>(bytes), 0);
      for (int64_t m = 0; m < padded_rows; ++m) {
        for (int64_t kb = 0; kb < padded_blocks; ++kb) {
          const int64_t off = nvfp4_scale_offset(m, kb, k_tiles);
          ASSERT_GE(off, 0);
          ASSERT_LT(off, bytes);
          ASSERT_EQ(hit[off]++, 0)
              << "rows " << rows << " cols " << cols << ": offset " << off << " twice";
          ASSERT_EQ(off, permute_offset(m, kb, k_tiles));
        }
      }
    }
  }
  // Anchors of the formula: 16 bytes per row inside a 32-row group, 4 per quarter, 512 per tile.
  EXPECT_EQ(nvfp4_scale_offset(1, 0, 3), 16);
  EXPECT_EQ(nvfp4_scale_offset(32, 0, 3), 4);
  EXPECT_EQ(nvfp4_scale_offset(0, 3, 3), 3);
  EXPECT_EQ(nvfp4_scale_offset(0, 4, 3), 512);
  EXPECT_EQ(nvfp4_scale_offset(128, 0, 3), 3 * 512);
  EXPECT_EQ(nvfp4_scale_bytes(17, 16 * 6), 128 * 8);
}

// ---- recipe test vectors ----

TEST(QuantizeNvfp4RecipeTest, BlockHoldingTheTensorMaxGetsScale448) {
  // Every positive finite bf16 amax for which 2688 / amax is finite (below that gs saturates to
  // FLT_MAX): the amax block's SF rounds to 448.
  for (uint32_t b = 1; b < 0x7f80; ++b) {
    const float amax = from_bf16(b);
    if (2688.0 / amax > FLT_MAX) continue;
    const float gs = nvfp4_global_scale(amax);
    ASSERT_EQ(f32_to_e4m3(nvfp4_block_scale_value(amax, gs)), 0x7e) << amax;
    float x[16] = {amax};
    uint8_t packed[8];
    ASSERT_EQ(nvfp4_quantize_block16(x, gs, packed), 0x7e);
    ASSERT_EQ(packed[0], 0x07) << amax;  // amax itself maps to 6
  }
  EXPECT_EQ(nvfp4_global_scale(0.0f), FLT_MAX);
  EXPECT_EQ(fp8_dequant_scale(0.0f), 1.0f);
  EXPECT_EQ(fp8_dequant_scale(448.0f), 1.0f);
  EXPECT_TRUE(std::isnan(fp8_dequant_scale(std::nanf(""))));
}

TEST(QuantizeNvfp4RecipeTest, TiePointsUnderUnitScale) {
  // gs = 1 and vmax = 6: SF = 6 * fl(1/6) rounds to the e4m3 code of 1.0, outScale = 1, so the
  // codes are the e2m1 conversions of the inputs themselves.
  const float x[16] = {6.0f,   0.25f,  0.75f, 1.25f, 1.75f, 2.5f, 3.5f,  5.0f,
                       -0.25f, -0.75f, -5.0f, -0.0f, 0.0f,  0.2f, -6.0f, 5.5f};
  const uint8_t expected[16] = {0x7, 0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6,
                                0x8, 0xa, 0xe, 0x8, 0x0, 0x0, 0xf, 0x7};
  uint8_t packed[8];
  ASSERT_EQ(nvfp4_quantize_block16(x, 1.0f, packed), 0x38);  // e4m3(1.0)
  EXPECT_EQ(nvfp4_out_scale(0x38, 1.0f), 1.0f);
  for (int i = 0; i < 16; ++i) EXPECT_EQ((packed[i / 2] >> (4 * (i % 2))) & 0xf, expected[i]) << i;
}

TEST(QuantizeNvfp4RecipeTest, EveryScaleCodeAndTinyBlocks) {
  for (int c = 1; c < 0x7f; ++c) {
    const float v = e4m3_to_f32(static_cast<uint8_t>(c));
    const float x[16] = {6.0f * v, -3.0f * v, v};
    uint8_t packed[8];
    ASSERT_EQ(nvfp4_quantize_block16(x, 1.0f, packed), c) << v;
    EXPECT_EQ(packed[0], 0xd7) << v;  // 6v -> 6, -3v -> -3
    EXPECT_EQ(packed[1], 0x02) << v;  // v -> 1
  }
  // A block whose scale rounds to 0 (SF < 2^-10) gets all-zero codes, not ±6.
  const float tiny[16] = {1e-4f, -1e-4f, 0.0f, 5e-5f};
  uint8_t packed[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(nvfp4_quantize_block16(tiny, 1.0f, packed), 0);
  for (uint8_t p : packed) EXPECT_EQ(p, 0);
}

// ---- matrix references ----

// Random bf16 bits with per-16-block magnitudes 2^-16 .. 2^7 (so some blocks get a zero NVFP4
// scale), exact zeros and negative zeros. The same generator as tests/cuda/quantize_test.cc.
uint16_t test_bits(uint64_t seed, int64_t r, int64_t c) {
  const float u =
      uniform_hash(seed, static_cast<uint64_t>(r) * 1000003u + static_cast<uint64_t>(c));
  const float e = uniform_hash(seed ^ 0x5555u,
                               static_cast<uint64_t>(r) * 65537u + static_cast<uint64_t>(c / 16));
  if (u < 0.01f) return u < 0.005f ? 0x0000 : 0x8000;
  const float v = std::ldexp(2.0f * u - 1.0f, static_cast<int>(e * 24.0f) - 16);
  return static_cast<uint16_t>(f32_bits(v) >> 16);  // truncation: any bf16 is fine here
}

struct HostMatrix {
  std::vector<uint16_t> bits;
  int64_t rows = 0, cols = 0, stride = 0;
  Bf16HostView view() const { return {bits.data(), rows, cols, stride}; }
};

// [rows, cols] with row stride cols + pad.
HostMatrix make_matrix(uint64_t seed, int64_t rows, int64_t cols, int64_t pad) {
  HostMatrix m{std::vector<uint16_t>(static_cast<size_t>(rows * (cols + pad)), 0x7fc0), rows, cols,
               cols + pad};
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) m.bits[r * m.stride + c] = test_bits(seed, r, c);
  }
  return m;
}

HostMatrix concat(const HostMatrix& a, const HostMatrix& b) {
  HostMatrix m{{}, a.rows, a.cols + b.cols, a.cols + b.cols};
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int64_t c = 0; c < a.cols; ++c) m.bits.push_back(a.bits[r * a.stride + c]);
    for (int64_t c = 0; c < b.cols; ++c) m.bits.push_back(b.bits[r * b.stride + c]);
  }
  return m;
}

// Slow NVFP4 reference: per block from the recipe's formulas with the slow conversions, scales
// placed by the permute formula.
void slow_nvfp4(const HostMatrix& x, float gs, std::vector<uint8_t>& packed,
                std::vector<uint8_t>& scales) {
  const int64_t k_tiles = nvfp4_scale_padded_blocks(x.cols) / 4;
  packed.assign(static_cast<size_t>(x.rows * x.cols / 2), 0);
  scales.assign(static_cast<size_t>(nvfp4_scale_bytes(x.rows, x.cols)), 0);
  for (int64_t r = 0; r < x.rows; ++r) {
    for (int64_t kb = 0; kb < x.cols / 16; ++kb) {
      float vmax = 0.0f;
      for (int i = 0; i < 16; ++i)
        vmax = std::max(vmax, std::fabs(from_bf16(x.bits[r * x.stride + kb * 16 + i])));
      const float sf_value = vmax * (gs * (1.0f / 6.0f));
      const uint8_t sf = slow_ue4m3(sf_value);
      scales[permute_offset(r, kb, k_tiles)] = sf;
      if (sf == 0) continue;
      const float out_scale =
          std::fmin(1.0f / (static_cast<float>(e4m3_definition(sf)) * (1.0f / gs)), FLT_MAX);
      for (int i = 0; i < 16; ++i) {
        const uint8_t code = slow_e2m1(from_bf16(x.bits[r * x.stride + kb * 16 + i]) * out_scale);
        packed[(r * x.cols + kb * 16 + i) / 2] |= static_cast<uint8_t>(code << (4 * (i % 2)));
      }
    }
  }
}

struct Shape {
  int64_t rows, d, f;  // [rows, d] | [rows, f]
};

class QuantizeMatrixTest : public ::testing::TestWithParam<Shape> {};

TEST_P(QuantizeMatrixTest, Fp8PerTensorMatchesSlowReferenceAndConcat) {
  const auto [rows, d, f] = GetParam();
  const HostMatrix a = make_matrix(11, rows, d, 8), b = make_matrix(12, rows, f, 24),
                   cat = concat(a, b);
  const int64_t k = d + f;
  const float amax = reference_amax(a.view(), b.view());
  float slow_amax = 0.0f;
  for (uint16_t v : cat.bits) slow_amax = std::max(slow_amax, std::fabs(from_bf16(v)));
  ASSERT_EQ(amax, slow_amax);
  ASSERT_GT(amax, 0.0f);
  const float scale = fp8_dequant_scale(amax);
  EXPECT_EQ(scale, amax / 448.0f);
  std::vector<uint8_t> fused(static_cast<size_t>(rows * k)), plain(fused.size());
  reference_fp8_quantize(a.view(), b.view(), scale, fused.data());
  reference_fp8_quantize(cat.view(), Bf16HostView{}, scale, plain.data());
  EXPECT_EQ(fused, plain);
  int64_t saturated = 0;
  for (int64_t i = 0; i < rows * k; ++i) {
    const float x = from_bf16(cat.bits[i]);
    ASSERT_EQ(plain[i], slow_e4m3(x * (1.0f / scale))) << i;
    saturated += (plain[i] & 0x7f) == 0x7e;
    if (std::fabs(x) == amax) {
      EXPECT_EQ(plain[i] & 0x7f, 0x7e);  // the max maps to ±448
    }
  }
  EXPECT_GE(saturated, 1);
  EXPECT_GE(std::set<uint8_t>(plain.begin(), plain.end()).size(), 10u);  // non-trivial output
}

// A checkpoint's static input_scale (--fp8-input-scale static): codes e4m3(x / scale) with one
// correctly rounded division (in double: exact before the f32 rounding), saturating at ±448; the
// concatenation quantizes as the materialized matrix does.
TEST_P(QuantizeMatrixTest, Fp8StaticMatchesSlowReferenceAndConcat) {
  const auto [rows, d, f] = GetParam();
  const HostMatrix a = make_matrix(14, rows, d, 8), b = make_matrix(15, rows, f, 24),
                   cat = concat(a, b);
  const int64_t k = d + f;
  const float scale = 0.6f * fp8_dequant_scale(reference_amax(a.view(), b.view()));  // saturates
  std::vector<uint8_t> fused(static_cast<size_t>(rows * k)), plain(fused.size());
  reference_fp8_quantize_static(a.view(), b.view(), scale, fused.data());
  reference_fp8_quantize_static(cat.view(), Bf16HostView{}, scale, plain.data());
  EXPECT_EQ(fused, plain);
  int64_t saturated = 0;
  for (int64_t i = 0; i < rows * k; ++i) {
    const double quotient = static_cast<double>(from_bf16(cat.bits[i])) / scale;
    ASSERT_EQ(plain[i], slow_e4m3(static_cast<float>(quotient))) << i;
    saturated += (plain[i] & 0x7f) == 0x7e;
  }
  EXPECT_GE(saturated, 1);
  EXPECT_GE(std::set<uint8_t>(plain.begin(), plain.end()).size(), 10u);  // non-trivial output
}

// Hand-computed static codes: x / scale then E4M3 (RNE, satfinite); and the division differs
// from fp8_quantize_value's product with the rounded reciprocal where that product rounds the
// other way at an E4M3 tie.
TEST(QuantizeStaticValueTest, HandComputedCodes) {
  EXPECT_EQ(fp8_quantize_static_value(1.0f, 0.5f), 0x40);     // 2 = 2^1 x 1.000
  EXPECT_EQ(fp8_quantize_static_value(-3.25f, 0.25f), 0xD5);  // -13 = -2^3 x 1.625
  EXPECT_EQ(fp8_quantize_static_value(0.1f, 0.01f), 0x52);    // ~10 = 2^3 x 1.25
  EXPECT_EQ(fp8_quantize_static_value(1000.0f, 1.0f), 0x7E);  // saturates at 448
  EXPECT_EQ(fp8_quantize_static_value(-5.0f, 0.01f), 0xFE);   // -500: -448
  EXPECT_EQ(fp8_quantize_static_value(17.0f, 1.0f), 0x58);    // tie 17 between 16 and 18: even 16
  EXPECT_EQ(fp8_quantize_static_value(std::nanf(""), 1.0f), 0x7F);
  // x = the E4M3 ties 8.5, 9.5, ..., 15.5 times many scales, rounded to f32: the quotient lands
  // within an ulp of the tie; the division equals the slow reference everywhere, and somewhere
  // the reciprocal product falls on the other side of the tie.
  int64_t differ = 0;
  for (uint32_t i = 0; i < (1u << 19); ++i) {
    const float scale = 0.0123f + static_cast<float>(i % 65536) * 1e-7f;
    const float x = (8.5f + static_cast<float>(i >> 16)) * scale;
    const uint8_t code = fp8_quantize_static_value(x, scale);
    ASSERT_EQ(code, slow_e4m3(static_cast<float>(static_cast<double>(x) / scale))) << i;
    differ += code != fp8_quantize_value(x, scale);
  }
  EXPECT_GT(differ, 0) << "no input tells the division from the reciprocal product";
}

TEST_P(QuantizeMatrixTest, Fp8PerRowMatchesSlowReference) {
  const auto [rows, d, f] = GetParam();
  const HostMatrix x = make_matrix(13, rows, d + f, 8);
  std::vector<float> scales(static_cast<size_t>(rows));
  std::vector<uint8_t> out(static_cast<size_t>(rows * x.cols));
  reference_fp8_quantize_rows(x.view(), scales.data(), out.data());
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0.0f;
    for (int64_t c = 0; c < x.cols; ++c)
      amax = std::max(amax, std::fabs(from_bf16(x.bits[r * x.stride + c])));
    ASSERT_EQ(scales[r], amax / 448.0f);
    for (int64_t c = 0; c < x.cols; ++c) {
      ASSERT_EQ(out[r * x.cols + c],
                slow_e4m3(from_bf16(x.bits[r * x.stride + c]) * (1.0f / scales[r])));
    }
  }
}

TEST_P(QuantizeMatrixTest, Nvfp4MatchesSlowReferenceAndConcat) {
  const auto [rows, d, f] = GetParam();
  const HostMatrix a = make_matrix(21, rows, d, 8), b = make_matrix(22, rows, f, 40),
                   cat = concat(a, b);
  const int64_t k = d + f;
  const float gs = nvfp4_global_scale(reference_amax(a.view(), b.view()));
  const size_t scale_bytes = static_cast<size_t>(nvfp4_scale_bytes(rows, k));
  std::vector<uint8_t> packed(static_cast<size_t>(rows * k / 2)), scales(scale_bytes, 0xab);
  std::vector<uint8_t> cat_packed(packed.size()), cat_scales(scale_bytes, 0xcd);
  reference_nvfp4_quantize(a.view(), b.view(), gs, packed.data(), scales.data());
  reference_nvfp4_quantize(cat.view(), Bf16HostView{}, gs, cat_packed.data(), cat_scales.data());
  EXPECT_EQ(packed, cat_packed);
  EXPECT_EQ(scales, cat_scales);
  std::vector<uint8_t> slow_packed, slow_scales;
  slow_nvfp4(cat, gs, slow_packed, slow_scales);
  EXPECT_EQ(packed, slow_packed);
  EXPECT_EQ(scales, slow_scales);
  // Non-trivial: the 448 block; on the larger shapes many scale codes, zero-scale blocks and every
  // value code (-0 included).
  const std::set<uint8_t> codes(scales.begin(), scales.end());
  EXPECT_TRUE(codes.count(0x7e));
  if (rows * k >= 4096) {
    EXPECT_GT(codes.size(), 20u);
    std::set<int> nibbles;
    for (uint8_t p : packed) nibbles.insert({p & 0xf, p >> 4});
    EXPECT_EQ(nibbles.size(), 16u);
  }
}

// The GPU test's shapes that are cheap on the CPU, plus concat splits that are not multiples of 16
// (D % 8 == 0 takes the vectorized GPU loads, D % 8 != 0 the scalar ones).
INSTANTIATE_TEST_SUITE_P(Quantize, QuantizeMatrixTest,
                         ::testing::Values(Shape{17, 48, 48}, Shape{130, 64, 32}, Shape{1, 16, 80},
                                           Shape{64, 40, 56}, Shape{33, 20, 76},
                                           Shape{129, 384, 1152}, Shape{5, 96, 0}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return absl::StrCat("M", info.param.rows, "_D", info.param.d, "_F",
                                               info.param.f);
                         });

}  // namespace
}  // namespace flux2
