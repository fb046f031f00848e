// The LoRA-targetable Linears of the FLUX.2 transformer; see lora_targets.h.
// Tested by tests/host/lora_adapter_test.cc.
#include "model/lora_targets.h"

#include "absl/strings/str_cat.h"
#include "model/flux2_weights.h"

namespace flux2 {

std::map<std::string, LoraTarget> flux2_lora_targets(const Flux2Config& config) {
  const int64_t d = config.hidden(), f = config.mlp_hidden();
  const int64_t t = config.timestep_guidance_channels;
  const Flux2ModulationLayout mod(d);
  std::map<std::string, LoraTarget> targets;
  auto add = [&](const std::string& name, LoraTargetKind kind, int64_t block, int64_t offset,
                 int64_t out, int64_t in) {
    targets[name] = {kind, block, offset, out, in};
  };
  using K = LoraTargetKind;
  add("x_embedder", K::kXEmbedder, -1, 0, d, config.in_channels);
  add("context_embedder", K::kContextEmbedder, -1, 0, d, config.joint_attention_dim);
  add("time_guidance_embed.timestep_embedder.linear_1", K::kTimeLinear1, -1, 0, d, t);
  add("time_guidance_embed.timestep_embedder.linear_2", K::kTimeLinear2, -1, 0, d, d);
  if (config.guidance_embeds) {
    add("time_guidance_embed.guidance_embedder.linear_1", K::kGuidanceLinear1, -1, 0, d, t);
    add("time_guidance_embed.guidance_embedder.linear_2", K::kGuidanceLinear2, -1, 0, d, d);
  }
  add("double_stream_modulation_img.linear", K::kModulation, -1, mod.img(0), 6 * d, d);
  add("double_stream_modulation_txt.linear", K::kModulation, -1, mod.txt(0), 6 * d, d);
  add("single_stream_modulation.linear", K::kModulation, -1, mod.single(0), 3 * d, d);
  add("norm_out.linear", K::kModulation, -1, mod.out_scale(), 2 * d, d);  // scale, then shift
  add("proj_out", K::kProjOut, -1, 0, config.out_channels, d);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string p = absl::StrCat("transformer_blocks.", i, ".");
    add(p + "attn.to_q", K::kDoubleImgQkv, i, 0, d, d);
    add(p + "attn.to_k", K::kDoubleImgQkv, i, d, d, d);
    add(p + "attn.to_v", K::kDoubleImgQkv, i, 2 * d, d, d);
    add(p + "attn.add_q_proj", K::kDoubleTxtQkv, i, 0, d, d);
    add(p + "attn.add_k_proj", K::kDoubleTxtQkv, i, d, d, d);
    add(p + "attn.add_v_proj", K::kDoubleTxtQkv, i, 2 * d, d, d);
    add(p + "attn.to_out.0", K::kDoubleImgOut, i, 0, d, d);
    add(p + "attn.to_add_out", K::kDoubleTxtOut, i, 0, d, d);
    add(p + "ff.linear_in", K::kDoubleImgFfIn, i, 0, 2 * f, d);
    add(p + "ff.linear_out", K::kDoubleImgFfOut, i, 0, d, f);
    add(p + "ff_context.linear_in", K::kDoubleTxtFfIn, i, 0, 2 * f, d);
    add(p + "ff_context.linear_out", K::kDoubleTxtFfOut, i, 0, d, f);
  }
  for (int64_t j = 0; j < config.num_single_layers; ++j) {
    const std::string p = absl::StrCat("single_transformer_blocks.", j, ".");
    add(p + "attn.to_qkv_mlp_proj", K::kSingleQkvMlp, j, 0, 3 * d + 2 * f, d);
    add(p + "attn.to_out", K::kSingleOut, j, 0, d, d + f);
  }
  return targets;
}

}  // namespace flux2
