// Every lossless fast path equals its eager chain bit for bit (memcmp) on random inputs at the
// real klein-4B and dev shapes and at awkward ones (odd token counts, 17 text tokens, strided
// column slices, per-sample gates). Each case also checks the fused kernel really ran.
#include <gtest/gtest.h>

#include "kernels/base/fast_path_registry.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/kernel_args.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

using testing::bits;
using testing::clone;
using testing::random_bf16;

int64_t invocations(const std::string& path) {
  return testing::fast_path_counters(path).invocations;
}

// Runs `op` on fresh copies of the inputs with fast paths on and off and compares the outputs'
// bits; `outputs` returns the tensors to compare.
template <typename Setup, typename Op>
void expect_fused_equals_eager(Backend& be, const std::string& path, Setup setup, Op op) {
  auto fused_state = setup();
  auto eager_state = setup();
  const int64_t before = invocations(path);
  be.set_fast_paths(true);
  ASSERT_TRUE(op(fused_state).ok());
  EXPECT_GT(invocations(path), before) << path << ": the fused kernel did not run";
  be.set_fast_paths(false);
  ASSERT_TRUE(op(eager_state).ok());
  be.set_fast_paths(true);
  const std::vector<uint16_t> fused = bits(be, fused_state.output),
                              eager = bits(be, eager_state.output);
  ASSERT_EQ(fused.size(), eager.size());
  int64_t differing = 0;
  for (size_t i = 0; i < fused.size(); ++i) differing += fused[i] != eager[i];
  EXPECT_EQ(differing, 0) << path << ": " << differing << " of " << fused.size()
                          << " values differ";
  // Non-trivial: the output is not constant.
  int64_t distinct = 0;
  for (size_t i = 1; i < fused.size() && distinct < 2; ++i) distinct += fused[i] != fused[0];
  EXPECT_GT(distinct, 0) << path << ": trivial output";
}

struct Io {
  std::vector<Tensor> inputs;
  Tensor output;
};

struct Shape2 {
  int64_t rows, cols;
};

class FusedOpsTest : public ::testing::TestWithParam<Shape2> {};

TEST_P(FusedOpsTest, GateResidual) {
  FLUX2_REQUIRE_GPU(be);
  const auto [rows, cols] = GetParam();
  expect_fused_equals_eager(
      *be, "gate_residual",
      [&] {
        Io io;
        io.output = random_bf16(*be, rows, cols, 1, 4.0f);
        io.inputs = {random_bf16(*be, 1, cols, 2), random_bf16(*be, rows, cols, 3, 4.0f)};
        return io;
      },
      [&](Io& io) {
        return be->gate_residual(io.output, io.inputs[0].reshape({cols}), io.inputs[1]);
      });
}

TEST_P(FusedOpsTest, SwiGluIntoConcatSlice) {
  FLUX2_REQUIRE_GPU(be);
  const auto [rows, cols] = GetParam();
  const int64_t f = 3 * cols;  // the single block: [q|k|v|gate|up] -> [attn|mlp]
  expect_fused_equals_eager(
      *be, "swiglu",
      [&] {
        Io io;
        io.inputs = {random_bf16(*be, rows, 3 * cols + 2 * f, 4, 3.0f)};
        io.output = random_bf16(*be, rows, cols + f, 5).col_slice(cols, f);
        return io;
      },
      [&](Io& io) {
        return be->swiglu(io.inputs[0].col_slice(3 * cols, f),
                          io.inputs[0].col_slice(3 * cols + f, f), io.output);
      });
}

TEST_P(FusedOpsTest, LayerNormModulate) {
  FLUX2_REQUIRE_GPU(be);
  const auto [rows, cols] = GetParam();
  expect_fused_equals_eager(
      *be, "layer_norm_modulate",
      [&] {
        Io io;
        io.inputs = {random_bf16(*be, rows, cols, 6, 5.0f), random_bf16(*be, 1, 17 * cols, 7)};
        io.output = random_bf16(*be, rows, cols, 8);
        return io;
      },
      [&](Io& io) {
        // shift and scale are column slices of the fused per-step modulation row, as in the model.
        const Tensor& mod = io.inputs[1];
        return be->layer_norm_modulate(io.inputs[0], mod.col_slice(3 * cols, cols),
                                       mod.col_slice(4 * cols, cols), 1e-6f, io.output);
      });
}

