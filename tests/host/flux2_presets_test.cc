// The published shapes: parameter counts from architecture §8 and the floors of performance.md.
#include "model/flux2_presets.h"

#include <gtest/gtest.h>

namespace flux2 {
namespace {

TEST(Flux2PresetsTest, ParameterCountsMatchArchitecture) {
  EXPECT_EQ(flux2_parameter_count(flux2_preset("dev").value()), 32'223'281'152);
  EXPECT_EQ(flux2_parameter_count(flux2_preset("klein-4b").value()), 3'875'544'576);
  EXPECT_EQ(flux2_parameter_count(flux2_preset("klein-9b").value()), 9'078'581'248);
  EXPECT_FALSE(flux2_preset("klein-2b").ok());
}

TEST(Flux2PresetsTest, FloorsMatchPerformanceDoc) {
  // performance.md: about 50 / 110 / 380 ms at 1024² with 512 text tokens.
  EXPECT_NEAR(flux2_floor_ms(flux2_preset("klein-4b").value(), 4096, 512), 50.0, 1.5);
  EXPECT_NEAR(flux2_floor_ms(flux2_preset("klein-9b").value(), 4096, 512), 110.0, 3.0);
  EXPECT_NEAR(flux2_floor_ms(flux2_preset("dev").value(), 4096, 512), 380.0, 10.0);
  // architecture §7: klein-4B forward 28.3 TFLOP linear, 6.5 TFLOP attention.
  const StepFlops flops = flux2_step_flops(flux2_preset("klein-4b").value(), 4096, 512);
  EXPECT_NEAR(flops.linear / 1e12, 28.3, 0.1);
  EXPECT_NEAR(flops.attention / 1e12, 6.5, 0.1);
}

}  // namespace
}  // namespace flux2
