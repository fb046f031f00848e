// quality=high's rowwise FP8 producers: SwiGLU writing [prefix | swiglu(gate, up)] as E4M3 rows
// (swiglu_fp8.h) and LayerNorm+modulate writing its E4M3 rows under their own scales equal
// fp8_quantize_rows of the materialized bf16 output byte for byte; through the backend,
// swiglu_linear and layer_norm_modulate_linear (and _keeping_normed) give the GEMM outputs of the
// ops in turn bit for bit, their fast paths counted; swiglu_linear's gated residual in the GEMM is
// within a bound derived from the roundings it saves; under a static activation scale
// (--fp8-input-scale static) both producers equal fp8_quantize_static and keep their fast paths.
// Run: build/bin/gpu_fp8_rows_test (skips without a GPU, or without rowwise FP8 in cuBLASLt).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

#include "kernels/base/fast_path_registry.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/norms.h"
#include "kernels/cuda/quantize.h"
#include "kernels/cuda/swiglu_fp8.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

using cuda::SiluMath;
using testing::bits;
using testing::random_bf16;

struct Fp8Matrix {
  std::vector<float> codes;   // E4M3 bytes, widened exactly
  std::vector<float> scales;  // one per row
};

class Fp8RowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    bool no_device = false;
    be_ = testing::gpu_backend(&why, &no_device);
    if (be_ == nullptr && no_device) GTEST_SKIP() << "no CUDA device: " << why;
    ASSERT_NE(be_, nullptr) << "the CUDA backend did not start: " << why;
    cuda_ = static_cast<CudaBackend*>(be_);
  }
  Tensor empty(DType dtype, Shape shape) { return be_->empty(dtype, shape).value(); }
  Fp8Matrix download(const Tensor& codes, const Tensor& scales) {
    return {testing::values(*be_, codes), testing::values(*be_, scales)};
  }
  // The reference: fp8_quantize_rows of a bf16 matrix.
  Fp8Matrix quantize_rows(const Tensor& x) {
    Tensor codes = empty(DType::kU8, {x.rows(), x.cols()}), scales = empty(DType::kF32, {x.rows()});
    cuda::Fp8QuantizeArgs args;
    args.in.first = mat(x);
    args.out = codes.data();
    args.out_bytes = codes.bytes();
    args.scale = scales.data_as<float>();
    EXPECT_TRUE(cuda::fp8_quantize_rows(args, cuda_->stream()).ok());
    return download(codes, scales);
  }
  static void expect_equal(const Fp8Matrix& got, const Fp8Matrix& want) {
    ASSERT_EQ(got.scales.size(), want.scales.size());
    for (size_t r = 0; r < want.scales.size(); ++r)
      ASSERT_EQ(got.scales[r], want.scales[r]) << "row " << r;
    ASSERT_EQ(got.codes.size(), want.codes.size());
    for (size_t i = 0; i < want.codes.size(); ++i)
      ASSERT_EQ(got.codes[i], want.codes[i]) << "byte " << i;
  }
  // The reference under a static activation scale: fp8_quantize_static of a bf16 matrix, the
  // scale written once per row.
  Fp8Matrix quantize_static(const Tensor& x, float scale) {
    Tensor codes = empty(DType::kU8, {x.rows(), x.cols()}), scales = empty(DType::kF32, {x.rows()});
    Tensor given = device_scale(scale);
    cuda::Fp8QuantizeArgs args;
    args.in.first = mat(x);
    args.out = codes.data();
    args.out_bytes = codes.bytes();
    args.scale = given.data_as<float>();
    args.row_scales = scales.data_as<float>();
    EXPECT_TRUE(cuda::fp8_quantize_static(args, cuda_->stream()).ok());
    return download(codes, scales);
  }
  Tensor device_scale(float scale) {
    Tensor t = empty(DType::kF32, {1});
    EXPECT_TRUE(be_->upload(&scale, DType::kF32, t).ok());
    return t;
  }
  // A stored FP8 weight [n, k] (E4M3 codes and a scale per row, as an FP8 checkpoint holds them)
  // registered for quality=high with `input_scale` (none: activations per token).
  Weight stored_weight(int64_t n, int64_t k, uint64_t seed, std::optional<float> input_scale) {
    const Tensor values = random_bf16(*be_, n, k, seed, 0.05f);
    Weight w;
    w.tensor = empty(DType::kF8E4M3, {n, k});
    w.row_scales = empty(DType::kF32, {n});
    cuda::Fp8QuantizeArgs args;
    args.in.first = mat(values);
    args.out = w.tensor.data();
    args.out_bytes = w.tensor.bytes();
    args.scale = w.row_scales.data_as<float>();
    EXPECT_TRUE(cuda::fp8_quantize_rows(args, cuda_->stream()).ok());
    auto low = be_->add_stored_fp8_weight(w.tensor, w.row_scales, input_scale);
    EXPECT_TRUE(low.ok()) << low.status();
    if (low.ok()) w.low_precision = *low;
    return w;
  }
  // quality=high with rowwise FP8 for the backend-level tests; false (and a skip) without it.
  bool rowwise_high() {
    if (!cuda_->fp8_rowwise()) return false;
    high_.emplace(*be_, RequestOptions{Quality::kHigh});
    return true;
  }
  Weight fp8_weight(int64_t n, int64_t k, uint64_t seed) {
    return testing::fp8_weight(*be_, n, k, seed);
  }
  Backend* be_ = nullptr;
  CudaBackend* cuda_ = nullptr;
  std::optional<RequestScope> high_;  // the test's quality=high request, ended with the test
};