TEST_P(FusedOpsTest, QkNormRopeInterleavedAndHalfSplit) {
  FLUX2_REQUIRE_GPU(be);
  const auto [rows, cols] = GetParam();
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    Tensor cos = be->empty(DType::kF32, {rows, 128}).value(),
           sin = be->empty(DType::kF32, {rows, 128}).value();
    std::vector<float> c(static_cast<size_t>(rows * 128)), s(c.size());
    for (size_t i = 0; i < c.size(); ++i) {
      c[i] = std::cos(0.001f * static_cast<float>(i));
      s[i] = std::sin(0.001f * static_cast<float>(i));
    }
    ASSERT_TRUE(be->upload(c.data(), DType::kF32, cos).ok());
    ASSERT_TRUE(be->upload(s.data(), DType::kF32, sin).ok());
    expect_fused_equals_eager(
        *be, "qk_norm_rope",
        [&] {
          Io io;
          io.inputs = {random_bf16(*be, 1, 128, 9)};
          // q inside the fused [q|k|v] projection buffer, as the model passes it.
          io.output = random_bf16(*be, rows, 3 * cols, 10, 3.0f).col_slice(cols, cols);
          return io;
        },
        [&](Io& io) {
          return be->qk_norm_rope(io.output, 128, io.inputs[0].reshape({128}), 1e-6f, cos, sin,
                                  style);
        });
  }
}

// Real shapes (klein-4B D=3072 F=9216; klein-9B D=4096; dev D=6144; 4608 = 4096 image + 512 text
// tokens) and awkward ones (17 text tokens, odd token counts; 6 heads of 128: the fused QK kernel's
// last group of 4 heads holds 2, a single head holds 1).
INSTANTIATE_TEST_SUITE_P(Shapes, FusedOpsTest,
                         ::testing::Values(Shape2{4608, 3072}, Shape2{4608, 6144}, Shape2{17, 3072},
                                           Shape2{4611, 3072}, Shape2{1, 128}, Shape2{29, 4096},
                                           Shape2{33, 768}),
                         [](const ::testing::TestParamInfo<Shape2>& info) {
                           return "S" + std::to_string(info.param.rows) + "_D" +
                                  std::to_string(info.param.cols);
                         });

// Per-sample gates [B, D] (B = 2, distinct gates): the launcher's batched form.
TEST(FusedGateResidualTest, PerSampleGatesMatchEagerChain) {
  FLUX2_REQUIRE_GPU(be);
  const int64_t rows_per_sample = 2311, cols = 3072;
  Tensor gates = random_bf16(*be, 2, cols, 21);
  Tensor update = random_bf16(*be, 2 * rows_per_sample, cols, 22, 4.0f);
  Tensor fused = random_bf16(*be, 2 * rows_per_sample, cols, 23, 4.0f);
  Tensor eager = clone(*be, fused), shared_gate = clone(*be, fused);
  Tensor product = be->empty(DType::kBF16, {2 * rows_per_sample, cols}).value();
  auto m = [](const Tensor& t) { return cuda::Mat{t.data(), t.rows(), t.cols(), t.row_stride()}; };
  cudaStream_t stream = cuda_stream_of(*be);
  ASSERT_TRUE(
      cuda::gate_residual_fused(m(fused), m(gates), rows_per_sample, m(update), stream).ok());
  ASSERT_TRUE(cuda::gate_mul_bf16(m(gates), rows_per_sample, m(update), m(product), stream).ok());
  ASSERT_TRUE(cuda::add_bf16(m(eager), m(product), m(eager), stream).ok());
  EXPECT_EQ(bits(*be, fused), bits(*be, eager));
  // The samples really used different gates: one gate row for both samples gives other bits.
  ASSERT_TRUE(cuda::gate_residual_fused(m(shared_gate), m(gates.row_slice(0, 1)),
                                        2 * rows_per_sample, m(update), stream)
                  .ok());
  EXPECT_NE(bits(*be, shared_gate), bits(*be, fused));
}

}  // namespace
}  // namespace flux2
