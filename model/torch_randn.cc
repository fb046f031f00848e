// torch.randn on PyTorch's CPU generator, re-implemented bit for bit; see torch_randn.h.
// Tested by tests/host/torch_randn_test.cc and `flux2 check-golden --only randn`
// (tiny-klein/randn.safetensors).
//
// What torch (x86-64 build, any AVX2-capable CPU; torch 2.11 made the goldens) does for
// `torch.randn(n, generator=torch.Generator().manual_seed(seed))`:
//
// Generator: a 32-bit MT19937 seeded with the low 32 bits of the seed (the standard
//   init_genrand recurrence, i.e. std::mt19937). random() is one 32-bit draw; random64() is two,
//   the first one giving the high half. manual_seed also clears the cached normal sample.
// Uniform draws in [0, 1): the low `digits` bits of a draw times 2^-digits, digits being the
//   significand width of the dtype: 24 bits from random() for float32, 8 bits from random() for
//   bfloat16, 53 bits from random64() for double.
// n >= 16 (contiguous): every element first receives one uniform draw of its dtype. Then each
//   chunk of 16 is replaced in place by Box-Muller over the pairs (i, i + 8):
//   u1 = 1 - x[i], u2 = x[i + 8], r = sqrt(-2 log u1), theta = 2 pi u2,
//   x[i] = r cos theta, x[i + 8] = r sin theta. When n % 16 != 0 the last 16 elements are
//   refilled with 16 fresh uniform draws and transformed again, overwriting the tail of the last
//   full chunk. A value therefore depends only on its chunk's draws: randn(n) and randn(m)
//   agree on every position that lies in a full chunk of both and before both recomputed tails
//   (for lengths that are multiples of 16, randn(n) is a prefix of randn(m), m >= n).
//   - float32 runs the AVX2 kernel: theta = float(2 pi) * u2 in float, and log / sincos are the
//     Cephes single-precision polynomials evaluated in float. GCC builds that kernel with FMA
//     enabled and contracts each multiply whose only use is an add into one fused op, so the
//     emulation below uses std::fma exactly where that happens.
//   - bfloat16 runs the generic scalar kernel on c10::BFloat16: every operation (1 - x, log,
//     -2 *, sqrt, cos, sin, products) is computed in float and rounded to bf16; theta is computed
//     in double and rounded to float, then to bf16.
// n < 16 (any dtype): each element is one sample of the double Box-Muller sampler:
//   u1, u2 = two 53-bit draws, r = sqrt(-2 log1p(-u2)), theta = 2 pi u1; it returns r cos theta and
//   caches r sin theta in the generator, so elements 2k and 2k+1 share one pair of draws. The
//   double is cast to float (and then rounded to bf16 for bfloat16).
#include "model/torch_randn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>

#include "kernels/base/dtype.h"
#include "kernels/base/parallel.h"

namespace flux2 {
namespace {

constexpr double kPi = 3.14159265358979323846;  // c10::pi<double>
constexpr int64_t kChunk = 16;                  // Box-Muller chunk of the vectorised fill

uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float bits_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// The state of a torch.Generator on the CPU after manual_seed(seed).
class CpuGenerator {
 public:
  explicit CpuGenerator(uint64_t seed) : engine_(static_cast<uint32_t>(seed & 0xffffffffu)) {}

  uint32_t random() { return static_cast<uint32_t>(engine_()); }
  uint64_t random64() {
    const uint64_t high = random();
    const uint64_t low = random();
    return (high << 32) | low;
  }

  // uniform_real_distribution<T>(0, 1) for T = float (24 bits), bfloat16 (8 bits), double (53
  // bits).
  float uniform_f32() { return static_cast<float>(random() & 0xffffffu) * 0x1p-24f; }
  float uniform_bf16() { return static_cast<float>(random() & 0xffu) * 0x1p-8f; }
  double uniform_f64() {
    return static_cast<double>(random64() & ((uint64_t{1} << 53) - 1)) * 0x1p-53;
  }

