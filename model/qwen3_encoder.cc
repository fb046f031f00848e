// The Qwen3 text-encoder forward (HF Qwen3Model up to the last tap); see qwen3_encoder.h.
// Tested by `flux2 check-golden --only text_encoder` and tests/host/qwen3_encoder_test.cc.
#include "model/qwen3_encoder.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/base/status.h"
#include "model/qwen3_weights.h"
#include "model/rope.h"

namespace flux2 {
namespace {

// Activations of one encode call, sized for its L tokens.
struct Qwen3Workspace {
  Tensor x;         // [L, hidden]           residual stream (input and output of a layer)
  Tensor mid;       // [L, hidden]           residual stream after the attention half
  Tensor normed;    // [L, hidden]           RMSNorm output
  Tensor qkv;       // [L, (H + 2 Hkv) Dh]   q | k | v
  Tensor attn;      // [L, H Dh]
  Tensor proj;      // [L, hidden]           o_proj / down_proj output
  Tensor gate_up;   // [L, 2I]
  Tensor act;       // [L, I]                silu(gate) * up
  Tensor rope_cos;  // [L, Dh] f32
  Tensor rope_sin;  // [L, Dh] f32
};

class Qwen3EncoderImpl final : public Qwen3Encoder {
 public:
  Qwen3EncoderImpl(Backend& backend, Qwen3Config config, std::vector<int64_t> taps)
      : backend_(backend), config_(std::move(config)), taps_(std::move(taps)) {}

  const Qwen3Config& config() const override { return config_; }
  const std::vector<int64_t>& taps() const override { return taps_; }
  int64_t device_bytes() const override { return load_report_.device_bytes; }
  absl::StatusOr<Tensor> encode(std::span<const int32_t> ids, int64_t num_valid_tokens,
                                const ActivationTap& tap) const override;

  Qwen3Weights& weights() { return weights_; }
  void set_load_report(const LoadReport& report) { load_report_ = report; }

 private:
  absl::StatusOr<Qwen3Workspace> make_workspace(int64_t seq) const;
  // One decoder layer, in place on ws.x.
  absl::Status decoder_layer(const Qwen3LayerWeights& w, const Qwen3Workspace& ws,
                             int64_t num_valid_tokens) const;

