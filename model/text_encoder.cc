// The text-encoder forward (HF Qwen3Model / MistralModel up to the last tap), its weights resident
// or streamed from host memory layer by layer; see text_encoder.h. Tested by
// `flux2 check-golden --only text_encoder` and tests/host/text_encoder_test.cc.
#include "model/text_encoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/base/status.h"
#include "model/rope.h"
#include "model/text_encoder_weights.h"

namespace flux2 {
namespace {

// Activations of one encode call, sized for its L tokens.
struct EncoderWorkspace {
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

class TextEncoderImpl final : public TextEncoder {
 public:
  TextEncoderImpl(Backend& backend, TextEncoderConfig config, std::vector<int64_t> taps,
                  WeightResidency residency)
      : backend_(backend),
        config_(std::move(config)),
        taps_(std::move(taps)),
        residency_(residency) {}

  const TextEncoderConfig& config() const override { return config_; }
  const std::vector<int64_t>& taps() const override { return taps_; }
  int64_t device_bytes() const override { return load_report_.device_bytes; }
  int64_t host_bytes() const override { return load_report_.host_bytes; }
  WeightResidency residency() const override { return residency_; }
  absl::StatusOr<Tensor> encode(std::span<const int32_t> ids, int64_t num_valid_tokens,
                                const ActivationTap& tap) const override;

  TextEncoderWeights& weights() { return weights_; }
  // Streamed: the two device layer buffers the layers take turns in (adds their bytes).
  absl::Status allocate_layer_buffers();
  void set_load_report(const LoadReport& report) { load_report_ = report; }

 private:
  absl::StatusOr<EncoderWorkspace> make_workspace(int64_t seq) const;
  // ws.x = the embedding rows of `ids` (checked against the vocabulary), gathered on the host from
  // the table, which stays in host memory, and uploaded.
  absl::Status embed(std::span<const int32_t> ids, const EncoderWorkspace& ws) const;
  // Starts copying layer `layer`'s host weights into device buffer `buffer` (streamed only).
  absl::StatusOr<CopyTicket> stream_layer(size_t layer, int buffer) const;
  // One decoder layer, in place on ws.x.
  absl::Status decoder_layer(const TextEncoderLayerWeights& w, const EncoderWorkspace& ws,
                             int64_t num_valid_tokens) const;

  Backend& backend_;
  TextEncoderConfig config_;
  std::vector<int64_t> taps_;
  WeightResidency residency_;
  // The embedding in host memory; the layers on the device, or in host memory (streamed).
  TextEncoderWeights weights_;
  TextEncoderLayerWeights layer_buffers_[2];  // streamed: the device copies of two layers
  LoadReport load_report_;
};

absl::Status TextEncoderImpl::allocate_layer_buffers() {
  if (residency_ != WeightResidency::kStreamed) return absl::OkStatus();
  for (TextEncoderLayerWeights& buffer : layer_buffers_) {
    FLUX_ASSIGN_OR_RETURN(
        const int64_t bytes,
        allocate_device_weights(backend_, text_encoder_layer_table(config_, "", buffer)));
    load_report_.device_bytes += bytes;
  }
  return absl::OkStatus();
}

absl::StatusOr<CopyTicket> TextEncoderImpl::stream_layer(size_t layer, int buffer) const {
  const TextEncoderLayerWeights& from = weights_.layers[layer];
  const TextEncoderLayerWeights& to = layer_buffers_[buffer];
  std::vector<CopyPair> copies;
  const std::vector<const Tensor*> sources = from.tensors(), targets = to.tensors();
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i]->data() != nullptr) copies.push_back(CopyPair{*sources[i], *targets[i]});
  }
  return backend_.start_copies(copies);
}

