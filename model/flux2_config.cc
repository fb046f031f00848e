// Flux2Config parsing and checks; see flux2_config.h.
#include "model/flux2_config.h"

#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "model/json_util.h"

namespace flux2 {

absl::StatusOr<Flux2Config> Flux2Config::from_json(const nlohmann::json& json,
                                                   const std::string& source) {
  Flux2Config config;
  JsonFields f(json, source);
  FLUX_RETURN_IF_ERROR(f.read("patch_size", &config.patch_size));
  FLUX_RETURN_IF_ERROR(f.read("in_channels", &config.in_channels));
  config.out_channels = config.in_channels;
  FLUX_RETURN_IF_ERROR(f.read("out_channels", &config.out_channels));
  FLUX_RETURN_IF_ERROR(f.read("num_layers", &config.num_layers));
  FLUX_RETURN_IF_ERROR(f.read("num_single_layers", &config.num_single_layers));
  FLUX_RETURN_IF_ERROR(f.read("attention_head_dim", &config.attention_head_dim));
  FLUX_RETURN_IF_ERROR(f.read("num_attention_heads", &config.num_attention_heads));
  FLUX_RETURN_IF_ERROR(f.read("joint_attention_dim", &config.joint_attention_dim));
  FLUX_RETURN_IF_ERROR(f.read("timestep_guidance_channels", &config.timestep_guidance_channels));
  FLUX_RETURN_IF_ERROR(f.read("mlp_ratio", &config.mlp_ratio));
  FLUX_RETURN_IF_ERROR(f.read("axes_dims_rope", &config.axes_dims_rope));
  FLUX_RETURN_IF_ERROR(f.read("rope_theta", &config.rope_theta));
  FLUX_RETURN_IF_ERROR(f.read("eps", &config.eps));
  FLUX_RETURN_IF_ERROR(f.read("guidance_embeds", &config.guidance_embeds));

  auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
  };
  if (config.patch_size != 1) return invalid("only patch_size 1 is supported");
  if (config.in_channels <= 0 || config.out_channels <= 0)
    return invalid("channels must be positive");
  if (config.num_layers < 0 || config.num_single_layers < 0) return invalid("negative block count");
  if (config.num_attention_heads <= 0 || config.attention_head_dim <= 0 ||
      config.attention_head_dim % 2 != 0) {
    return invalid("heads and an even attention_head_dim must be positive");
  }
  const int64_t rope_dims =
      std::accumulate(config.axes_dims_rope.begin(), config.axes_dims_rope.end(), int64_t{0});
  if (rope_dims != config.attention_head_dim) {
    return invalid(absl::StrCat("axes_dims_rope sums to ", rope_dims, ", not attention_head_dim ",
                                config.attention_head_dim));
  }
  for (int64_t dim : config.axes_dims_rope) {
    if (dim <= 0 || dim % 2 != 0)
      return invalid("every axes_dims_rope entry must be even and positive");
  }
  if (config.timestep_guidance_channels <= 0 || config.timestep_guidance_channels % 2 != 0) {
    return invalid("timestep_guidance_channels must be even and positive");
  }
  if (config.mlp_ratio <= 0 || config.joint_attention_dim <= 0) {
    return invalid("mlp_ratio and joint_attention_dim must be positive");
  }
  return config;
}

std::string Flux2Config::summary() const {
  return absl::StrCat("FLUX.2 transformer: ", num_layers, " double + ", num_single_layers,
                      " single blocks, ", num_attention_heads, " heads x ", attention_head_dim,
                      " = hidden ", hidden(), ", text width ", joint_attention_dim,
                      guidance_embeds ? ", guidance embedder" : "");
}

}  // namespace flux2
