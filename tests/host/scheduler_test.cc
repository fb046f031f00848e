// The flow-matching schedule against diffusers' values (model/README.md) and the numpy rules.
#include "model/scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace flux2 {
namespace {

TEST(SchedulerTest, EmpiricalMuMatchesReferenceValues) {
  // Computed by diffusers' compute_empirical_mu.
  EXPECT_NEAR(flux2_empirical_mu(4096, 4), 2.291180, 1e-6);
  EXPECT_NEAR(flux2_empirical_mu(4096, 28), 2.151443, 1e-6);
  EXPECT_NEAR(flux2_empirical_mu(4096, 50), 2.023351, 1e-6);
  EXPECT_NEAR(flux2_empirical_mu(1024, 4), 2.030690, 1e-6);
  EXPECT_NEAR(flux2_empirical_mu(1024, 50), 1.701956, 1e-6);
  EXPECT_NEAR(flux2_empirical_mu(16384, 4), 3.229986, 1e-6);
  EXPECT_EQ(flux2_empirical_mu(16384, 4), flux2_empirical_mu(16384, 50));  // n > 4300: no N term
}

TEST(SchedulerTest, FourStepScheduleAt1024) {
  const Schedule schedule = make_schedule(SchedulerConfig{}, 4, 4096);
  ASSERT_EQ(schedule.sigmas.size(), 5u);
  ASSERT_EQ(schedule.timesteps.size(), 4u);
  const double expected[] = {1.0, 0.96738398, 0.90814394, 0.76720000, 0.0};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(schedule.sigmas[i], expected[i], 1e-6) << i;
  EXPECT_EQ(schedule.sigmas.front(), 1.0f);
  EXPECT_EQ(schedule.timesteps[0], 1000.0f);
  EXPECT_FLOAT_EQ(schedule.dt(3), -schedule.sigmas[3]);
}

TEST(SchedulerTest, SigmasDecreaseToZero) {
  for (int steps : {1, 2, 7, 50}) {
    const Schedule schedule = make_schedule(SchedulerConfig{}, steps, 1024);
    EXPECT_EQ(schedule.sigmas.back(), 0.0f);
    for (int i = 0; i < steps; ++i) EXPECT_GT(schedule.sigmas[i], schedule.sigmas[i + 1]) << steps;
  }
}

TEST(SchedulerTest, CustomSigmasAreShiftedLikeTheDefaultOnes) {
  // linspace(1, 1/4, 4) given explicitly: the default schedule, bit for bit.
  const std::vector<double> linspace = {1.0, 0.75, 0.5, 0.25};
  const Schedule given = make_schedule(SchedulerConfig{}, 4, 4096, linspace);
  const Schedule standard = make_schedule(SchedulerConfig{}, 4, 4096);
  EXPECT_EQ(given.sigmas, standard.sigmas);
  EXPECT_EQ(given.timesteps, standard.timesteps);
  // Any other list: float32(s), then e^mu / (e^mu + 1/s - 1), mu from the step count, 0 appended.
  const std::vector<double> custom = {0.9, 0.5, 0.125};
  const Schedule schedule = make_schedule(SchedulerConfig{}, 3, 1024, custom);
  const float e_mu = static_cast<float>(std::exp(flux2_empirical_mu(1024, 3)));
  ASSERT_EQ(schedule.sigmas.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    const float s = static_cast<float>(custom[i]);
    EXPECT_EQ(schedule.sigmas[i], e_mu / (e_mu + (1.0f / s - 1.0f))) << i;
    EXPECT_EQ(schedule.timesteps[i], schedule.sigmas[i] * 1000.0f) << i;
  }
  EXPECT_EQ(schedule.sigmas[3], 0.0f);
}

TEST(SchedulerTest, CustomSigmasRefusalsNameTheValue) {
  std::vector<FieldViolation> violations;
  check_custom_sigmas(std::vector<double>{1.0, 0.5}, 2, 50, &violations);
  EXPECT_TRUE(violations.empty());
  check_custom_sigmas(std::vector<double>{1.0, 0.5}, 3, 50, &violations);
  ASSERT_EQ(violations.size(), 1u);
  EXPECT_EQ(violations[0].field, "sigmas");
  EXPECT_EQ(violations[0].description, "2 values for 3 steps (one sigma per step)");
  violations.clear();
  check_custom_sigmas(std::vector<double>{0.5, 0.5, -1.0, 0.25}, 4, 50, &violations);
  ASSERT_EQ(violations.size(), 2u);
  EXPECT_EQ(violations[0].field, "sigmas[1]");
  EXPECT_EQ(violations[1].field, "sigmas[2]");
  EXPECT_EQ(violations[1].description, "-1 is not in (0, 1]");
}

TEST(SchedulerTest, RejectsUnsupportedOptions) {
  nlohmann::json config = {{"use_karras_sigmas", true}};
  auto parsed = SchedulerConfig::from_json(config, "scheduler_config.json");
  EXPECT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("use_karras_sigmas"), std::string::npos);
}

}  // namespace
}  // namespace flux2
