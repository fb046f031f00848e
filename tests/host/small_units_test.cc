// Small host units: command-line parsing, backend creation by name, the relative-error measure,
// RoPE tables and the timestep embedding (each against values derived by hand from their spec).
#include <cmath>

#include <gtest/gtest.h>

#include "kernels/backend_factory.h"
#include "kernels/base/numerics.h"
#include "model/rope.h"
#include "model/timestep_embedding.h"
#include "server/cli/args.h"

namespace flux2 {
namespace {

TEST(ArgsTest, ParsesValuesFlagsAndPositionals) {
  const char* argv[] = {"flux2", "cmd", "--a", "1", "--b=x y", "--json", "word", "--c", "2.5"};
  auto args = Args::parse(9, const_cast<char**>(argv), 2, {"--json"});
  ASSERT_TRUE(args.ok());
  EXPECT_EQ(args->get("--b"), "x y");
  EXPECT_TRUE(args->has("--json"));
  EXPECT_EQ(args->get_int("--a", 0).value(), 1);
  EXPECT_EQ(args->get_double("--c", 0).value(), 2.5);
  EXPECT_EQ(args->get_int("--missing", 7).value(), 7);
  EXPECT_EQ(args->positional(), std::vector<std::string>{"word"});
  EXPECT_FALSE(args->get_int("--b", 0).ok());
  const absl::Status unknown = args->check_known({"--a", "--b", "--json"});
  EXPECT_NE(unknown.message().find("--c"), std::string::npos) << unknown;
  const char* dangling[] = {"flux2", "cmd", "--a"};
  EXPECT_FALSE(Args::parse(3, const_cast<char**>(dangling), 2).ok());
}

TEST(BackendFactoryTest, CreatesByName) {
  auto cpu = create_backend("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ((*cpu)->name(), "cpu");
  EXPECT_EQ(create_backend("tpu").status().code(), absl::StatusCode::kInvalidArgument);
  auto cuda = create_backend("cuda");
  // Without a CUDA device (or without CUDA in the build) the backend is NotFound, never a crash
  // (and never another code: that would make GPU tests and `--backend auto` treat a broken GPU as
  // an absent one).
  if (!cuda.ok()) EXPECT_EQ(cuda.status().code(), absl::StatusCode::kNotFound) << cuda.status();
}

TEST(NumericsTest, RelativeL2Error) {
  EXPECT_DOUBLE_EQ(relative_l2_error(std::vector<float>{3, 4}, std::vector<float>{3, 4}), 0.0);
  EXPECT_NEAR(relative_l2_error(std::vector<float>{3, 5}, std::vector<float>{3, 4}), 0.2,
              1e-12);  // |(0,1)| / 5
  EXPECT_TRUE(std::isinf(relative_l2_error(std::vector<float>{NAN, 4}, std::vector<float>{3, 4})));
  EXPECT_TRUE(std::isinf(relative_l2_error(std::vector<float>{1}, std::vector<float>{0})));
  EXPECT_TRUE(std::isinf(relative_l2_error(std::vector<float>{1, 2}, std::vector<float>{1})));
}

TEST(RopeTest, Flux2TablesFollowTheAxisLayout) {
  // One text token (0, 0, 0, l = 5) and one image token (0, row 2, col 3, 0); axes of 4 dims.
  const std::vector<int64_t> ids = {0, 0, 0, 5, 0, 2, 3, 0};
  const RopeTables t = flux2_rope_tables(ids, {4, 4, 4, 4}, 2000.0);
  ASSERT_EQ(t.cos.size(), 32u);
  for (int d = 0; d < 16; ++d) {
    const int axis = d / 4, pair = (d % 4) / 2;
    const double frequency = 1.0 / std::pow(2000.0, 2.0 * pair / 4.0);
    const double text_position = axis == 3 ? 5 : 0;
    const double image_position = axis == 1 ? 2 : (axis == 2 ? 3 : 0);
    EXPECT_NEAR(t.cos[d], std::cos(text_position * frequency), 1e-6) << d;
    EXPECT_NEAR(t.sin[d], std::sin(text_position * frequency), 1e-6) << d;
    EXPECT_NEAR(t.cos[16 + d], std::cos(image_position * frequency), 1e-6) << d;
    EXPECT_NEAR(t.sin[16 + d], std::sin(image_position * frequency), 1e-6) << d;
  }
  EXPECT_EQ(flux2_text_ids(2), (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(flux2_image_ids(1, 2), (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 1, 0}));
}

TEST(RopeTest, Qwen3TablesDuplicateTheirHalves) {
  const RopeTables t = qwen3_rope_tables(3, 8, 1e6);
  for (int s = 0; s < 3; ++s) {
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(t.cos[s * 8 + j], t.cos[s * 8 + j + 4]);
      EXPECT_NEAR(t.cos[s * 8 + j], std::cos(s / std::pow(1e6, 2.0 * j / 8)), 1e-6);
    }
  }
}

TEST(TimestepEmbeddingTest, SinusoidAndBf16Scaling) {
  const std::vector<float> values = {0.0f, 1000.0f};
  const std::vector<float> emb = timestep_sinusoids(values, 8);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(emb[k], 1.0f);      // cos(0)
    EXPECT_EQ(emb[4 + k], 0.0f);  // sin(0)
    const double f = std::exp(-std::log(10000.0) * k / 4);
    EXPECT_NEAR(emb[8 + k], std::cos(1000.0 * f), 2e-4);
    EXPECT_NEAR(emb[12 + k], std::sin(1000.0 * f), 2e-4);
  }
  // golden/README.md: timestep 0.65 is not a bf16 value; diffusers' bf16 path feeds 648, not 650.
  EXPECT_EQ(scale_conditioning(0.65f, DType::kBF16), 648.0f);
  EXPECT_FLOAT_EQ(scale_conditioning(0.65f, DType::kF32), 650.0f);
  EXPECT_EQ(scale_conditioning(4.0f, DType::kBF16), 4000.0f);
}

}  // namespace
}  // namespace flux2
