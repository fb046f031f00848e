// The pipeline on the tiny checkpoint (CPU): argument validation names the field, a seed fixes
// the image, the CFG path (with its cached negative-prompt embeddings) repeats exactly, and
// quality=high is refused unless the pipeline was loaded with it, and a request's stages run
// under the options they must (the text encoder lossless whatever the request asks); a cancelled
// request stops between transformer blocks; check() reports every violation, and the model's
// hard limits (ModelLimits) hold.
#include "model/pipeline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "model/scheduler.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using ::testing::HasSubstr;

class PipelineTest : public ::testing::Test {
 protected:
  std::unique_ptr<Pipeline> load(std::optional<bool> distilled = std::nullopt) {
    PipelineOptions options;
    options.is_distilled = distilled;
    auto pipeline =
        Pipeline::load(backend_, testing::test_data_dir() + "/tiny-klein/checkpoint", options);
    EXPECT_TRUE(pipeline.ok()) << pipeline.status();
    return pipeline.ok() ? std::move(*pipeline) : nullptr;
  }
  static GenerateParams small(uint64_t seed) {
    GenerateParams p;
    p.prompt = "a lighthouse at dusk";
    p.width = 48;
    p.height = 32;
    p.num_inference_steps = 2;
    p.max_sequence_length = 32;
    p.seed = seed;
    return p;
  }
  CpuBackend backend_;
};

// A load reports each component twice, starting (with the memory plan's bytes) and in place (with
// the bytes it holds, what PipelineInfo reports), in load order.
TEST_F(PipelineTest, LoadReportsEachComponent) {
  PipelineOptions options;
  std::vector<LoadProgress> seen;
  options.on_progress = [&](const LoadProgress& progress) { seen.push_back(progress); };
  auto pipeline =
      Pipeline::load(backend_, testing::test_data_dir() + "/tiny-klein/checkpoint", options);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  const PipelineInfo& info = (*pipeline)->info();
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"tokenizer", 0},
      {"text_encoder", info.text_encoder_bytes + info.text_encoder_host_bytes},
      {"transformer", info.transformer_bytes},
      {"vae", info.vae_bytes}};
  ASSERT_EQ(seen.size(), 2 * expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const LoadProgress& start = seen[2 * i];
    const LoadProgress& done = seen[2 * i + 1];
    EXPECT_EQ(start.component, expected[i].first);
    EXPECT_LT(start.seconds, 0.0);
    EXPECT_EQ(done.component, expected[i].first);
    EXPECT_GE(done.seconds, 0.0);
    EXPECT_EQ(done.bytes, expected[i].second) << done.component;
    if (i > 0) {
      EXPECT_GT(start.bytes, 0) << start.component << ": the memory plan's estimate";
    }
  }
  EXPECT_THAT(describe(seen[5]), HasSubstr("loaded transformer: "));
  EXPECT_THAT(describe(seen[4]), HasSubstr("loading transformer ("));
}

// check_continue runs at every stage boundary under the options of the stage that follows: the
// text encoder at lossless with the request's fast-path switch (its numerics serve the negative-
// prompt cache of both qualities), then every step and the decode at the request's quality; after
// the request the backend is back to the defaults. A pipeline that ran its text encoder at the
// request's quality fails here (the tiny checkpoint's activations are too small for a numeric
// comparison to show that: fast and exact SiLU round them alike).
TEST_F(PipelineTest, EachStageRunsUnderItsRequestOptions) {
  PipelineOptions options;
  options.is_distilled = false;  // CFG: the negative prompt is encoded too
  options.enable_quality_high = true;
  auto pipeline =
      Pipeline::load(backend_, testing::test_data_dir() + "/tiny-klein/checkpoint", options);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  GenerateParams p = small(3);
  p.quality = Quality::kHigh;
  p.fast_paths = false;
  p.guidance_scale = 4.0;
  std::vector<RequestOptions> seen;
  GenerateHooks hooks;
  hooks.check_continue = [&] {
    seen.push_back(backend_.request());
    return absl::OkStatus();
  };
  ASSERT_TRUE((*pipeline)->generate(p, hooks).ok());
  ASSERT_EQ(seen.size(), 4u);  // text encoder, 2 steps, decode
  EXPECT_EQ(seen[0].quality, Quality::kLossless) << "the text encoder ran at the request's quality";
  EXPECT_FALSE(seen[0].fast_paths);
  for (size_t i = 1; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].quality, Quality::kHigh) << "stage " << i;
    EXPECT_FALSE(seen[i].fast_paths) << "stage " << i;
  }
  EXPECT_EQ(backend_.request().quality, Quality::kLossless);
  EXPECT_TRUE(backend_.request().fast_paths);
}

