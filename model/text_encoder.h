// The decoder-only text encoders of FLUX.2 (model/README.md, "Text encoders"): klein's Qwen3
// (per-head q/k RMSNorm) and dev's Mistral-Small-3.x language model (no q/k norm): causal GQA
// attention with half-split RoPE, SwiGLU MLP. Only the decoder layers up to the last tapped layer
// are loaded and run (a Mistral3 checkpoint's vision tower and projector are never read); the taps'
// hidden states (pre final norm) are stacked into prompt embeddings [L, taps x hidden]. Tested by
// `flux2 check-golden --only text_encoder` and tests/host/text_encoder_test.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/activation_tap.h"
#include "model/checkpoint.h"
#include "nlohmann/json.hpp"

namespace flux2 {

enum class TextEncoderFamily : uint8_t {
  kQwen3,    // Qwen3ForCausalLM (klein): q/k RMSNorm per head
  kMistral,  // the language model of Mistral3ForConditionalGeneration (dev): no q/k norm
};

struct TextEncoderConfig {
  TextEncoderFamily family = TextEncoderFamily::kQwen3;
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

  // A Qwen3 config.json (model_type "qwen3"), a Mistral3ForConditionalGeneration one
  // (model_type "mistral3", the language model's fields under "text_config") or a plain
  // MistralForCausalLM one (model_type "mistral").
  static absl::StatusOr<TextEncoderConfig> from_json(const nlohmann::json& json,
                                                     const std::string& source);
  // FLUX.2-dev's text encoder: Mistral-Small-3.1-24B's language model (40 layers, hidden 5120,
  // 32 heads / 8 kv heads of 128, SwiGLU 32768, vocabulary 131072, rope_theta 1e9).
  static TextEncoderConfig mistral_small_3();
};

// How the encoder's weights are placed (the memory plan of a FLUX.2-dev server).
enum class WeightResidency : uint8_t {
  kDevice,  // every layer on the device
  // Every layer in pinned host memory, streamed onto the device layer by layer for each encode,
  // the next layer's copy overlapping the current layer's compute (two device layer buffers).
  kStreamed,
};

class TextEncoder {
 public:
  // Loads embed_tokens and layers 0..max(taps)-1 of `checkpoint` (text_encoder/) onto `backend`.
  // taps are hidden-state indices as in HF output_hidden_states (k = output of layer k).
  static absl::StatusOr<std::unique_ptr<TextEncoder>> load(
      Backend& backend, const ComponentWeights& checkpoint, std::vector<int64_t> taps = {9, 18, 27},
      WeightResidency residency = WeightResidency::kDevice);
  // The encoder of `config` with reproducible random weights (fill_random_weights) and the same
  // tap rules: real shapes without a checkpoint, for `flux2 bench --e2e`. With `stored_fp8` (and
  // kDevice) the projections are stored FP8 weights, as an FP8 text-encoder file loads
  // (`flux2 bench --e2e --weights fp8`).
  static absl::StatusOr<std::unique_ptr<TextEncoder>> create_random(
      Backend& backend, TextEncoderConfig config, std::vector<int64_t> taps, uint64_t seed,
      WeightResidency residency = WeightResidency::kDevice, bool stored_fp8 = false);
  // The bytes load() would allocate, {on the device, in pinned host memory}, from the checkpoint's
  // config alone (weights of `weight_dtype_size` bytes per value), for the memory plan.
  static absl::StatusOr<std::pair<int64_t, int64_t>> planned_bytes(
      const ComponentWeights& checkpoint, const std::vector<int64_t>& taps,
      WeightResidency residency, int64_t weight_dtype_size);
  virtual ~TextEncoder() = default;

  virtual const TextEncoderConfig& config() const = 0;
  virtual const std::vector<int64_t>& taps() const = 0;
  // Weights held on the device (streamed: the two layer buffers) and in host memory (the
  // embedding, whose rows are gathered on the host, and the streamed layers). On the CPU backend
  // both are ordinary memory.
  virtual int64_t device_bytes() const = 0;
  virtual int64_t host_bytes() const = 0;
  virtual WeightResidency residency() const = 0;

  // ids [L] right-padded; the first num_valid_tokens are real (attention mask 1). Returns
  // prompt_embeds [L, taps x hidden] (channel c x hidden + d from tap c) in the activation dtype.
  // `tap` receives "hidden_states.<k>" [L, hidden] for each tapped layer k.
  virtual absl::StatusOr<Tensor> encode(std::span<const int32_t> ids, int64_t num_valid_tokens,
                                        const ActivationTap& tap = nullptr) const = 0;
};

}  // namespace flux2
