// The FLUX.2 transformer tensor table; see flux2_weights.h.
#include "model/flux2_weights.h"

#include "absl/strings/str_cat.h"

namespace flux2 {

std::vector<WeightSpec> Flux2Weights::table(const Flux2Config& config) {
  const int64_t d = config.hidden(), f = config.mlp_hidden(), dh = config.attention_head_dim;
  const int64_t t = config.timestep_guidance_channels;
  std::vector<WeightSpec> specs;
  auto add = [&](std::string name, Shape shape, Tensor* target, int64_t row = 0) {
    specs.push_back(WeightSpec{std::move(name), std::move(shape), target, row});
  };
  // A block projection: FP8-eligible (quality=high keeps its low-precision copy in `target`).
  auto add_projection = [&](std::string name, Shape shape, Weight* target, int64_t row = 0) {
    WeightSpec spec{std::move(name), std::move(shape), &target->tensor, row};
    spec.fp8 = target;
    specs.push_back(std::move(spec));
  };

  add("x_embedder.weight", {d, config.in_channels}, &x_embedder);
  add("context_embedder.weight", {d, config.joint_attention_dim}, &context_embedder);
  add("time_guidance_embed.timestep_embedder.linear_1.weight", {d, t}, &time_linear_1);
  add("time_guidance_embed.timestep_embedder.linear_2.weight", {d, d}, &time_linear_2);
  if (config.guidance_embeds) {
    add("time_guidance_embed.guidance_embedder.linear_1.weight", {d, t}, &guidance_linear_1);
    add("time_guidance_embed.guidance_embedder.linear_2.weight", {d, d}, &guidance_linear_2);
  }
  const Flux2ModulationLayout mod(d);
  add("double_stream_modulation_img.linear.weight", {6 * d, d}, &modulation, mod.img(0));
  add("double_stream_modulation_txt.linear.weight", {6 * d, d}, &modulation, mod.txt(0));
  add("single_stream_modulation.linear.weight", {3 * d, d}, &modulation, mod.single(0));
  add("norm_out.linear.weight", {2 * d, d}, &modulation, mod.out_scale());
  add("proj_out.weight", {config.out_channels, d}, &proj_out);

  double_blocks.resize(static_cast<size_t>(config.num_layers));
  for (int64_t i = 0; i < config.num_layers; ++i) {
    Flux2DoubleBlockWeights& b = double_blocks[i];
    const std::string p = absl::StrCat("transformer_blocks.", i, ".");
    add_projection(p + "attn.to_q.weight", {d, d}, &b.img_qkv, 0);
    add_projection(p + "attn.to_k.weight", {d, d}, &b.img_qkv, d);
    add_projection(p + "attn.to_v.weight", {d, d}, &b.img_qkv, 2 * d);
    add_projection(p + "attn.add_q_proj.weight", {d, d}, &b.txt_qkv, 0);
    add_projection(p + "attn.add_k_proj.weight", {d, d}, &b.txt_qkv, d);
    add_projection(p + "attn.add_v_proj.weight", {d, d}, &b.txt_qkv, 2 * d);
    add(p + "attn.norm_q.weight", {dh}, &b.img_norm_q);
    add(p + "attn.norm_k.weight", {dh}, &b.img_norm_k);
    add(p + "attn.norm_added_q.weight", {dh}, &b.txt_norm_q);
    add(p + "attn.norm_added_k.weight", {dh}, &b.txt_norm_k);
    add_projection(p + "attn.to_out.0.weight", {d, d}, &b.img_out);
    add_projection(p + "attn.to_add_out.weight", {d, d}, &b.txt_out);
    add_projection(p + "ff.linear_in.weight", {2 * f, d}, &b.img_ff_in);
    add_projection(p + "ff.linear_out.weight", {d, f}, &b.img_ff_out);
    add_projection(p + "ff_context.linear_in.weight", {2 * f, d}, &b.txt_ff_in);
    add_projection(p + "ff_context.linear_out.weight", {d, f}, &b.txt_ff_out);
  }
  single_blocks.resize(static_cast<size_t>(config.num_single_layers));
  for (int64_t j = 0; j < config.num_single_layers; ++j) {
    Flux2SingleBlockWeights& b = single_blocks[j];
    const std::string p = absl::StrCat("single_transformer_blocks.", j, ".");
    add_projection(p + "attn.to_qkv_mlp_proj.weight", {3 * d + 2 * f, d}, &b.qkv_mlp);
    add_projection(p + "attn.to_out.weight", {d, d + f}, &b.out);
    add(p + "attn.norm_q.weight", {dh}, &b.norm_q);
    add(p + "attn.norm_k.weight", {dh}, &b.norm_k);
  }
  return specs;
}

}  // namespace flux2