  Backend& backend_;
  Qwen3Config config_;
  std::vector<int64_t> taps_;
  Qwen3Weights weights_;
  LoadReport load_report_;
};

absl::StatusOr<Qwen3Workspace> Qwen3EncoderImpl::make_workspace(int64_t seq) const {
  Backend& be = backend_;
  const DType act = be.activation_dtype();
  const int64_t d = config_.hidden_size, dh = config_.head_dim, i_size = config_.intermediate_size;
  const int64_t qkv_width = (config_.num_attention_heads + 2 * config_.num_key_value_heads) * dh;
  Qwen3Workspace ws;
  FLUX_ASSIGN_OR_RETURN(ws.x, be.empty(act, {seq, d}));
  FLUX_ASSIGN_OR_RETURN(ws.mid, be.empty(act, {seq, d}));
  FLUX_ASSIGN_OR_RETURN(ws.normed, be.empty(act, {seq, d}));
  FLUX_ASSIGN_OR_RETURN(ws.qkv, be.empty(act, {seq, qkv_width}));
  FLUX_ASSIGN_OR_RETURN(ws.attn, be.empty(act, {seq, config_.num_attention_heads * dh}));
  FLUX_ASSIGN_OR_RETURN(ws.proj, be.empty(act, {seq, d}));
  FLUX_ASSIGN_OR_RETURN(ws.gate_up, be.empty(act, {seq, 2 * i_size}));
  FLUX_ASSIGN_OR_RETURN(ws.act, be.empty(act, {seq, i_size}));
  // Positions 0..L-1 for every token, padding included (HF passes no position_ids).
  const RopeTables rope = qwen3_rope_tables(seq, dh, config_.rope_theta);
  FLUX_ASSIGN_OR_RETURN(ws.rope_cos, be.empty(DType::kF32, {seq, dh}));
  FLUX_ASSIGN_OR_RETURN(ws.rope_sin, be.empty(DType::kF32, {seq, dh}));
  FLUX_RETURN_IF_ERROR(be.upload(rope.cos.data(), DType::kF32, ws.rope_cos));
  FLUX_RETURN_IF_ERROR(be.upload(rope.sin.data(), DType::kF32, ws.rope_sin));
  return ws;
}

absl::Status Qwen3EncoderImpl::decoder_layer(const Qwen3LayerWeights& w, const Qwen3Workspace& ws,
                                             int64_t num_valid_tokens) const {
  Backend& be = backend_;
  const int64_t h = config_.num_attention_heads, hkv = config_.num_key_value_heads;
  const int64_t dh = config_.head_dim, i_size = config_.intermediate_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const Tensor q = ws.qkv.col_slice(0, h * dh);
  const Tensor k = ws.qkv.col_slice(h * dh, hkv * dh);
  const Tensor v = ws.qkv.col_slice((h + hkv) * dh, hkv * dh);
  // Causal and key-padding mask together: a padding row still attends to the real tokens before it.
  AttentionParams params;
  params.num_heads = h;
  params.num_kv_heads = hkv;
  params.head_dim = dh;
  params.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dh)));
  params.causal = true;
  params.num_valid_keys = num_valid_tokens;

  // Self-attention (V is not normalised).
  FLUX_RETURN_IF_ERROR(be.rms_norm(ws.x, w.input_norm, eps, ws.normed));  // [L, hidden]
  FLUX_RETURN_IF_ERROR(be.linear(ws.normed, w.qkv, {}, ws.qkv));          // [L, (H + 2Hkv) Dh]
  FLUX_RETURN_IF_ERROR(be.qk_norm_rope(q, dh, w.q_norm, eps, ws.rope_cos, ws.rope_sin,
                                       RopeStyle::kHalfSplit));  // [L, H Dh]
  FLUX_RETURN_IF_ERROR(be.qk_norm_rope(k, dh, w.k_norm, eps, ws.rope_cos, ws.rope_sin,
                                       RopeStyle::kHalfSplit));     // [L, Hkv Dh]
  FLUX_RETURN_IF_ERROR(be.attention(q, k, v, params, ws.attn));     // [L, H Dh]
  FLUX_RETURN_IF_ERROR(be.linear(ws.attn, w.o_proj, {}, ws.proj));  // [L, hidden]
  FLUX_RETURN_IF_ERROR(be.add(ws.x, ws.proj, ws.mid));              // [L, hidden]

  // SwiGLU MLP.
  FLUX_RETURN_IF_ERROR(be.rms_norm(ws.mid, w.post_norm, eps, ws.normed));  // [L, hidden]
  FLUX_RETURN_IF_ERROR(be.linear(ws.normed, w.gate_up, {}, ws.gate_up));   // [L, 2I]
  FLUX_RETURN_IF_ERROR(be.swiglu(ws.gate_up.col_slice(0, i_size),
                                 ws.gate_up.col_slice(i_size, i_size), ws.act));  // [L, I]
  FLUX_RETURN_IF_ERROR(be.linear(ws.act, w.down_proj, {}, ws.proj));              // [L, hidden]
  FLUX_RETURN_IF_ERROR(be.add(ws.mid, ws.proj, ws.x));                            // [L, hidden]
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Qwen3EncoderImpl::encode(std::span<const int32_t> ids,
                                                int64_t num_valid_tokens,
                                                const ActivationTap& tap) const {
  Backend& be = backend_;
  const int64_t seq = static_cast<int64_t>(ids.size()), d = config_.hidden_size;
  if (seq == 0) return absl::InvalidArgumentError("Qwen3 encode: no token ids");
  if (num_valid_tokens < 1 || num_valid_tokens > seq) {
    return absl::InvalidArgumentError(absl::StrCat("Qwen3 encode: num_valid_tokens ",
                                                   num_valid_tokens, " outside [1, ", seq, "]"));
  }
  for (int64_t i = 0; i < seq; ++i) {
    if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("Qwen3 encode: token id ", ids[i], " at position ", i,
                       " is outside the vocabulary of ", config_.vocab_size));
    }
  }
  FLUX_ASSIGN_OR_RETURN(Qwen3Workspace ws, make_workspace(seq));
  FLUX_ASSIGN_OR_RETURN(Tensor ids_tensor, be.empty(DType::kI32, {seq}));
  FLUX_RETURN_IF_ERROR(be.upload(ids.data(), DType::kI32, ids_tensor));
  const int64_t num_taps = static_cast<int64_t>(taps_.size());
  FLUX_ASSIGN_OR_RETURN(Tensor prompt_embeds, be.empty(be.activation_dtype(), {seq, num_taps * d}));

  FLUX_RETURN_IF_ERROR(be.embedding(ids_tensor, weights_.embed_tokens, ws.x));  // [L, hidden]
  for (size_t layer = 0; layer < weights_.layers.size(); ++layer) {
    FLUX_RETURN_IF_ERROR(
        decoder_layer(weights_.layers[layer], ws, num_valid_tokens));  // [L, hidden]
    const int64_t hidden_index = static_cast<int64_t>(layer) + 1;      // HF hidden_states[k]
    for (int64_t c = 0; c < num_taps; ++c) {
      if (taps_[c] != hidden_index) continue;
      FLUX_RETURN_IF_ERROR(be.copy(ws.x, prompt_embeds.col_slice(c * d, d)));  // [L, hidden]
      if (tap) tap(absl::StrCat("hidden_states.", hidden_index), ws.x);
    }
  }
  return prompt_embeds;
}