  // normal_distribution<double>(0, 1): Box-Muller, the second value cached for the next call.
  // Both leave through value * std + mean (std 1, mean 0), which turns -0 into +0.
  double normal_f64() {
    if (cached_normal_) {
      const double value = *cached_normal_;
      cached_normal_.reset();
      return value + 0.0;
    }
    const double u1 = uniform_f64();
    const double u2 = uniform_f64();
    const double radius = std::sqrt(-2.0 * std::log1p(-u2));
    const double theta = 2.0 * kPi * u1;
    cached_normal_ = radius * std::sin(theta);
    return radius * std::cos(theta) + 0.0;
  }

 private:
  std::mt19937 engine_;
  std::optional<double> cached_normal_;
};

// ---- float32: the AVX2 kernel, one lane at a time ----------------------------------------------

// Natural log of x in (0, 1] (Cephes logf: x = m 2^e with m in [sqrt(1/2), sqrt(2)), a degree-9
// polynomial in m - 1, and e ln 2 split into two parts).
float avx2_log(float x) {
  constexpr float kSqrtHalf = 0.707106781186547524f;
  constexpr float kPoly[] = {7.0376836292E-2f,  -1.1514610310E-1f, 1.1676998740E-1f,
                             -1.2420140846E-1f, 1.4249322787E-1f,  -1.6668057665E-1f,
                             2.0000714765E-1f,  -2.4999993993E-1f, 3.3333331174E-1f};
  constexpr float kLn2Low = -2.12194440e-4f, kLn2High = 0.693359375f;
  x = std::max(x, bits_float(0x00800000u));  // smallest normal float
  const uint32_t bits = float_bits(x);
  float exponent = static_cast<float>(static_cast<int32_t>(bits >> 23) - 127) + 1.0f;
  x = bits_float((bits & ~0x7f800000u) | float_bits(0.5f));  // mantissa in [0.5, 1)
  const bool below = x < kSqrtHalf;
  const float twice = below ? x : 0.0f;
  x = x - 1.0f;
  exponent = exponent - (below ? 1.0f : 0.0f);
  x = x + twice;
  const float z = x * x;
  float y = kPoly[0];
  for (int k = 1; k < 9; ++k) y = std::fma(y, x, kPoly[k]);
  y = y * x;
  y = std::fma(y, z, exponent * kLn2Low);
  y = std::fma(-z, 0.5f, y);
  x = x + y;
  return std::fma(exponent, kLn2High, x);
}

// sin and cos of x >= 0 (Cephes sinf/cosf: reduction by multiples of pi/4 in three parts, then
// the sine or cosine polynomial per octant).
void avx2_sincos(float x, float* sin_out, float* cos_out) {
  constexpr float kFourOverPi = 1.27323954473516f;
  constexpr float kPiOver4[] = {-0.78515625f, -2.4187564849853515625e-4f, -3.77489497744594108e-8f};
  constexpr float kSin[] = {-1.9515295891E-4f, 8.3321608736E-3f, -1.6666654611E-1f};
  constexpr float kCos[] = {2.443315711809948E-005f, -1.388731625493765E-003f,
                            4.166664568298827E-002f};
  uint32_t sin_sign = float_bits(x) & 0x80000000u;
  x = bits_float(float_bits(x) & 0x7fffffffu);
  int32_t octant = static_cast<int32_t>(x * kFourOverPi);
  octant = (octant + 1) & ~1;
  const float y = static_cast<float>(octant);
  sin_sign ^= static_cast<uint32_t>(octant & 4) << 29;
  const uint32_t cos_sign = static_cast<uint32_t>(~(octant - 2) & 4) << 29;
  const bool sine_poly_for_sin = (octant & 2) == 0;
  for (float part : kPiOver4) x = std::fma(y, part, x);
  const float z = x * x;

  float c = std::fma(kCos[0], z, kCos[1]);
  c = std::fma(c, z, kCos[2]);
  c = c * z;
  c = std::fma(c, z, -(z * 0.5f));
  c = c + 1.0f;

  float s = std::fma(kSin[0], z, kSin[1]);
  s = std::fma(s, z, kSin[2]);
  s = s * z;
  s = std::fma(s, x, x);

  // The kernel selects with bit masks and adds the masked halves; replay the adds (signed zeros).
  const float sin_from_s = sine_poly_for_sin ? s : 0.0f;
  const float sin_from_c = sine_poly_for_sin ? 0.0f : c;
  const float sin_value = sin_from_c + sin_from_s;
  const float cos_value = (c - sin_from_c) + (s - sin_from_s);
  *sin_out = bits_float(float_bits(sin_value) ^ sin_sign);
  *cos_out = bits_float(float_bits(cos_value) ^ cos_sign);
}

// In place: 16 uniforms -> 16 normals (mean 0, std 1 applied with the kernel's final fma).
void box_muller_16_f32(float* data) {
  const float two_pi = static_cast<float>(2.0f * kPi);
  for (int j = 0; j < kChunk / 2; ++j) {
    const float u1 = 1.0f - data[j];
    const float u2 = data[j + 8];
    const float radius = std::sqrt(-2.0f * avx2_log(u1));
    float sin_theta, cos_theta;
    avx2_sincos(two_pi * u2, &sin_theta, &cos_theta);
    data[j] = std::fma(radius * cos_theta, 1.0f, 0.0f);
    data[j + 8] = std::fma(radius * sin_theta, 1.0f, 0.0f);
  }
}

// ---- bfloat16: the scalar kernel on c10::BFloat16 (values held as exact bf16 floats) ----------

void box_muller_16_bf16(float* data) {
  for (int j = 0; j < kChunk / 2; ++j) {
    const float u1 = round_to_bf16(1.0f - data[j]);
    const float u2 = data[j + 8];
    const float log_u1 = round_to_bf16(std::log(u1));
    const float radius = round_to_bf16(std::sqrt(round_to_bf16(-2.0f * log_u1)));
    const float theta = round_to_bf16(static_cast<float>(2.0 * kPi * static_cast<double>(u2)));
    const float cos_theta = round_to_bf16(std::cos(theta));
    const float sin_theta = round_to_bf16(std::sin(theta));
    // radius * cos * std + mean with std 1 and mean 0, each step rounded (+ 0 turns -0 into +0).
    data[j] = round_to_bf16(radius * cos_theta) + 0.0f;
    data[j + 8] = round_to_bf16(radius * sin_theta) + 0.0f;
  }
}

// The vectorised fill (n >= 16): uniforms, chunks of 16, then the recomputed tail.
template <typename Uniform, typename Transform>
std::vector<float> chunked_normal_fill(CpuGenerator& gen, int64_t numel, Uniform uniform,
                                       Transform transform) {
  std::vector<float> data(static_cast<size_t>(numel));
  for (float& value : data) value = uniform(gen);
  // Chunks are independent once their draws are in place: transform them in parallel.
  parallel_for(numel / kChunk, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) transform(data.data() + c * kChunk);
  });
  if (numel % kChunk != 0) {
    float* tail = data.data() + numel - kChunk;
    for (int64_t i = 0; i < kChunk; ++i) tail[i] = uniform(gen);
    transform(tail);
  }
  return data;
}

}  // namespace

std::vector<float> torch_randn_f32(uint64_t seed, int64_t numel) {
  if (numel <= 0) return {};
  CpuGenerator gen(seed);
  if (numel < kChunk) {
    std::vector<float> data(static_cast<size_t>(numel));
    for (float& value : data) value = static_cast<float>(gen.normal_f64());
    return data;
  }
  return chunked_normal_fill(
      gen, numel, [](CpuGenerator& g) { return g.uniform_f32(); }, box_muller_16_f32);
}

std::vector<float> torch_randn_bf16(uint64_t seed, int64_t numel) {
  if (numel <= 0) return {};
  CpuGenerator gen(seed);
  if (numel < kChunk) {
    std::vector<float> data(static_cast<size_t>(numel));
    for (float& value : data) value = round_to_bf16(static_cast<float>(gen.normal_f64()));
    return data;
  }
  return chunked_normal_fill(
      gen, numel, [](CpuGenerator& g) { return g.uniform_bf16(); }, box_muller_16_bf16);
}

}  // namespace flux2
