// The Qwen3 text-encoder tensor table and unused-tensor filter; see qwen3_weights.h.
// Tested by tests/host/qwen3_encoder_test.cc.
#include "model/qwen3_weights.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace flux2 {
namespace {

constexpr absl::string_view kLayerPrefix = "model.layers.";

// The per-layer tensor names of Qwen3ForCausalLM, after "model.layers.{i}.".
constexpr absl::string_view kLayerTensors[] = {
    "input_layernorm.weight",  "self_attn.q_proj.weight",
    "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
};

}  // namespace

std::vector<WeightSpec> Qwen3Weights::table(const Qwen3Config& config, int64_t num_layers) {
  const int64_t d = config.hidden_size, dh = config.head_dim, i_size = config.intermediate_size;
  const int64_t q_width = config.num_attention_heads * dh,
                kv_width = config.num_key_value_heads * dh;
  std::vector<WeightSpec> specs;
  auto add = [&](std::string name, Shape shape, Tensor* target, int64_t row = 0) {
    specs.push_back(WeightSpec{std::move(name), std::move(shape), target, row});
  };

  add("model.embed_tokens.weight", {config.vocab_size, d}, &embed_tokens);
  layers.resize(static_cast<size_t>(num_layers));
  for (int64_t i = 0; i < num_layers; ++i) {
    Qwen3LayerWeights& l = layers[i];
    const std::string p = absl::StrCat(kLayerPrefix, i, ".");
    add(p + "input_layernorm.weight", {d}, &l.input_norm);
    add(p + "self_attn.q_proj.weight", {q_width, d}, &l.qkv, 0);
    add(p + "self_attn.k_proj.weight", {kv_width, d}, &l.qkv, q_width);
    add(p + "self_attn.v_proj.weight", {kv_width, d}, &l.qkv, q_width + kv_width);
    add(p + "self_attn.q_norm.weight", {dh}, &l.q_norm);
    add(p + "self_attn.k_norm.weight", {dh}, &l.k_norm);
    add(p + "self_attn.o_proj.weight", {d, q_width}, &l.o_proj);
    add(p + "post_attention_layernorm.weight", {d}, &l.post_norm);
    add(p + "mlp.gate_proj.weight", {i_size, d}, &l.gate_up, 0);
    add(p + "mlp.up_proj.weight", {i_size, d}, &l.gate_up, i_size);
    add(p + "mlp.down_proj.weight", {d, i_size}, &l.down_proj);
  }
  return specs;
}

UnusedTensorFilter qwen3_unused_tensors(const Qwen3Config& config, int64_t num_layers) {
  const int64_t total_layers = config.num_hidden_layers;
  return [num_layers, total_layers](absl::string_view name) {
    if (name == "model.norm.weight" || name == "lm_head.weight") return true;
    if (!absl::ConsumePrefix(&name, kLayerPrefix)) return false;
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
      if (suffix == known) return true;
    }
    return false;
  };
}

}  // namespace flux2