absl::StatusOr<EncoderWorkspace> TextEncoderImpl::make_workspace(int64_t seq) const {
  Backend& be = backend_;
  const DType act = be.activation_dtype();
  const int64_t d = config_.hidden_size, dh = config_.head_dim, i_size = config_.intermediate_size;
  const int64_t qkv_width = (config_.num_attention_heads + 2 * config_.num_key_value_heads) * dh;
  EncoderWorkspace ws;
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

absl::Status TextEncoderImpl::decoder_layer(const TextEncoderLayerWeights& w,
                                            const EncoderWorkspace& ws,
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
  if (config_.family == TextEncoderFamily::kQwen3) {  // per-head RMSNorm, then RoPE
    FLUX_RETURN_IF_ERROR(be.qk_norm_rope(q, dh, w.q_norm, eps, ws.rope_cos, ws.rope_sin,
                                         RopeStyle::kHalfSplit));  // [L, H Dh]
    FLUX_RETURN_IF_ERROR(be.qk_norm_rope(k, dh, w.k_norm, eps, ws.rope_cos, ws.rope_sin,
                                         RopeStyle::kHalfSplit));  // [L, Hkv Dh]
  } else {                                                         // Mistral: RoPE alone
    FLUX_RETURN_IF_ERROR(be.rope(q, dh, ws.rope_cos, ws.rope_sin, RopeStyle::kHalfSplit));
    FLUX_RETURN_IF_ERROR(be.rope(k, dh, ws.rope_cos, ws.rope_sin, RopeStyle::kHalfSplit));
  }
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

absl::Status TextEncoderImpl::embed(std::span<const int32_t> ids,
                                    const EncoderWorkspace& ws) const {
  Backend& be = backend_;
  const int64_t seq = static_cast<int64_t>(ids.size());
  const Tensor& table = weights_.embed_tokens;
  const size_t row_bytes = static_cast<size_t>(table.cols() * dtype_size(table.dtype()));
  std::vector<char> rows(row_bytes * static_cast<size_t>(seq));
  for (int64_t i = 0; i < seq; ++i) {
    std::memcpy(rows.data() + i * row_bytes,
                static_cast<const char*>(table.data()) + ids[i] * row_bytes, row_bytes);
  }
  return be.upload(rows.data(), table.dtype(), ws.x);
}

absl::StatusOr<Tensor> TextEncoderImpl::encode(std::span<const int32_t> ids,
                                               int64_t num_valid_tokens,
                                               const ActivationTap& tap) const {
  Backend& be = backend_;
  const int64_t seq = static_cast<int64_t>(ids.size()), d = config_.hidden_size;
  if (seq == 0) return absl::InvalidArgumentError("text encode: no token ids");
  if (num_valid_tokens < 1 || num_valid_tokens > seq) {
    return absl::InvalidArgumentError(absl::StrCat("text encode: num_valid_tokens ",
                                                   num_valid_tokens, " outside [1, ", seq, "]"));
  }
  for (int64_t i = 0; i < seq; ++i) {
    if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("text encode: token id ", ids[i], " at position ", i,
                       " is outside the vocabulary of ", config_.vocab_size));
    }
  }
  FLUX_ASSIGN_OR_RETURN(EncoderWorkspace ws, make_workspace(seq));
  const int64_t num_taps = static_cast<int64_t>(taps_.size());
  FLUX_ASSIGN_OR_RETURN(Tensor prompt_embeds, be.empty(be.activation_dtype(), {seq, num_taps * d}));

  FLUX_RETURN_IF_ERROR(embed(ids, ws));  // [L, hidden]
  const bool streamed = residency_ == WeightResidency::kStreamed;
  CopyTicket next;
  if (streamed) {
    FLUX_ASSIGN_OR_RETURN(next, stream_layer(0, 0));
  }
  for (size_t layer = 0; layer < weights_.layers.size(); ++layer) {
    const TextEncoderLayerWeights* w = &weights_.layers[layer];
    if (streamed) {
      // Layer `layer` is in buffer layer % 2; the next layer's copy goes into the other buffer
      // once the layer before (its last reader) is done, and runs beside this layer's compute.
      FLUX_RETURN_IF_ERROR(be.await_copies(next));
      w = &layer_buffers_[layer % 2];
      if (layer + 1 < weights_.layers.size()) {
        FLUX_ASSIGN_OR_RETURN(next, stream_layer(layer + 1, static_cast<int>((layer + 1) % 2)));
      }
    }
    FLUX_RETURN_IF_ERROR(decoder_layer(*w, ws, num_valid_tokens));  // [L, hidden]
    const int64_t hidden_index = static_cast<int64_t>(layer) + 1;   // HF hidden_states[k]
    for (int64_t c = 0; c < num_taps; ++c) {
      if (taps_[c] != hidden_index) continue;
      FLUX_RETURN_IF_ERROR(be.copy(ws.x, prompt_embeds.col_slice(c * d, d)));  // [L, hidden]
      if (tap) tap(absl::StrCat("hidden_states.", hidden_index), ws.x);
    }
  }
  return prompt_embeds;
}