// On the CPU a request is checked between the transformer's blocks: more than once per step
// (before every block but the first of each forward), and the first failing check ends
// generate() with its status midway through a step, without another block, step or decode.
TEST_F(PipelineTest, CancellationStopsAStepBetweenBlocks) {
  auto pipeline = load();
  ASSERT_NE(pipeline, nullptr);
  const GenerateParams p = small(2);  // 2 steps, distilled: one forward each
  int block_checks = 0, stage_checks = 0, steps_done = 0;
  GenerateHooks hooks;
  hooks.check_continue = [&] {
    ++stage_checks;
    return absl::OkStatus();
  };
  hooks.on_step = [&](int64_t, int64_t, double) { ++steps_done; };
  hooks.check_between_blocks = [&] {
    ++block_checks;
    return absl::OkStatus();
  };
  ASSERT_TRUE(pipeline->generate(p, hooks).ok());
  const int per_step = block_checks / 2;
  EXPECT_EQ(block_checks, 2 * per_step);
  EXPECT_EQ(per_step, 4);      // tiny-klein: 2 double + 3 single blocks
  EXPECT_EQ(stage_checks, 4);  // the text encoder, 2 steps, the decode: unchanged

  const int fail_at = per_step + 2;  // the second check inside step 1
  block_checks = stage_checks = steps_done = 0;
  hooks.check_between_blocks = [&] {
    return ++block_checks == fail_at ? absl::CancelledError("the client went away")
                                     : absl::OkStatus();
  };
  const absl::StatusOr<GeneratedImage> image = pipeline->generate(p, hooks);
  EXPECT_TRUE(absl::IsCancelled(image.status())) << image.status();
  EXPECT_EQ(image.status().message(), "the client went away");
  EXPECT_EQ(block_checks, fail_at);  // no block ran after the failing check
  EXPECT_EQ(steps_done, 1);          // step 0 done, step 1 stopped midway
  EXPECT_EQ(stage_checks, 3);        // the text encoder and 2 steps; no decode
}

TEST_F(PipelineTest, ValidationNamesTheField) {
  auto pipeline = load();
  ASSERT_NE(pipeline, nullptr);
  GenerateParams p = small(1);
  p.width = 50;
  EXPECT_THAT(pipeline->validate(p).message(), HasSubstr("width"));
  p = small(1);
  p.height = -16;
  EXPECT_THAT(pipeline->validate(p).message(), HasSubstr("height"));
  // A reference that is not prepared (a side not a multiple of 16) is named.
  p = small(1);
  p.references.push_back(RgbImage{72, 64, std::vector<uint8_t>(72 * 64 * 3, 9)});
  EXPECT_THAT(std::string(pipeline->validate(p).message()),
              HasSubstr("reference_images[0]: 72x64 is not prepared"));
  p = small(1);
  p.num_inference_steps = 1000;
  EXPECT_THAT(pipeline->validate(p).message(), HasSubstr("num_inference_steps"));
  p = small(1);
  p.guidance_scale = std::nan("");
  EXPECT_THAT(pipeline->validate(p).message(), HasSubstr("guidance_scale"));
  p = small(1);
  p.max_sequence_length = 4096;
  EXPECT_THAT(pipeline->validate(p).message(), HasSubstr("max_sequence_length"));
  p = small(1);
  p.quality = Quality::kHigh;
  EXPECT_THAT(pipeline->validate(p).message(), HasSubstr("quality"));
  EXPECT_TRUE(pipeline->validate(small(1)).ok());
}

