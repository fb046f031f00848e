// Tensor views (slices, reshape), bf16 rounding and the fast-path registry.
#include <gtest/gtest.h>

#include "kernels/base/dtype.h"
#include "kernels/base/fast_path_registry.h"
#include "kernels/base/tensor.h"

namespace flux2 {
namespace {

TEST(TensorTest, SlicesShareMemoryWithStrides) {
  float data[12];
  Tensor t = Tensor::borrow(data, DType::kF32, Device::kCpu, {3, 4});
  Tensor cols = t.col_slice(1, 2);
  EXPECT_EQ(cols.rows(), 3);
  EXPECT_EQ(cols.cols(), 2);
  EXPECT_EQ(cols.row_stride(), 4);
  EXPECT_FALSE(cols.contiguous());
  EXPECT_EQ(cols.data_as<float>(), data + 1);
  Tensor rows = t.row_slice(1, 2);
  EXPECT_EQ(rows.data_as<float>(), data + 4);
  EXPECT_TRUE(rows.contiguous());
  EXPECT_EQ(cols.row_slice(2, 1).data_as<float>(), data + 9);
  EXPECT_EQ(t.reshape({12}).cols(), 12);
  EXPECT_EQ(cols.describe(), "f32[3, 2] cpu stride 4");
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(round_to_bf16(1.0f), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(round_to_bf16(1.0f + 0.00390625f), 1.0f);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(round_to_bf16(1.0f + 3 * 0.00390625f), 1.015625f);
  EXPECT_TRUE(std::isnan(round_to_bf16(NAN)));
  EXPECT_EQ(f16_bits_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_bits_to_f32(0xc000), -2.0f);
  EXPECT_EQ(dtype_from_name("F8_E4M3").value(), DType::kF8E4M3);
  EXPECT_FALSE(dtype_from_name("F4").ok());
}

// The counters of one path in the registry's snapshot.
FastPathCounters counters_of(const std::string& name) {
  for (const FastPathCounters& c : fast_path_snapshot()) {
    if (c.path == name) return c;
  }
  FastPathCounters none;
  none.path = name;
  return none;
}

// run_fast_path's outcome for one call: which side ran.
std::string run_once(FastPath& path, const RequestOptions& request, absl::string_view unsupported,
                     absl::Status fast_status = absl::OkStatus(), bool capturing = false,
                     absl::Status* returned = nullptr) {
  std::string ran;
  absl::Status status = run_fast_path(
      path, request, unsupported,
      [&] {
        ran = "fast";
        return fast_status;
      },
      [&] {
        ran += ran.empty() ? "fallback" : "+fallback";
        return absl::OkStatus();
      },
      [&] { return capturing; });
  if (returned != nullptr) *returned = status;
  return ran;
}

TEST(FastPathRegistryTest, FusedPathsHonourTheSwitchImplementationsDoNot) {
  static FastPath fused(FastPathSpec{"test_fused", FastPathKind::kFused, Quality::kLossless, ""});
  static FastPath library(
      FastPathSpec{"test_library", FastPathKind::kImplementation, Quality::kLossless, ""});
  const RequestOptions on{}, off{Quality::kLossless, false};
  EXPECT_EQ(run_once(fused, on, ""), "fast");
  EXPECT_EQ(run_once(fused, off, ""), "fallback");
  EXPECT_EQ(run_once(library, off, ""), "fast");  // the switch is for fused kernels only
  EXPECT_EQ(run_once(library, on, "unsupported_shape"), "fallback");
  const FastPathCounters f = counters_of("test_fused"), l = counters_of("test_library");
  EXPECT_EQ(f.kind, FastPathKind::kFused);
  EXPECT_EQ(f.invocations, 1);
  EXPECT_EQ(f.fallbacks, (std::map<std::string, int64_t>{{"switched_off", 1}}));
  EXPECT_EQ(l.kind, FastPathKind::kImplementation);
  EXPECT_EQ(l.invocations, 1);
  EXPECT_EQ(l.fallbacks, (std::map<std::string, int64_t>{{"unsupported_shape", 1}}));
}

TEST(FastPathRegistryTest, AFailureDisablesThePathAndFallsBackExceptDuringCapture) {
  static FastPath path(FastPathSpec{"test_failing", FastPathKind::kFused, Quality::kLossless, ""});
  const RequestOptions request{};
  absl::Status returned;
  // During a graph capture the error propagates and the path stays enabled.
  EXPECT_EQ(run_once(path, request, "", absl::InternalError("boom"), true, &returned), "fast");
  EXPECT_EQ(returned.code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(counters_of("test_failing").disabled);
  // Outside one the request completes on the fallback and the path is disabled for the process.
  EXPECT_EQ(run_once(path, request, "", absl::InternalError("boom"), false, &returned),
            "fast+fallback");
  EXPECT_TRUE(returned.ok()) << returned;
  EXPECT_EQ(run_once(path, request, ""), "fallback");
  const FastPathCounters c = counters_of("test_failing");
  EXPECT_TRUE(c.disabled);
  EXPECT_EQ(c.invocations, 0);
  EXPECT_EQ(c.fallbacks,
            (std::map<std::string, int64_t>{{"disabled_after_error", 1}, {"runtime_error", 1}}));
}

TEST(FastPathRegistryTest, AnInjectedFailureHitsTheNamedPathOnce) {
  static FastPath path(FastPathSpec{"test_injected", FastPathKind::kFused, Quality::kLossless, ""});
  static FastPath other(
      FastPathSpec{"test_bystander", FastPathKind::kFused, Quality::kLossless, ""});
  inject_fast_path_failure("test_injected");
  EXPECT_EQ(run_once(other, RequestOptions{}, ""), "fast");
  EXPECT_EQ(run_once(path, RequestOptions{}, ""), "fallback");  // the injected error, then disabled
  EXPECT_TRUE(counters_of("test_injected").disabled);
  EXPECT_FALSE(counters_of("test_bystander").disabled);
}

}  // namespace
}  // namespace flux2
