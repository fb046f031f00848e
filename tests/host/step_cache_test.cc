// Step caching (model/step_cache.h) without and with a model: cache-dit's decisions (warm-up, the
// MC counter's quirk, R <= 0, R >= 1, the threshold, schedules), the option's checks naming their
// field, the CPU backend's sub and mean_abs_diff_ratio, and on the tiny checkpoints: R = 0 gives
// the uncached bytes, a schedule reuses residuals (and moves the image), per-branch state with CFG.
#include "model/step_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "model/pipeline.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using D = StepCacheDecision;

StepCacheOptions dbcache(int64_t w, int64_t mc, double r) {
  StepCacheOptions o;
  o.mode = StepCacheOptions::Mode::kDbCache;
  o.warmup_steps = w;
  o.max_consecutive_cached = mc;
  o.threshold = r;
  return o;
}

// Runs `decider` over `diffs` (one per step) and returns its decisions.
std::vector<D> decide_all(StepCacheDecider& decider, const std::vector<float>& diffs) {
  std::vector<D> out;
  for (float d : diffs) {
    float recorded = 0.0f;
    auto decision = decider.next(
        true, [d]() -> absl::StatusOr<float> { return d; }, &recorded);
    EXPECT_TRUE(decision.ok());
    out.push_back(*decision);
  }
  return out;
}

// The golden's calibrated dev case (tests/data/cache, case 2): W 2, MC 2, R 0.694.
TEST(StepCacheDecider, CalibratedCaseOfTheGolden) {
  StepCacheDecider decider(dbcache(2, 2, 0.694), {});
  const std::vector<float> diffs = {0, 0, 0.58, 0.82, 0.78, 0.65, 1.0, 0.67, 0.60, 0.5, 0.72, 0.87};
  EXPECT_THAT(decide_all(decider, diffs),
              ElementsAre(D::kWarmup, D::kWarmup, D::kCached, D::kAboveThreshold,
                          D::kAboveThreshold, D::kCached, D::kAboveThreshold, D::kCached,
                          D::kCached, D::kMaxConsecutive, D::kAboveThreshold, D::kAboveThreshold));
}

// cache-dit's counter: the first cached step adds 1, a cached step after a cached one adds 1
// (2 when the counter was 0, after an MC reset), a cached step after a computed one adds nothing:
// with MC 3 and every diff under R the steady state is 3 cached, 1 computed (sglang's trace).
TEST(StepCacheDecider, CounterQuirkGivesThreeCachedOneComputed) {
  StepCacheDecider decider(dbcache(4, 3, 0.24), {});
  const std::vector<D> got = decide_all(decider, std::vector<float>(16, 0.01f));
  EXPECT_THAT(
      got, ElementsAre(D::kWarmup, D::kWarmup, D::kWarmup, D::kWarmup, D::kCached, D::kCached,
                       D::kCached, D::kMaxConsecutive, D::kCached, D::kCached, D::kCached,
                       D::kMaxConsecutive, D::kCached, D::kCached, D::kCached, D::kMaxConsecutive));
}

TEST(StepCacheDecider, ThresholdSpecialCases) {
  StepCacheDecider off(dbcache(2, -1, 0.0), {});
  EXPECT_THAT(decide_all(off, {0, 0, 0, 0}),
              ElementsAre(D::kWarmup, D::kWarmup, D::kThresholdOff, D::kThresholdOff));
  StepCacheDecider always(dbcache(2, -1, 1.0), {});
  EXPECT_THAT(decide_all(always, {9, 9, 9, 9}),
              ElementsAre(D::kWarmup, D::kWarmup, D::kCached, D::kCached));
  float recorded = 0.0f;
  StepCacheDecider none(dbcache(0, -1, 0.5), {});
  auto first = none.next(
      false, []() -> absl::StatusOr<float> { return 0.0f; }, &recorded);
  EXPECT_EQ(*first, D::kNoPrevious);
  EXPECT_EQ(recorded, -1.0f);
}

TEST(StepCacheDecider, ScheduleComputesWhereItSays) {
  StepCacheOptions o;
  o.mode = StepCacheOptions::Mode::kSchedule;
  StepCacheDecider decider(o, {true, false, false, true, false});
  EXPECT_THAT(decide_all(decider, {0, 0, 0, 0, 0}),
              ElementsAre(D::kScheduled, D::kCached, D::kCached, D::kScheduled, D::kCached));
}

TEST(StepCacheSchedule, DefaultAndParsed) {
  const std::vector<bool> s = step_cache_default_schedule(13);
  EXPECT_EQ(s, (std::vector<bool>{1, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1}));
  EXPECT_EQ(*parse_step_cache_schedule("dbcache-default", 13), s);
  EXPECT_EQ(*parse_step_cache_schedule("1, 0,1", 3), (std::vector<bool>{1, 0, 1}));
  EXPECT_THAT(parse_step_cache_schedule("1,2", 2).status().message(),
              HasSubstr("cache.schedule: \"2\""));
}

std::string violations_of(const StepCacheOptions& o, int64_t steps) {
  std::vector<FieldViolation> v;
  check_step_cache(o, steps, &v);
  return describe_violations(v);
}

