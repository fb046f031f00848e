// Random-weight pipelines at the published shapes (model/README.md) for `flux2 bench --e2e`: the
// FLUX.2 transformer, its text encoder and the VAE of each model (klein: Qwen3-4B / Qwen3-8B; dev:
// Mistral-Small-3.1-24B's language model, 40 layers tapped at 10/20/30 so only the first 30 run).
// Tested by tests/host/flux2_presets_test.cc (PipelinePresetsTest).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "model/pipeline.h"

namespace flux2 {

// "klein-4b", "klein-9b" or "dev"; `tokenizer_dir` holds a tokenizer.json (Qwen3's for klein,
// Tekken's for dev).
absl::StatusOr<RandomPipelineSpec> random_pipeline_spec(const std::string& model,
                                                        const std::string& tokenizer_dir);

// The published AutoencoderKLFlux2 configuration (model/README.md, "VAE").
VaeConfig published_vae_config();

}  // namespace flux2
