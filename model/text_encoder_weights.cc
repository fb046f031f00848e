// The text-encoder tensor table, name prefixes and unused-tensor filter; see
// text_encoder_weights.h. Tested by tests/host/text_encoder_test.cc.
#include "model/text_encoder_weights.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace flux2 {
namespace {

// The per-layer tensor names, after "<prefix>layers.{i}."; q_norm / k_norm are Qwen3's only.
constexpr absl::string_view kLayerTensors[] = {
    "input_layernorm.weight",  "self_attn.q_proj.weight",
    "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
};

bool has_qk_norm(const TextEncoderConfig& config) {
  return config.family == TextEncoderFamily::kQwen3;
}

std::vector<std::string> prefix_candidates(const TextEncoderConfig& config) {
  if (config.family == TextEncoderFamily::kQwen3) return {"model."};
  return {"language_model.model.", "model.language_model.", "model."};
}

}  // namespace

std::vector<WeightSpec> text_encoder_layer_table(const TextEncoderConfig& config,
                                                 const std::string& p, TextEncoderLayerWeights& l) {
  const int64_t d = config.hidden_size, dh = config.head_dim, i_size = config.intermediate_size;
  const int64_t q_width = config.num_attention_heads * dh,
                kv_width = config.num_key_value_heads * dh;
  std::vector<WeightSpec> specs;
  auto add = [&](absl::string_view name, Shape shape, Tensor* target, int64_t row = 0) {
    specs.push_back(WeightSpec{absl::StrCat(p, name), std::move(shape), target, row});
  };
  // A projection: an FP8 file's may stay stored (Fp8Placement::kStored); the text encoder never
  // registers quality=high copies (it always runs lossless).
  auto add_projection = [&](absl::string_view name, Shape shape, Weight* target, int64_t row) {
    add(name, std::move(shape), &target->tensor, row);
    specs.back().fp8 = target;
  };
  add("input_layernorm.weight", {d}, &l.input_norm);
  add_projection("self_attn.q_proj.weight", {q_width, d}, &l.qkv, 0);
  add_projection("self_attn.k_proj.weight", {kv_width, d}, &l.qkv, q_width);
  add_projection("self_attn.v_proj.weight", {kv_width, d}, &l.qkv, q_width + kv_width);
  if (has_qk_norm(config)) {
    add("self_attn.q_norm.weight", {dh}, &l.q_norm);
    add("self_attn.k_norm.weight", {dh}, &l.k_norm);
  }
  add_projection("self_attn.o_proj.weight", {d, q_width}, &l.o_proj, 0);
  add("post_attention_layernorm.weight", {d}, &l.post_norm);
  add_projection("mlp.gate_proj.weight", {i_size, d}, &l.gate_up, 0);
  add_projection("mlp.up_proj.weight", {i_size, d}, &l.gate_up, i_size);
  add_projection("mlp.down_proj.weight", {d, i_size}, &l.down_proj, 0);
  return specs;
}

std::vector<WeightSpec> TextEncoderWeights::table(const TextEncoderConfig& config,
                                                  int64_t num_layers, const std::string& prefix,
                                                  WeightResidency residency) {
  std::vector<WeightSpec> specs;
  WeightSpec embedding{
      prefix + "embed_tokens.weight", {config.vocab_size, config.hidden_size}, &embed_tokens};
  embedding.host = true;
  specs.push_back(std::move(embedding));
  layers.resize(static_cast<size_t>(num_layers));
  for (int64_t i = 0; i < num_layers; ++i) {
    std::vector<WeightSpec> layer =
        text_encoder_layer_table(config, absl::StrCat(prefix, "layers.", i, "."), layers[i]);
    for (WeightSpec& spec : layer) spec.host = residency == WeightResidency::kStreamed;
    specs.insert(specs.end(), layer.begin(), layer.end());
  }
  return specs;
}

absl::StatusOr<std::string> text_encoder_prefix(const TextEncoderConfig& config,
                                                const ComponentWeights& checkpoint) {
  const std::vector<std::string> candidates = prefix_candidates(config);
  for (const std::string& prefix : candidates) {
    if (checkpoint.find(prefix + "embed_tokens.weight") != nullptr) return prefix;
  }
  return absl::NotFoundError(absl::StrCat(checkpoint.dir(), ": no text-encoder embedding: none of ",
                                          absl::StrJoin(candidates, ", ",
                                                        [](std::string* out, const std::string& p) {
                                                          absl::StrAppend(out, "\"", p,
                                                                          "embed_tokens.weight\"");
                                                        }),
                                          " is in the checkpoint"));
}

UnusedTensorFilter text_encoder_unused_tensors(const TextEncoderConfig& config, int64_t num_layers,
                                               const std::string& prefix) {
  const int64_t total_layers = config.num_hidden_layers;
  const bool mistral = config.family == TextEncoderFamily::kMistral;
  const bool qk_norm = has_qk_norm(config);
  return [num_layers, total_layers, prefix, mistral, qk_norm](absl::string_view name) {
    if (name == prefix + "norm.weight" || name == "lm_head.weight") return true;
    if (mistral) {
      // Mistral3ForConditionalGeneration: its lm_head and the image path, in either layout and in
      // ComfyUI's single files (the language model under model.*, the image path at the top
      // level), whose tokenizer rides along as a U8 tensor.
      if (name == "tekken_model") return true;
      for (absl::string_view unused :
           {"language_model.lm_head.", "vision_tower.", "multi_modal_projector.",
            "model.vision_tower.", "model.multi_modal_projector."}) {
        if (absl::StartsWith(name, unused)) return true;
      }
    }
    if (!absl::ConsumePrefix(&name, prefix + "layers.")) return false;
    const size_t dot = name.find('.');
    if (dot == absl::string_view::npos) return false;
    const absl::string_view index_text = name.substr(0, dot);
    int64_t index = 0;
    // Canonical decimal only: "05" or "+5" is not a layer name the checkpoint writer produces.
    if (index_text.empty() || (index_text.size() > 1 && index_text[0] == '0') ||
        index_text[0] < '0' || index_text[0] > '9' || !absl::SimpleAtoi(index_text, &index)) {
      return false;
    }
    if (index < num_layers || index >= total_layers) return false;
    const absl::string_view suffix = name.substr(dot + 1);
    for (absl::string_view known : kLayerTensors) {
      if (!qk_norm && absl::StrContains(known, "_norm.weight") &&
          absl::StartsWith(known, "self_attn."))
        continue;
      if (suffix == known) return true;
    }
    return false;
  };
}

}  // namespace flux2
