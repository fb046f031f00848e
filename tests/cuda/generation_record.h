// A generation on the GPU recorded for byte comparisons: the latents' bf16 bits after every step,
// the pixels and the step-cache report. Shared by pipeline_fast_paths_test.cc and
// step_cache_test.cc (header only: it needs model/pipeline, which gpu_test_util does not link).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "model/pipeline.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2::testing {

struct GenerationRecord {
  std::vector<std::vector<uint16_t>> latents;
  std::vector<uint8_t> rgb;
  StepCacheReport cache;
};

// Generates `params` on `pipeline` (whose backend is `be`); a failure is a test failure and leaves
// the record empty.
inline GenerationRecord record_generation(Backend& be, Pipeline& pipeline,
                                          const GenerateParams& params) {
  GenerationRecord run;
  GenerateHooks hooks;
  hooks.on_latents = [&](int64_t, const Tensor& latents) {
    run.latents.push_back(bits(be, latents));
  };
  auto image = pipeline.generate(params, hooks);
  EXPECT_TRUE(image.ok()) << image.status();
  if (image.ok()) {
    run.rgb = image->rgb;
    run.cache = image->cache;
  }
  return run;
}

}  // namespace flux2::testing