TEST_F(Fp8RowsTest, SwigluRowsEqualTheQuantizedConcatenation) {
  struct Case {
    int64_t rows, prefix, f;
    SiluMath math;
  };
  // The single block of klein-4B and dev ([attn | mlp]), the double block (no prefix), ragged and
  // tiny rows (the reference quantizer needs widths % 16 == 0); gate and up are strided column
  // ranges of one projection, as in the model.
  const Case cases[] = {{64, 3072, 9216, SiluMath::kFast}, {9, 6144, 18432, SiluMath::kExact},
                        {77, 0, 9216, SiluMath::kFast},    {300, 256, 384, SiluMath::kExact},
                        {33, 8, 8, SiluMath::kFast},       {5, 8, 40, SiluMath::kExact}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.rows << " rows, prefix " << c.prefix << ", F " << c.f);
    Tensor mlp = random_bf16(*be_, c.rows, 2 * c.f, 31, 6.0f);
    Tensor concat = random_bf16(*be_, c.rows, c.prefix + c.f, 32, 3.0f);
    const Tensor gate = mlp.col_slice(0, c.f), up = mlp.col_slice(c.f, c.f);
    Tensor codes = empty(DType::kU8, {c.rows, c.prefix + c.f}),
           scales = empty(DType::kF32, {c.rows});
    cuda::SwigluFp8Rows args;
    args.prefix =
        c.prefix > 0 ? mat(concat.col_slice(0, c.prefix)) : cuda::Mat{nullptr, c.rows, 0, 0};
    args.gate = mat(gate);
    args.up = mat(up);
    args.math = c.math;
    args.out = codes.data();
    args.out_bytes = codes.bytes();
    args.row_scales = scales.data_as<float>();
    ASSERT_TRUE(cuda::swiglu_fp8_rows(args, cuda_->stream()).ok());
    const Fp8Matrix got = download(codes, scales);
    ASSERT_TRUE(cuda::swiglu_fused(mat(gate), mat(up), mat(concat.col_slice(c.prefix, c.f)), c.math,
                                   cuda_->stream())
                    .ok());
    expect_equal(got, quantize_rows(concat));
  }
}

TEST_F(Fp8RowsTest, SwigluRowsRejectWhatTheyCannotServe) {
  Tensor mlp = random_bf16(*be_, 4, 24, 33), codes = empty(DType::kU8, {4, 12});
  Tensor scales = empty(DType::kF32, {4});
  cuda::SwigluFp8Rows args;
  args.gate = mat(mlp.col_slice(0, 12));  // 12 % 8 != 0
  args.up = mat(mlp.col_slice(12, 12));
  args.out = codes.data();
  args.out_bytes = codes.bytes();
  args.row_scales = scales.data_as<float>();
  const absl::Status status = cuda::swiglu_fp8_rows(args, cuda_->stream());
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("gate [4, 12]"), std::string::npos) << status;
}

