// The Qwen3 text encoder of FLUX.2-klein (Qwen3ForCausalLM, architecture §2.2 and §4): causal
// GQA attention with per-head q/k RMSNorm and half-split RoPE, SwiGLU MLP. Only the decoder
// layers up to the last tapped layer are loaded and run; the taps' hidden states (pre final norm)
// are stacked into prompt embeddings [L, taps x hidden]. Tested by
// `flux2 check-golden --only text_encoder` and tests/host/qwen3_encoder_test.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/activation_tap.h"
#include "model/checkpoint.h"
#include "nlohmann/json.hpp"

namespace flux2 {

struct Qwen3Config {
  int64_t hidden_size = 2560;        // klein-4B: 2560; klein-9B (Qwen3-8B): 4096
  int64_t num_hidden_layers = 36;    // layers in the checkpoint (only those <= last tap run)
  int64_t num_attention_heads = 32;  // query heads
  int64_t num_key_value_heads = 8;   // GQA key/value heads
  int64_t head_dim = 128;            // per-head width (q width = heads x head_dim)
  int64_t intermediate_size = 9728;  // SwiGLU width
  int64_t vocab_size = 151936;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;          // rope_parameters.rope_theta or rope_theta
  bool tie_word_embeddings = true;  // irrelevant for hidden states

  static absl::StatusOr<Qwen3Config> from_json(const nlohmann::json& json,
                                               const std::string& source);
};

class Qwen3Encoder {
 public:
  // Loads embed_tokens and layers 0..max(taps)-1 of `checkpoint` (text_encoder/) onto `backend`.
  // taps are hidden-state indices as in HF output_hidden_states (k = output of layer k).
  static absl::StatusOr<std::unique_ptr<Qwen3Encoder>> load(Backend& backend,
                                                            const ComponentWeights& checkpoint,
                                                            std::vector<int64_t> taps = {9, 18,
                                                                                         27});
  // The encoder of `config` with reproducible random weights (fill_random_weights) and the same
  // tap rules: real shapes without a checkpoint, for `flux2 bench --e2e`.
  static absl::StatusOr<std::unique_ptr<Qwen3Encoder>> create_random(Backend& backend,
                                                                     Qwen3Config config,
                                                                     std::vector<int64_t> taps,
                                                                     uint64_t seed);
  virtual ~Qwen3Encoder() = default;

  virtual const Qwen3Config& config() const = 0;
  virtual const std::vector<int64_t>& taps() const = 0;
  virtual int64_t device_bytes() const = 0;  // weights held on the backend

  // ids [L] right-padded; the first num_valid_tokens are real (attention mask 1). Returns
  // prompt_embeds [L, taps x hidden] (channel c x hidden + d from tap c) in the activation dtype.
  // `tap` receives "hidden_states.<k>" [L, hidden] for each tapped layer k.
  virtual absl::StatusOr<Tensor> encode(std::span<const int32_t> ids, int64_t num_valid_tokens,
                                        const ActivationTap& tap = nullptr) const = 0;
};

}  // namespace flux2
