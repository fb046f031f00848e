// Random-weight pipelines at the published shapes (architecture §0, §3, §4) for `flux2 bench
// --e2e`: the FLUX.2 transformer, its text encoder and the VAE of each model. FLUX.2-dev's text
// encoder (Mistral-Small-3.x 24B, 40 layers, tapped at 10/20/30 so only the first 30 run) is
// modelled by the Qwen3 encoder at Mistral's dimensions: same GEMM and attention shapes; Mistral
// has no q/k RMSNorm (a negligible cost). Tested by tests/host/flux2_presets_test.cc
// (PipelinePresetsTest).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "model/pipeline.h"

namespace flux2 {

// "klein-4b", "klein-9b" or "dev"; `tokenizer_dir` holds a tokenizer.json.
absl::StatusOr<RandomPipelineSpec> random_pipeline_spec(const std::string& model,
                                                        const std::string& tokenizer_dir);

// The published AutoencoderKLFlux2 configuration (architecture §3).
VaeConfig published_vae_config();

}  // namespace flux2