TEST_F(Fp8RowsTest, LayerNormRowsEqualTheQuantizedOutput) {
  // The E4M3 rows leave the bf16 output as it was and equal fp8_quantize_rows of it. Widths:
  // klein-4B, klein-9B and dev, fewer packs than threads (256), a ragged last round of packs (1008
  // = 126 packs; the reference quantizer needs widths % 16 == 0).
  for (const int64_t d : {3072, 4096, 6144, 256, 1008}) {
    SCOPED_TRACE(::testing::Message() << "D " << d);
    const int64_t rows = 300;
    Tensor x = random_bf16(*be_, rows, d, 41 + d, 4.0f);
    Tensor shift = random_bf16(*be_, 1, d, 42, 2.0f), scale = random_bf16(*be_, 1, d, 43, 3.0f);
    Tensor out = empty(DType::kBF16, {rows, d}), plain = empty(DType::kBF16, {rows, d});
    Tensor codes = empty(DType::kU8, {rows, d}), scales = empty(DType::kF32, {rows});
    ASSERT_TRUE(cuda::layer_norm_writes_fp8(mat(x)));
    ASSERT_TRUE(cuda::layer_norm_modulate_fused(
                    mat(x), mat(shift), mat(scale), rows, 1e-6f, mat(out), cuda_->stream(),
                    cuda::Fp8Rows{static_cast<uint8_t*>(codes.data()), scales.data_as<float>()})
                    .ok());
    ASSERT_TRUE(cuda::layer_norm_modulate_fused(mat(x), mat(shift), mat(scale), rows, 1e-6f,
                                                mat(plain), cuda_->stream())
                    .ok());
    EXPECT_EQ(bits(*be_, out), bits(*be_, plain)) << "the E4M3 rows changed the bf16 output";
    expect_equal(download(codes, scales), quantize_rows(out));
  }
}

TEST_F(Fp8RowsTest, SwigluLinearEqualsSwigluThenLinear) {
  if (!rowwise_high()) GTEST_SKIP() << "cuBLASLt offers no rowwise FP8 GEMM here";
  const int64_t s = 300, n = 384;
  for (const int64_t prefix : {int64_t{0}, int64_t{256}}) {
    const int64_t f = 384;
    SCOPED_TRACE(::testing::Message() << "prefix " << prefix);
    Tensor mlp = random_bf16(*be_, s, 2 * f, 51, 4.0f);
    const Tensor gate = mlp.col_slice(0, f), up = mlp.col_slice(f, f);
    Tensor fused_in = random_bf16(*be_, s, prefix + f, 52),
           eager_in = testing::clone(*be_, fused_in);
    Weight w = fp8_weight(n, prefix + f, 53 + prefix);
    Tensor fused = empty(DType::kBF16, {s, n}), eager = empty(DType::kBF16, {s, n});
    const int64_t before = testing::fast_path_counters("swiglu_fp8").invocations;
    ASSERT_TRUE(be_->swiglu_linear(gate, up, fused_in, w, fused, nullptr).ok());
    EXPECT_EQ(testing::fast_path_counters("swiglu_fp8").invocations, before + 1);
    ASSERT_TRUE(be_->swiglu(gate, up, eager_in.col_slice(prefix, f)).ok());
    ASSERT_TRUE(be_->linear(eager_in, w, {}, eager).ok());
    EXPECT_EQ(bits(*be_, fused), bits(*be_, eager));
  }
}

