// TextEncoderWeights: the text encoder's parameters on a backend (embedding plus the decoder layers
// up to the last tap), the tensor table that maps the HF checkpoint names onto them (Qwen3's
// `model.*`; Mistral3's `language_model.model.*` or `model.language_model.*`), and the filter that
// lets the loader skip exactly the tensors the encoder never needs (later layers, final norm,
// lm_head, a Mistral3 checkpoint's vision tower and projector) without reading them. Tested by
// tests/host/text_encoder_test.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/text_encoder.h"
#include "model/weight_loader.h"

namespace flux2 {

// The projections are Weights: an FP8 text-encoder file's (model/text_encoder_checkpoint.h) stay
// stored FP8 on the device (Fp8Placement::kStored), each dequantized as its GEMM runs.
struct TextEncoderLayerWeights {  // <prefix>layers.{i}
  Tensor input_norm;              // [hidden]               input_layernorm
  Weight qkv;                     // [(H + 2 Hkv) Dh, hidden]  self_attn.q_proj | k_proj | v_proj
  Tensor q_norm;                  // [Dh]                   self_attn.q_norm (Qwen3 only)
  Tensor k_norm;                  // [Dh]                   self_attn.k_norm (Qwen3 only)
  Weight o_proj;                  // [hidden, H Dh]         self_attn.o_proj
  Tensor post_norm;               // [hidden]               post_attention_layernorm
  Weight gate_up;                 // [2I, hidden]           mlp.gate_proj | up_proj
  Weight down_proj;               // [hidden, I]            mlp.down_proj

  // Every tensor of the layer, projections' values first (streamed copies pair them up).
  std::vector<const Tensor*> tensors() const {
    return {&qkv.tensor, &o_proj.tensor, &gate_up.tensor, &down_proj.tensor,
            &input_norm, &q_norm,        &k_norm,         &post_norm};
  }
};

// The per-layer table of one layer: its specs (names after "<prefix>layers.{i}.") point into `l`.
std::vector<WeightSpec> text_encoder_layer_table(const TextEncoderConfig& config,
                                                 const std::string& layer_prefix,
                                                 TextEncoderLayerWeights& l);

struct TextEncoderWeights {
  Tensor embed_tokens;  // [vocab, hidden]  <prefix>embed_tokens
  std::vector<TextEncoderLayerWeights> layers;

  // The tensor table for layers 0..num_layers-1 (resizes `layers`; targets point into *this).
  // `prefix` is the checkpoint's name prefix of the language model ("model." for Qwen3). The
  // embedding is a host target (the encoder gathers its rows on the host: 0.8-1.3 GB less device
  // memory), and so are the layers when `residency` is kStreamed.
  std::vector<WeightSpec> table(const TextEncoderConfig& config, int64_t num_layers,
                                const std::string& prefix = "model.",
                                WeightResidency residency = WeightResidency::kDevice);
};

// The language model's name prefix in `checkpoint`: "model." (Qwen3, MistralForCausalLM) or, for a
// Mistral3ForConditionalGeneration, "language_model.model." (the original layout, which
// transformers 5 writes) or "model.language_model." (transformers 4.52-4.x); the first whose
// embed_tokens.weight is present. NotFound naming the candidates otherwise.
absl::StatusOr<std::string> text_encoder_prefix(const TextEncoderConfig& config,
                                                const ComponentWeights& checkpoint);

// Accepts only the checkpoint tensors that an encoder running the first `num_layers` layers leaves
// unread: every known tensor of layers num_layers..num_hidden_layers-1, <prefix>norm.weight, the
// lm_head, and (Mistral3) everything of the vision tower and the multimodal projector. Anything
// else (a misspelt name, a layer index beyond the config) stays an error.
UnusedTensorFilter text_encoder_unused_tensors(const TextEncoderConfig& config, int64_t num_layers,
                                               const std::string& prefix = "model.");

}  // namespace flux2
