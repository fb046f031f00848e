// Step caching on the GPU (model/step_cache.h): R = 0 gives the uncached request's bytes (every
// latent and pixel, dev and klein base with CFG); mean_abs_diff_ratio is deterministic (the same
// bits twice) and within float64-sum rounding of the CPU's on the same bf16 values; the golden
// cases of tests/data/cache replayed with their recorded decisions forced (a fixed schedule per
// list and branch) report exactly those decisions. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "model/json_util.h"
#include "model/pipeline.h"
#include "tests/cuda/generation_record.h"

namespace flux2 {
namespace {

using testing::GenerationRecord;

GenerationRecord generate(Backend& be, Pipeline& pipeline, const StepCacheOptions& cache,
                          int64_t steps) {
  GenerateParams params;
  params.prompt = "a red fox in the snow, watercolor";
  params.width = 64;
  params.height = 48;
  params.num_inference_steps = steps;
  params.max_sequence_length = 64;
  params.seed = 11;
  params.cache = cache;
  return testing::record_generation(be, pipeline, params);
}

TEST(StepCacheGpuTest, ThresholdZeroIsTheUncachedBytes) {
  FLUX2_REQUIRE_GPU(be);
  StepCacheOptions r0;
  r0.mode = StepCacheOptions::Mode::kDbCache;
  r0.threshold = 0.0;
  for (const auto& [dir, distilled] : {std::pair<std::string, bool>{"/tiny-flux2-dev", true},
                                       std::pair<std::string, bool>{"/tiny-klein", false}}) {
    PipelineOptions options;
    options.is_distilled = distilled;
    auto pipeline = Pipeline::load(*be, testing::test_data_dir() + dir + "/checkpoint", options);
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    const GenerationRecord plain = generate(*be, **pipeline, StepCacheOptions{}, 12);
    const GenerationRecord cached = generate(*be, **pipeline, r0, 12);
    ASSERT_EQ(plain.latents.size(), 13u) << dir;
    EXPECT_EQ(plain.latents, cached.latents) << dir;
    EXPECT_EQ(plain.rgb, cached.rgb) << dir;
    EXPECT_EQ(cached.cache.cached[0] + cached.cache.cached[1], 0) << dir;
  }
}

TEST(StepCacheGpuTest, MeanAbsDiffRatioIsDeterministicAndMatchesTheCpu) {
  FLUX2_REQUIRE_GPU(be);
  // A strided column slice of a wide buffer, as the stream's rows are; 300,000+ elements.
  const Tensor wide_a = testing::random_bf16(*be, 517, 700, 3);
  const Tensor wide_b = testing::random_bf16(*be, 517, 700, 4);
  const Tensor a = wide_a.col_slice(10, 640), b = wide_b.col_slice(10, 640);
  auto first = be->mean_abs_diff_ratio(a, b);
  auto second = be->mean_abs_diff_ratio(a, b);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(std::bit_cast<uint32_t>(*first), std::bit_cast<uint32_t>(*second));
  // The CPU on the same (bf16-exact) values: float64 sums in another order, so within a few
  // float32 ulps of each other (the quotient's rounding), never further.
  CpuBackend cpu;
  auto cpu_a = cpu.empty(DType::kF32, {a.rows(), a.cols()});
  auto cpu_b = cpu.empty(DType::kF32, {b.rows(), b.cols()});
  ASSERT_TRUE(cpu.upload(testing::values(*be, a).data(), DType::kF32, *cpu_a).ok());
  ASSERT_TRUE(cpu.upload(testing::values(*be, b).data(), DType::kF32, *cpu_b).ok());
  auto reference = cpu.mean_abs_diff_ratio(*cpu_a, *cpu_b);
  ASSERT_TRUE(reference.ok());
  EXPECT_GT(*reference, 0.5f);  // not trivially small: two independent uniform tensors
  const float ulp = std::nextafter(*reference, 2.0f) - *reference;
  EXPECT_NEAR(*first, *reference, 4.0f * ulp);
}

// The goldens' decisions, forced: every list and branch computes and caches exactly where
// cache-dit did (bf16 diffs may straddle R, so the GPU replays decisions rather than making them;
// tests/data/README.md, "cache/").
TEST(StepCacheGpuTest, GoldenDecisionsForcedAreReplayed) {
  FLUX2_REQUIRE_GPU(be);
  const std::string dir = testing::test_data_dir() + "/cache";
  auto file = read_json_file(dir + "/cache_cases.json");
  ASSERT_TRUE(file.ok()) << file.status();
  for (const nlohmann::json& item : (*file)["cases"]) {
    PipelineOptions options;
    options.is_distilled = item.at("is_distilled").get<bool>();
    auto pipeline =
        Pipeline::load(*be, dir + "/" + item.at("checkpoint").get<std::string>(), options);
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    const int64_t steps = item.at("steps").get<int64_t>();
    const StepCacheOptions forced = step_cache_replaying(
        steps, item.at("decisions").get<std::map<std::string, std::vector<int>>>());
    GenerateParams params;
    params.prompt = item.at("prompt").get<std::string>();
    params.width = item.at("width").get<int64_t>();
    params.height = item.at("height").get<int64_t>();
    params.num_inference_steps = steps;
    params.seed = item.at("seed").get<uint64_t>();
    params.guidance_scale = item.at("guidance_scale").get<double>();
    params.max_sequence_length = item.at("max_sequence_length").get<int64_t>();
    params.cache = forced;
    auto image = (*pipeline)->generate(params);
    ASSERT_TRUE(image.ok()) << image.status();
    for (size_t t = 0; t < image->cache.traces.size(); ++t) {
      const std::vector<int> golden =
          item.at("decisions").at(image->cache.traces[t]).get<std::vector<int>>();
      ASSERT_EQ(golden.size(), image->cache.decisions[t].size());
      for (size_t s = 0; s < golden.size(); ++s) {
        EXPECT_EQ(golden[s] == static_cast<int>(StepCacheDecision::kCached),
                  image->cache.decisions[t][s] == static_cast<int>(StepCacheDecision::kCached))
            << image->cache.traces[t] << " step " << s << " seed " << params.seed;
      }
    }
  }
}

}  // namespace
}  // namespace flux2