TEST_F(Fp8RowsTest, SwigluLinearAddsTheGatedResidualInItsGemm) {
  if (!rowwise_high()) GTEST_SKIP() << "cuBLASLt offers no rowwise FP8 GEMM here";
  // The GEMM adds gate ⊙ (x · wᵀ) into the stream with one rounding; the ops in turn round the
  // GEMM output y, the product g·y and the sum (each within u = 2^-8 relative, bf16). So per
  // element |fused - eager| <= |g·y| (2u + u²) + u (|fused| + |eager|) (1 + u), bounded below
  // with 1.01.
  const int64_t s = 300, prefix = 256, f = 384, n = 384;
  Tensor mlp = random_bf16(*be_, s, 2 * f, 91, 4.0f);
  const Tensor gate = mlp.col_slice(0, f), up = mlp.col_slice(f, f);
  Tensor in = random_bf16(*be_, s, prefix + f, 92);
  Weight w = fp8_weight(n, prefix + f, 93);
  Tensor stream = random_bf16(*be_, s, n, 94, 2.0f),
         residual_gate = random_bf16(*be_, 1, n, 95, 1.5f);
  Tensor fused_stream = testing::clone(*be_, stream), y = empty(DType::kBF16, {s, n});
  const GatedResidual residual{fused_stream, residual_gate};
  const int64_t before = testing::fast_path_counters("swiglu_fp8").invocations;
  ASSERT_TRUE(be_->swiglu_linear(gate, up, in, w, y, &residual).ok());
  EXPECT_EQ(testing::fast_path_counters("swiglu_fp8").invocations, before + 1);
  ASSERT_TRUE(be_->swiglu_linear(gate, up, in, w, y, nullptr).ok());
  const std::vector<float> projection = testing::values(*be_, y),
                           g = testing::values(*be_, residual_gate);
  ASSERT_TRUE(be_->gate_residual(stream, residual_gate, y).ok());
  const std::vector<float> fused = testing::values(*be_, fused_stream),
                           eager = testing::values(*be_, stream);
  constexpr double u = 1.0 / 256;
  double worst = 0.0;
  for (int64_t i = 0; i < s * n; ++i) {
    const double gy = std::fabs(static_cast<double>(g[i % n]) * projection[i]);
    const double bound = 1.01 * (gy * 2 * u + u * (std::fabs(fused[i]) + std::fabs(eager[i])));
    const double error = std::fabs(static_cast<double>(fused[i]) - eager[i]);
    ASSERT_LE(error, bound) << "element " << i << ": fused " << fused[i] << ", eager " << eager[i];
    if (bound > 0) worst = std::max(worst, error / bound);
  }
  std::printf("gated residual in the GEMM vs the ops in turn: worst error / bound %.3f\n", worst);
}

TEST_F(Fp8RowsTest, SwigluLinearFallsBackOnShapesItCannotServe) {
  if (!rowwise_high()) GTEST_SKIP() << "cuBLASLt offers no rowwise FP8 GEMM here";
  const int64_t s = 64, prefix = 4, f = 12, n = 32;  // widths not multiples of 8; K = 16
  Tensor mlp = random_bf16(*be_, s, 2 * f, 61);
  const Tensor gate = mlp.col_slice(0, f), up = mlp.col_slice(f, f);
  Tensor fused_in = random_bf16(*be_, s, prefix + f, 62), eager_in = testing::clone(*be_, fused_in);
  Weight w = fp8_weight(n, prefix + f, 63);
  Tensor fused = empty(DType::kBF16, {s, n}), eager = empty(DType::kBF16, {s, n});
  const int64_t before = testing::fast_path_fallbacks("swiglu_fp8", "unsupported_shape");
  ASSERT_TRUE(be_->swiglu_linear(gate, up, fused_in, w, fused, nullptr).ok());
  EXPECT_EQ(testing::fast_path_fallbacks("swiglu_fp8", "unsupported_shape"), before + 1);
  ASSERT_TRUE(be_->swiglu(gate, up, eager_in.col_slice(prefix, f)).ok());
  ASSERT_TRUE(be_->linear(eager_in, w, {}, eager).ok());
  EXPECT_EQ(bits(*be_, fused), bits(*be_, eager));
  const absl::Status status =
      be_->swiglu_linear(gate, up, fused_in.col_slice(0, f - 1), w, fused, nullptr);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("gate's rows"), std::string::npos) << status;
}