// check() reports every violation in field order, each named and described as validate() words
// a lone one; validate() joins them. A size that would come from a refused reference is not
// checked again (its violation says why).
TEST_F(PipelineTest, CheckReportsEveryViolation) {
  auto pipeline = load();
  ASSERT_NE(pipeline, nullptr);
  EXPECT_TRUE(pipeline->check(small(1)).empty());
  GenerateParams p = small(1);
  p.width = 50;
  EXPECT_EQ(pipeline->validate(p).message(), "width: 50 is not a positive multiple of 16");
  p.num_inference_steps = 1000;
  p.guidance_scale = std::nan("");
  p.max_sequence_length = 4096;
  const std::vector<FieldViolation> violations = pipeline->check(p);
  ASSERT_EQ(violations.size(), 4u);
  EXPECT_EQ(violations[0].field, "width");
  EXPECT_EQ(violations[1].field, "num_inference_steps");
  EXPECT_EQ(violations[1].description, "1000 is outside 1..200 (0 = default)");
  EXPECT_EQ(violations[2].field, "guidance_scale");
  EXPECT_EQ(violations[3].field, "max_sequence_length");
  EXPECT_EQ(violations[3].description, "4096 is outside 1..512 (0 = default)");
  const absl::Status status = pipeline->validate(p);
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_EQ(status.message(), describe_violations(violations));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("width: 50 is not a positive multiple of 16; num_inference_steps: 1000"));

  p = small(1);
  p.width = p.height = 0;  // the first reference's size, which is not prepared
  p.references.push_back(RgbImage{72, 64, std::vector<uint8_t>(72 * 64 * 3, 9)});
  p.references.push_back(RgbImage{64, 80, std::vector<uint8_t>(64 * 80 * 3, 9)});
  p.references.push_back(RgbImage{32, 32, std::vector<uint8_t>(32 * 32 * 3, 9)});
  const std::vector<FieldViolation> refs = pipeline->check(p);
  ASSERT_EQ(refs.size(), 2u);
  EXPECT_EQ(refs[0].field, "reference_images[0]");
  EXPECT_THAT(refs[0].description, HasSubstr("72x64 is not prepared"));
  EXPECT_EQ(refs[1].field, "reference_images[2]");
  EXPECT_EQ(refs[1].description, "32x32 is under 64 px a side");
}

// The loaded model publishes its hard bounds, and check() refuses a size past max_pixels without
// multiplying the sides (2^40 x 2^40 would overflow int64).
TEST_F(PipelineTest, ModelLimitsArePublishedAndEnforced) {
  auto pipeline = load();
  ASSERT_NE(pipeline, nullptr);
  const ModelLimits& limits = pipeline->info().hard_limits;
  EXPECT_EQ(limits.max_steps, kMaxInferenceSteps);
  EXPECT_EQ(limits.max_guidance, kMaxGuidanceScale);
  EXPECT_EQ(limits.pixel_multiple, pipeline->info().pixel_multiple);
  EXPECT_EQ(limits.max_sequence_length, pipeline->info().max_sequence_length);
  EXPECT_EQ(limits.max_pixels, kMaxImagePixels);
  GenerateParams p = small(1);
  p.width = 11552;  // 722 x 722 tokens: within the bound
  p.height = 11552;
  EXPECT_TRUE(pipeline->check(p).empty());
  p.width = 11568;  // 723 x 722 tokens: past it
  std::vector<FieldViolation> violations = pipeline->check(p);
  ASSERT_EQ(violations.size(), 2u);
  EXPECT_EQ(violations[0].field, "width");
  EXPECT_EQ(violations[1].field, "height");
  EXPECT_THAT(violations[0].description,
              HasSubstr("11568 x 11552 exceeds the model's bound of 133491456 pixels"));
  p.width = p.height = int64_t{1} << 40;
  EXPECT_EQ(pipeline->check(p).size(), 2u);
}

