// Qwen3Weights: the text encoder's parameters on a backend (embedding plus the decoder layers up
// to the last tap), the tensor table that maps the HF checkpoint names onto them, and the filter
// that lets the loader skip exactly the tensors the encoder never needs (later layers, final norm,
// lm_head) without reading them. Tested by tests/host/qwen3_encoder_test.cc.
#pragma once

#include <cstdint>
#include <vector>

#include "model/qwen3_encoder.h"
#include "model/weight_loader.h"

namespace flux2 {

struct Qwen3LayerWeights {  // model.layers.{i}
  Tensor input_norm;        // [hidden]               input_layernorm
  Tensor qkv;               // [(H + 2 Hkv) Dh, hidden]  self_attn.q_proj | k_proj | v_proj
  Tensor q_norm;            // [Dh]                   self_attn.q_norm
  Tensor k_norm;            // [Dh]                   self_attn.k_norm
  Tensor o_proj;            // [hidden, H Dh]         self_attn.o_proj
  Tensor post_norm;         // [hidden]               post_attention_layernorm
  Tensor gate_up;           // [2I, hidden]           mlp.gate_proj | up_proj
  Tensor down_proj;         // [hidden, I]            mlp.down_proj
};

struct Qwen3Weights {
  Tensor embed_tokens;  // [vocab, hidden]  model.embed_tokens
  std::vector<Qwen3LayerWeights> layers;

  // The tensor table for layers 0..num_layers-1 (resizes `layers`; targets point into *this).
  std::vector<WeightSpec> table(const Qwen3Config& config, int64_t num_layers);
};

// Accepts only the checkpoint tensors of a Qwen3ForCausalLM that an encoder running the first
// `num_layers` layers leaves unread: every known tensor of layers num_layers..num_hidden_layers-1,
// model.norm.weight and lm_head.weight. Anything else (a misspelt name, a layer index beyond the
// config) stays an error.
UnusedTensorFilter qwen3_unused_tensors(const Qwen3Config& config, int64_t num_layers);

}  // namespace flux2