TEST_F(Fp8RowsTest, LayerNormLinearEqualsTheOpsInTurn) {
  if (!rowwise_high()) GTEST_SKIP() << "cuBLASLt offers no rowwise FP8 GEMM here";
  const int64_t s = 300, d = 3072, n = 256;
  Tensor x = random_bf16(*be_, s, d, 81, 3.0f), normed = empty(DType::kBF16, {s, d});
  Tensor shift = random_bf16(*be_, 1, d, 82), scale = random_bf16(*be_, 1, d, 83);
  Weight w = fp8_weight(n, d, 84);
  Tensor fused = empty(DType::kBF16, {s, n}), eager = empty(DType::kBF16, {s, n});
  const int64_t before = testing::fast_path_counters("layer_norm_fp8").invocations;
  ASSERT_TRUE(be_->layer_norm_modulate_linear(x, shift, scale, 1e-6f, normed, w, fused).ok());
  EXPECT_EQ(testing::fast_path_counters("layer_norm_fp8").invocations, before + 1);
  ASSERT_TRUE(be_->layer_norm_modulate(x, shift, scale, 1e-6f, normed).ok());
  ASSERT_TRUE(be_->linear(normed, w, {}, eager).ok());
  EXPECT_EQ(bits(*be_, fused), bits(*be_, eager));
  const absl::Status status =
      be_->layer_norm_modulate_linear(x, shift, scale.col_slice(0, d - 8), 1e-6f, normed, w, fused);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("scale"), std::string::npos) << status;
}

TEST_F(Fp8RowsTest, LayerNormLinearKeepingNormedWritesBothInOnePass) {
  // LoRA's A products read normed after the projection: the norm writes its bf16 rows beside the
  // GEMM's E4M3 rows, each equal to the ops in turn.
  if (!rowwise_high()) GTEST_SKIP() << "cuBLASLt offers no rowwise FP8 GEMM here";
  const int64_t s = 300, d = 3072, n = 256;
  Tensor x = random_bf16(*be_, s, d, 91, 3.0f);
  Tensor kept = empty(DType::kBF16, {s, d}), normed = empty(DType::kBF16, {s, d});
  Tensor shift = random_bf16(*be_, 1, d, 92), scale = random_bf16(*be_, 1, d, 93);
  Weight w = fp8_weight(n, d, 94);
  Tensor fused = empty(DType::kBF16, {s, n}), eager = empty(DType::kBF16, {s, n});
  const int64_t before = testing::fast_path_counters("layer_norm_fp8").invocations;
  ASSERT_TRUE(
      be_->layer_norm_modulate_linear_keeping_normed(x, shift, scale, 1e-6f, kept, w, fused).ok());
  EXPECT_EQ(testing::fast_path_counters("layer_norm_fp8").invocations, before + 1);
  ASSERT_TRUE(be_->layer_norm_modulate(x, shift, scale, 1e-6f, normed).ok());
  ASSERT_TRUE(be_->linear(normed, w, {}, eager).ok());
  EXPECT_EQ(bits(*be_, kept), bits(*be_, normed));
  EXPECT_EQ(bits(*be_, fused), bits(*be_, eager));
}

// --fp8-input-scale static: both producers write every row under the one given scale, bit for bit
// fp8_quantize_static of their bf16 output (codes e4m3(x / scale)), the scale in each row's
// entry. The scale (an amax of 2) saturates the larger values (up to 3-6 here) at ±448.
TEST_F(Fp8RowsTest, StaticScaleRowsEqualTheStaticQuantizer) {
  const float scale = 2.0f / 448.0f;
  const Tensor given = device_scale(scale);
  {
    const int64_t rows = 77, prefix = 256, f = 384;
    Tensor mlp = random_bf16(*be_, rows, 2 * f, 101, 6.0f);
    Tensor concat = random_bf16(*be_, rows, prefix + f, 102, 3.0f);
    const Tensor gate = mlp.col_slice(0, f), up = mlp.col_slice(f, f);
    Tensor codes = empty(DType::kU8, {rows, prefix + f}), scales = empty(DType::kF32, {rows});
    cuda::SwigluFp8Rows args;
    args.prefix = mat(concat.col_slice(0, prefix));
    args.gate = mat(gate);
    args.up = mat(up);
    args.math = SiluMath::kFast;
    args.out = codes.data();
    args.out_bytes = codes.bytes();
    args.row_scales = scales.data_as<float>();
    args.static_scale = given.data_as<float>();
    ASSERT_TRUE(cuda::swiglu_fp8_rows(args, cuda_->stream()).ok());
    const Fp8Matrix got = download(codes, scales);
    ASSERT_TRUE(cuda::swiglu_fused(mat(gate), mat(up), mat(concat.col_slice(prefix, f)),
                                   SiluMath::kFast, cuda_->stream())
                    .ok());
    expect_equal(got, quantize_static(concat, scale));
  }
  const int64_t rows = 300, d = 3072;
  Tensor x = random_bf16(*be_, rows, d, 103, 4.0f);
  Tensor shift = random_bf16(*be_, 1, d, 104, 2.0f), mod = random_bf16(*be_, 1, d, 105, 3.0f);
  Tensor out = empty(DType::kBF16, {rows, d});
  Tensor codes = empty(DType::kU8, {rows, d}), scales = empty(DType::kF32, {rows});
  ASSERT_TRUE(cuda::layer_norm_modulate_fused(
                  mat(x), mat(shift), mat(mod), rows, 1e-6f, mat(out), cuda_->stream(),
                  cuda::Fp8Rows{static_cast<uint8_t*>(codes.data()), scales.data_as<float>(),
                                given.data_as<float>()})
                  .ok());
  const Fp8Matrix got = download(codes, scales);
  EXPECT_EQ(got.scales.front(), scale);
  expect_equal(got, quantize_static(out, scale));
}