TEST(StepCacheCheck, RefusesShortRunsAndBadValuesNamingTheField) {
  EXPECT_THAT(violations_of(dbcache(4, 3, 0.24), 8), HasSubstr("cache: step caching needs more"));
  EXPECT_EQ(violations_of(dbcache(4, 3, 0.24), 9), "");
  EXPECT_EQ(violations_of(StepCacheOptions{}, 4), "");  // off: nothing to check
  EXPECT_THAT(violations_of(dbcache(4, 3, -0.5), 50), HasSubstr("cache.threshold: -0.5"));
  EXPECT_THAT(violations_of(dbcache(4, 3, 1.5), 50), HasSubstr("cache.threshold: 1.5"));
  EXPECT_THAT(violations_of(dbcache(-1, 3, 0.2), 50), HasSubstr("cache.warmup_steps: -1"));
  EXPECT_THAT(violations_of(dbcache(4, -2, 0.2), 50),
              HasSubstr("cache.max_consecutive_cached: -2"));
  StepCacheOptions s;
  s.mode = StepCacheOptions::Mode::kSchedule;
  s.schedule = {true, false};
  EXPECT_THAT(violations_of(s, 12), HasSubstr("cache.schedule: 2 flags for a run of 12 steps"));
  s.schedule = std::vector<bool>(12, false);
  EXPECT_THAT(violations_of(s, 12), HasSubstr("cache.schedule[0]: step 0 must compute"));
}

TEST(StepCacheBackend, SubAndMeanAbsDiffRatio) {
  CpuBackend be;
  auto a = be.empty(DType::kF32, {2, 3});
  auto b = be.empty(DType::kF32, {2, 3});
  const float av[] = {1, -2, 3, -4, 5, -6}, bv[] = {1, -1, 1, -1, 1, -1};
  ASSERT_TRUE(be.upload(av, DType::kF32, *a).ok());
  ASSERT_TRUE(be.upload(bv, DType::kF32, *b).ok());
  auto ratio = be.mean_abs_diff_ratio(*a, *b);
  ASSERT_TRUE(ratio.ok());
  EXPECT_FLOAT_EQ(*ratio, (0 + 1 + 2 + 3 + 4 + 5) / 21.0f);
  ASSERT_TRUE(be.sub(*a, *b, *b).ok());  // in place on b
  std::vector<float> out(6);
  ASSERT_TRUE(be.download(*b, out.data()).ok());
  EXPECT_THAT(out, ElementsAre(0, -1, 2, -3, 4, -5));
}

class StepCachePipelineTest : public ::testing::Test {
 protected:
  std::unique_ptr<Pipeline> load(const std::string& dir, bool distilled) {
    PipelineOptions options;
    options.is_distilled = distilled;
    auto pipeline = Pipeline::load(be_, testing::test_data_dir() + dir, options);
    EXPECT_TRUE(pipeline.ok()) << pipeline.status();
    return pipeline.ok() ? std::move(*pipeline) : nullptr;
  }
  static GenerateParams params(int64_t steps) {
    GenerateParams p;
    p.prompt = "a lighthouse at dusk";
    p.width = 48;
    p.height = 32;
    p.num_inference_steps = steps;
    p.max_sequence_length = 32;
    p.seed = 7;
    return p;
  }
  CpuBackend be_;
};

// R = 0 never caches: the bytes of the uncached generation, with CFG (two branches).
TEST_F(StepCachePipelineTest, ThresholdZeroGivesUncachedBytes) {
  auto pipeline = load("/tiny-klein/checkpoint", /*distilled=*/false);
  ASSERT_NE(pipeline, nullptr);
  auto plain = pipeline->generate(params(10));
  ASSERT_TRUE(plain.ok()) << plain.status();
  GenerateParams p = params(10);
  p.cache = dbcache(4, 3, 0.0);
  auto cached = pipeline->generate(p);
  ASSERT_TRUE(cached.ok()) << cached.status();
  EXPECT_EQ(cached->rgb, plain->rgb);
  EXPECT_FALSE(plain->cache.enabled);
  EXPECT_TRUE(cached->cache.enabled);
  EXPECT_EQ(cached->cache.computed[0], 20);  // 10 steps x 2 branches
  EXPECT_EQ(cached->cache.cached[1], 0);
  EXPECT_THAT(cached->cache.traces,
              ElementsAre("double.cond", "single.cond", "double.uncond", "single.uncond"));
}

// A schedule reuses the residuals where it says (per list and branch), the image moves, and a
// schedule of all-compute is the uncached image again.
TEST_F(StepCachePipelineTest, ScheduleCachesAndAllComputeIsUncached) {
  auto pipeline = load("/tiny-flux2-dev/checkpoint", /*distilled=*/true);
  ASSERT_NE(pipeline, nullptr);
  auto plain = pipeline->generate(params(12));
  ASSERT_TRUE(plain.ok()) << plain.status();
  GenerateParams p = params(12);
  p.cache.mode = StepCacheOptions::Mode::kSchedule;
  p.cache.schedule = std::vector<bool>(12, true);
  auto all = pipeline->generate(p);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->rgb, plain->rgb);
  p.cache.schedule = step_cache_default_schedule(12);
  int reported = 0;
  GenerateHooks hooks;
  hooks.on_step_cache = [&](const StepCacheReport& so_far) {
    ++reported;
    EXPECT_EQ(so_far.computed[0] + so_far.cached[0], reported);
  };
  auto cached = pipeline->generate(p, hooks);
  ASSERT_TRUE(cached.ok()) << cached.status();
  EXPECT_EQ(reported, 12);
  EXPECT_NE(cached->rgb, plain->rgb);
  EXPECT_EQ(cached->cache.cached[0], 6);  // steps 5, 6, 7, 9, 10, 11
  EXPECT_EQ(cached->cache.computed[1], 6);
}

TEST_F(StepCachePipelineTest, RefusedForEightStepsNamingTheField) {
  auto pipeline = load("/tiny-klein/checkpoint", /*distilled=*/true);
  ASSERT_NE(pipeline, nullptr);
  GenerateParams p = params(8);
  p.cache = dbcache(4, 3, 0.24);
  const absl::Status status = pipeline->validate(p);
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_THAT(status.message(), HasSubstr("cache: step caching needs more than 8 steps"));
}

}  // namespace
}  // namespace flux2