absl::Status check_taps(const std::vector<int64_t>& taps, const Qwen3Config& config,
                        const std::string& source) {
  if (taps.empty())
    return absl::InvalidArgumentError(absl::StrCat(source, ": no hidden-state taps"));
  std::set<int64_t> seen;
  for (int64_t k : taps) {
    if (k < 1 || k > config.num_hidden_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": hidden-state tap ", k, " is outside [1, num_hidden_layers ",
                       config.num_hidden_layers, "] (taps ", absl::StrJoin(taps, ", "), ")"));
    }
    if (!seen.insert(k).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": hidden-state tap ", k, " is repeated (taps ", absl::StrJoin(taps, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Qwen3Encoder>> Qwen3Encoder::load(Backend& backend,
                                                                 const ComponentWeights& checkpoint,
                                                                 std::vector<int64_t> taps) {
  FLUX_ASSIGN_OR_RETURN(Qwen3Config config,
                        Qwen3Config::from_json(checkpoint.config(), checkpoint.config_path()));
  FLUX_RETURN_IF_ERROR(check_taps(taps, config, checkpoint.config_path()));
  const int64_t num_layers = *std::max_element(taps.begin(), taps.end());
  auto model = std::make_unique<Qwen3EncoderImpl>(backend, config, std::move(taps));
  const std::vector<WeightSpec> table = model->weights().table(config, num_layers);
  FLUX_ASSIGN_OR_RETURN(LoadReport report, load_weights(backend, checkpoint, table,
                                                        qwen3_unused_tensors(config, num_layers)));
  model->set_load_report(report);
  return std::unique_ptr<Qwen3Encoder>(std::move(model));
}

absl::StatusOr<std::unique_ptr<Qwen3Encoder>> Qwen3Encoder::create_random(Backend& backend,
                                                                          Qwen3Config config,
                                                                          std::vector<int64_t> taps,
                                                                          uint64_t seed) {
  FLUX_RETURN_IF_ERROR(check_taps(taps, config, "random Qwen3 encoder"));
  const int64_t num_layers = *std::max_element(taps.begin(), taps.end());
  auto model = std::make_unique<Qwen3EncoderImpl>(backend, config, std::move(taps));
  const std::vector<WeightSpec> table = model->weights().table(config, num_layers);
  LoadReport report;
  FLUX_ASSIGN_OR_RETURN(report.device_bytes, allocate_weights(backend, table));
  FLUX_RETURN_IF_ERROR(fill_random_weights(backend, table, seed));
  report.tensors = static_cast<int64_t>(table.size());
  model->set_load_report(report);
  return std::unique_ptr<Qwen3Encoder>(std::move(model));
}

}  // namespace flux2