// A stored weight registered with a static scale: swiglu_linear and layer_norm_modulate_linear
// still run their fused paths (counted, no fallback) and equal the ops in turn (linear quantizing
// under the static scale) bit for bit, and differ from the same weight per token.
TEST_F(Fp8RowsTest, StaticScaleReachesTheFusedProducers) {
  if (!rowwise_high()) GTEST_SKIP() << "cuBLASLt offers no rowwise FP8 GEMM here";
  const int64_t s = 300, prefix = 256, f = 384, d = 3072, n = 256;
  const float input_scale = 3.0f / 448.0f;
  Tensor mlp = random_bf16(*be_, s, 2 * f, 111, 4.0f);
  const Tensor gate = mlp.col_slice(0, f), up = mlp.col_slice(f, f);
  Tensor fused_in = random_bf16(*be_, s, prefix + f, 112),
         eager_in = testing::clone(*be_, fused_in);
  const Weight w = stored_weight(n, prefix + f, 113, input_scale);
  const Weight per_token = stored_weight(n, prefix + f, 113, std::nullopt);
  Tensor fused = empty(DType::kBF16, {s, n}), eager = empty(DType::kBF16, {s, n});
  const int64_t swiglu_before = testing::fast_path_counters("swiglu_fp8").invocations;
  ASSERT_TRUE(be_->swiglu_linear(gate, up, fused_in, w, fused, nullptr).ok());
  EXPECT_EQ(testing::fast_path_counters("swiglu_fp8").invocations, swiglu_before + 1);
  ASSERT_TRUE(be_->swiglu(gate, up, eager_in.col_slice(prefix, f)).ok());
  ASSERT_TRUE(be_->linear(eager_in, w, {}, eager).ok());
  EXPECT_EQ(bits(*be_, fused), bits(*be_, eager));
  ASSERT_TRUE(be_->linear(eager_in, per_token, {}, eager).ok());
  EXPECT_NE(bits(*be_, fused), bits(*be_, eager)) << "the static scale was not used";

  Tensor x = random_bf16(*be_, s, d, 114, 3.0f), normed = empty(DType::kBF16, {s, d});
  Tensor shift = random_bf16(*be_, 1, d, 115), scale = random_bf16(*be_, 1, d, 116);
  const Weight wd = stored_weight(n, d, 117, input_scale);
  const int64_t norm_before = testing::fast_path_counters("layer_norm_fp8").invocations;
  ASSERT_TRUE(be_->layer_norm_modulate_linear(x, shift, scale, 1e-6f, normed, wd, fused).ok());
  EXPECT_EQ(testing::fast_path_counters("layer_norm_fp8").invocations, norm_before + 1);
  ASSERT_TRUE(be_->layer_norm_modulate(x, shift, scale, 1e-6f, normed).ok());
  ASSERT_TRUE(be_->linear(normed, wd, {}, eager).ok());
  EXPECT_EQ(bits(*be_, fused), bits(*be_, eager));
}

}  // namespace
}  // namespace flux2