// kMaxImageTokens is where the FLUX.2 schedule stops being finite (model_limits.h): float(exp(mu))
// overflows one token later. Well before it the schedule degenerates as the comment says.
TEST(ModelLimitsTest, ImageTokenBoundIsWhereTheScheduleTurnsNaN) {
  const SchedulerConfig config;  // FLUX.2's: dynamic shifting, exponential time shift
  auto finite = [](const Schedule& schedule) {
    for (float sigma : schedule.sigmas) {
      if (!std::isfinite(sigma)) return false;
    }
    return true;
  };
  for (int64_t steps : {int64_t{1}, int64_t{4}, int64_t{50}, kMaxInferenceSteps}) {
    EXPECT_TRUE(finite(make_schedule(config, steps, kMaxImageTokens))) << steps;
    EXPECT_FALSE(finite(make_schedule(config, steps, kMaxImageTokens + 1))) << steps;
  }
  for (int64_t steps : {int64_t{4}, int64_t{50}}) {
    const Schedule at_4096 = make_schedule(config, steps, 65536);  // 4096 x 4096
    const Schedule at_8192x4096 = make_schedule(config, steps, 131072);
    for (int64_t i = 0; i < steps; ++i) {
      EXPECT_GT(at_4096.sigmas[i], 1.0f - 5e-4f) << steps << " steps, sigma " << i;
      EXPECT_EQ(at_8192x4096.sigmas[i], 1.0f) << steps << " steps, sigma " << i;
    }
  }
}

// 0 x 0 means the first reference's size, else 1024 x 1024 (diffusers' defaults).
TEST(OutputSizeTest, DefaultsToTheFirstReference) {
  GenerateParams p;
  EXPECT_EQ(output_size(p).width, 1024);
  EXPECT_EQ(output_size(p).height, 1024);
  p.references.push_back(RgbImage{96, 64, {}});
  p.references.push_back(RgbImage{128, 128, {}});
  EXPECT_EQ(output_size(p).width, 96);
  EXPECT_EQ(output_size(p).height, 64);
  p.width = 48;
  EXPECT_EQ(output_size(p).width, 48);
  EXPECT_EQ(output_size(p).height, 64);
}

TEST_F(PipelineTest, SeedFixesTheImage) {
  auto pipeline = load();
  ASSERT_NE(pipeline, nullptr);
  auto a = pipeline->generate(small(3)), b = pipeline->generate(small(3)),
       c = pipeline->generate(small(4));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->rgb.size(), 48u * 32u * 3u);
  EXPECT_EQ(a->rgb, b->rgb);
  EXPECT_NE(a->rgb, c->rgb);
  EXPECT_EQ(a->timings.steps.size(), 2u);
}

TEST_F(PipelineTest, CfgRepeatsExactlyWithCachedNegativeEmbeddings) {
  auto pipeline = load(/*distilled=*/false);
  ASSERT_NE(pipeline, nullptr);
  EXPECT_TRUE(pipeline->info().uses_cfg);
  GenerateParams p = small(5);
  p.guidance_scale = 4.0;
  auto first = pipeline->generate(p), second = pipeline->generate(p);  // second uses the cache
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->rgb, second->rgb);
  p.negative_prompt = "blurry";
  auto other = pipeline->generate(p);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->rgb, first->rgb);  // a different negative prompt is not served from the cache
  p.negative_prompt = "";
  auto back = pipeline->generate(p);  // "" again, from the cache that now holds two prompts
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->rgb, first->rgb);
}

TEST_F(PipelineTest, TinyCheckpointIsNamedByItsDirectory) {
  auto pipeline = load();
  ASSERT_NE(pipeline, nullptr);
  EXPECT_EQ(pipeline->info().model_name, "tiny-klein");
  EXPECT_THAT(pipeline->info().load_summary(), HasSubstr("tiny-klein"));
}

}  // namespace
}  // namespace flux2
