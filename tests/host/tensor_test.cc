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

TEST(FastPathRegistryTest, CountsInvocationsFallbacksAndDisable) {
  static FastPath path("test_path");
  path.count_invocation();
  path.count_fallback("unsupported_shape");
  path.count_fallback("unsupported_shape");
  EXPECT_TRUE(path.enabled());
  set_fast_paths_enabled(false);
  EXPECT_FALSE(path.enabled());
  set_fast_paths_enabled(true);
  path.disable("injected error");
  EXPECT_FALSE(path.enabled());
  for (const FastPathCounters& c : fast_path_snapshot()) {
    if (c.path != "test_path") continue;
    EXPECT_EQ(c.invocations, 1);
    EXPECT_EQ(c.fallbacks.at("unsupported_shape"), 2);
    EXPECT_EQ(c.fallbacks.at("runtime_error"), 1);
    EXPECT_TRUE(c.disabled);
    return;
  }
  FAIL() << "test_path not in the snapshot";
}

}  // namespace
}  // namespace flux2
