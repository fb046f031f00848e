// Published pipeline shapes with random weights; see pipeline_presets.h.
#include "model/pipeline_presets.h"

#include "kernels/base/status.h"
#include "model/flux2_presets.h"

namespace flux2 {

VaeConfig published_vae_config() {
  VaeConfig vae;  // the struct's defaults are the published decoder
  vae.block_out_channels = {128, 256, 512, 512};
  vae.encoder_block_out_channels = vae.block_out_channels;
  vae.layers_per_block = 2;
  vae.latent_channels = 32;
  vae.norm_num_groups = 32;
  return vae;
}

absl::StatusOr<RandomPipelineSpec> random_pipeline_spec(const std::string& model,
                                                        const std::string& tokenizer_dir) {
  RandomPipelineSpec spec;
  FLUX_ASSIGN_OR_RETURN(spec.transformer, flux2_preset(model));
  spec.name = model + " (random weights)";
  spec.tokenizer_dir = tokenizer_dir;
  spec.vae = published_vae_config();
  TextEncoderConfig& te = spec.text_encoder;
  if (model == "dev") {  // Mistral-Small-3.1-24B's language model, taps 10/20/30
    te = TextEncoderConfig::mistral_small_3();
    spec.taps = {10, 20, 30};
    spec.pipeline_class = "Flux2Pipeline";
    return spec;
  }
  te.num_hidden_layers = 36;
  te.num_attention_heads = 32;
  te.num_key_value_heads = 8;
  te.head_dim = 128;
  if (model == "klein-4b") {  // Qwen3-4B
    te.hidden_size = 2560;
    te.intermediate_size = 9728;
  } else {  // klein-9b: Qwen3-8B
    te.hidden_size = 4096;
    te.intermediate_size = 12288;
  }
  return spec;
}

}  // namespace flux2
