// What `flux2 bench` reports beside its timings (server/cli/bench/gpu_sampler.h): the SM clock's
// median and the power's mean over the samples, the JSON fields (prefixed for a second section)
// and the printed text; nothing at all without a GPU. Run:
// build/bin/server_unit_tests --gtest_filter='GpuSampler*'
#include "server/cli/bench/gpu_sampler.h"

#include "gtest/gtest.h"

namespace flux2 {
namespace {

using Reading = server::SystemMetrics::GpuReading;

TEST(GpuSamplerTest, TheSummaryIsTheClocksMedianAndThePowersMean) {
  const std::optional<GpuClockPower> odd =
      summarize_gpu_readings({Reading{1980, 650}, Reading{1500, 300}, Reading{1700, 400}});
  ASSERT_TRUE(odd.has_value());
  EXPECT_EQ(odd->sm_clock_mhz_median, 1700);
  EXPECT_EQ(odd->power_watts_mean, 450);
  EXPECT_EQ(odd->samples, 3);
  // An even count: the upper median, as the bench's step medians.
  const std::optional<GpuClockPower> even =
      summarize_gpu_readings({Reading{2000, 100}, Reading{1000, 300}});
  ASSERT_TRUE(even.has_value());
  EXPECT_EQ(even->sm_clock_mhz_median, 2000);
  EXPECT_EQ(even->power_watts_mean, 200);
}

TEST(GpuSamplerTest, TheFieldsAndTheTextFollowTheSummary) {
  nlohmann::json result = nlohmann::json::object();
  add_clock_power(GpuClockPower{1700, 450.4, 3}, result);
  add_clock_power(GpuClockPower{1650, 420, 2}, result, "without_lora_");
  EXPECT_EQ(result["sm_clock_mhz_median"], 1700);
  EXPECT_EQ(result["power_watts_mean"], 450.4);
  EXPECT_EQ(result["gpu_samples"], 3);
  EXPECT_EQ(result["without_lora_sm_clock_mhz_median"], 1650);
  EXPECT_EQ(result["without_lora_gpu_samples"], 2);
  EXPECT_EQ(clock_power_text(result), " at 1700 MHz, 450 W");
}

// No GPU (or no NVML): no summary, no fields, no text; the bench's numbers stand alone.
TEST(GpuSamplerTest, WithoutAGpuNothingIsReported) {
  EXPECT_FALSE(summarize_gpu_readings({}).has_value());
  GpuSampler sampler("");
  EXPECT_FALSE(sampler.stop().has_value());
  nlohmann::json result = nlohmann::json::object();
  add_clock_power(std::nullopt, result);
  EXPECT_TRUE(result.empty());
  EXPECT_EQ(clock_power_text(result), "");
}

}  // namespace
}  // namespace flux2