absl::Status check_taps(const std::vector<int64_t>& taps, const TextEncoderConfig& config,
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

absl::StatusOr<std::unique_ptr<TextEncoder>> TextEncoder::load(Backend& backend,
                                                               const ComponentWeights& checkpoint,
                                                               std::vector<int64_t> taps,
                                                               WeightResidency residency) {
  FLUX_ASSIGN_OR_RETURN(
      TextEncoderConfig config,
      TextEncoderConfig::from_json(checkpoint.config(), checkpoint.config_path()));
  FLUX_RETURN_IF_ERROR(check_taps(taps, config, checkpoint.config_path()));
  FLUX_ASSIGN_OR_RETURN(const std::string prefix, text_encoder_prefix(config, checkpoint));
  const int64_t num_layers = *std::max_element(taps.begin(), taps.end());
  auto model = std::make_unique<TextEncoderImpl>(backend, config, std::move(taps), residency);
  const std::vector<WeightSpec> table =
      model->weights().table(config, num_layers, prefix, residency);
  // An FP8 file's projections stay FP8 on the device, each dequantized as its GEMM runs; streamed
  // layers (host targets) are dequantized into host memory at load and stream as bf16.
  const bool fp8 = !stored_fp8_weights(checkpoint, table).empty();
  FLUX_ASSIGN_OR_RETURN(LoadReport report,
                        load_weights(backend, checkpoint, table,
                                     text_encoder_unused_tensors(config, num_layers, prefix),
                                     fp8 ? Fp8Placement::kStored : Fp8Placement::kDequantized));
  model->set_load_report(report);
  FLUX_RETURN_IF_ERROR(model->allocate_layer_buffers());
  return std::unique_ptr<TextEncoder>(std::move(model));
}

absl::StatusOr<std::pair<int64_t, int64_t>> TextEncoder::planned_bytes(
    const ComponentWeights& checkpoint, const std::vector<int64_t>& taps, WeightResidency residency,
    int64_t weight_dtype_size) {
  FLUX_ASSIGN_OR_RETURN(
      TextEncoderConfig config,
      TextEncoderConfig::from_json(checkpoint.config(), checkpoint.config_path()));
  FLUX_RETURN_IF_ERROR(check_taps(taps, config, checkpoint.config_path()));
  FLUX_ASSIGN_OR_RETURN(const std::string prefix, text_encoder_prefix(config, checkpoint));
  TextEncoderWeights weights;
  const std::vector<WeightSpec> table =
      weights.table(config, *std::max_element(taps.begin(), taps.end()), prefix, residency);
  // An FP8 file's projections at 1 byte a value (plus a scale per row), as load() keeps them.
  const WeightBytes bytes =
      planned_weight_bytes(table, stored_fp8_weights(checkpoint, table), weight_dtype_size);
  int64_t device = bytes.device;
  if (residency == WeightResidency::kStreamed) {  // the two device layer buffers
    TextEncoderLayerWeights layer;
    device +=
        2 *
        planned_weight_bytes(text_encoder_layer_table(config, "", layer), weight_dtype_size).device;
  }
  return std::pair<int64_t, int64_t>{device, bytes.host};
}

absl::StatusOr<std::unique_ptr<TextEncoder>> TextEncoder::create_random(
    Backend& backend, TextEncoderConfig config, std::vector<int64_t> taps, uint64_t seed,
    WeightResidency residency, bool stored_fp8) {
  FLUX_RETURN_IF_ERROR(check_taps(taps, config, "random text encoder"));
  const int64_t num_layers = *std::max_element(taps.begin(), taps.end());
  auto model = std::make_unique<TextEncoderImpl>(backend, config, std::move(taps), residency);
  const std::vector<WeightSpec> table =
      model->weights().table(config, num_layers, "model.", residency);
  LoadReport report;
  if (stored_fp8 && residency == WeightResidency::kDevice) {  // the embedding stays on the host
    FLUX_ASSIGN_OR_RETURN(const int64_t bytes, allocate_random_stored_fp8(backend, table, seed));
    report.host_bytes = model->weights().embed_tokens.bytes();
    report.device_bytes = bytes - report.host_bytes;
  } else {
    FLUX_ASSIGN_OR_RETURN(const WeightBytes bytes, allocate_weights(backend, table));
    report.device_bytes = bytes.device;
    report.host_bytes = bytes.host;
    FLUX_RETURN_IF_ERROR(fill_random_weights(backend, table, seed));
  }
  report.tensors = static_cast<int64_t>(table.size());
  model->set_load_report(report);
  FLUX_RETURN_IF_ERROR(model->allocate_layer_buffers());
  return std::unique_ptr<TextEncoder>(std::move(model));
}

}  // namespace flux2
