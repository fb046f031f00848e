// The FLUX.2 transformer forward in paper order; see flux2_transformer.h.
// Tested by `flux2 check-golden --only transformer` on tests/data/tiny-{klein,dev}.
#include "model/flux2_transformer.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "model/rope.h"
#include "model/sequence_parallel.h"
#include "model/timestep_embedding.h"

namespace flux2 {

absl::StatusOr<std::unique_ptr<Flux2Transformer>> Flux2Transformer::load(
    Backend& backend, const ComponentWeights& checkpoint, Fp8Placement placement) {
  FLUX_ASSIGN_OR_RETURN(Flux2Config config,
                        Flux2Config::from_json(checkpoint.config(), checkpoint.config_path()));
  std::unique_ptr<Flux2Transformer> model(new Flux2Transformer(backend, std::move(config)));
  const std::vector<WeightSpec> table = model->weights_.table(model->config_);
  FLUX_ASSIGN_OR_RETURN(model->load_report_,
                        load_weights(backend, checkpoint, table, nullptr, placement));
  return model;
}

absl::StatusOr<std::unique_ptr<Flux2Transformer>> Flux2Transformer::create_random(
    Backend& backend, Flux2Config config, uint64_t seed, bool stored_fp8) {
  std::unique_ptr<Flux2Transformer> model(new Flux2Transformer(backend, std::move(config)));
  const std::vector<WeightSpec> table = model->weights_.table(model->config_);
  if (stored_fp8) {
    FLUX_ASSIGN_OR_RETURN(model->load_report_.device_bytes,
                          allocate_random_stored_fp8(backend, table, seed));
  } else {
    FLUX_ASSIGN_OR_RETURN(model->load_report_.device_bytes,
                          allocate_device_weights(backend, table));
    FLUX_RETURN_IF_ERROR(fill_random_weights(backend, table, seed));
  }
  model->load_report_.tensors = static_cast<int64_t>(table.size());
  return model;
}

absl::StatusOr<DequantizedBytes> Flux2Transformer::dequantize_stored_weights() {
  return flux2::dequantize_stored_weights(backend_, weights_.table(config_));
}

absl::StatusOr<std::pair<Tensor, Tensor>> Flux2Transformer::rope_tables(
    const std::vector<int64_t>& ids) const {
  constexpr size_t kCachedTables = 8;  // distinct (size, text length) pairs kept on the device
  auto found = rope_cache_.find(ids);
  if (found != rope_cache_.end()) return found->second;
  Backend& be = backend_;
  const int64_t seq = static_cast<int64_t>(ids.size() / config_.axes_dims_rope.size());
  const RopeTables rope = flux2_rope_tables(ids, config_.axes_dims_rope, config_.rope_theta);
  FLUX_ASSIGN_OR_RETURN(Tensor cos, be.empty(DType::kF32, {seq, config_.attention_head_dim}));
  FLUX_ASSIGN_OR_RETURN(Tensor sin, be.empty(DType::kF32, {seq, config_.attention_head_dim}));
  FLUX_RETURN_IF_ERROR(be.upload(rope.cos.data(), DType::kF32, cos));
  FLUX_RETURN_IF_ERROR(be.upload(rope.sin.data(), DType::kF32, sin));
  if (rope_cache_.size() >= kCachedTables) rope_cache_.erase(rope_cache_.begin());
  rope_cache_[ids] = {cos, sin};
  return std::make_pair(cos, sin);
}

absl::StatusOr<LowPrecisionReport> Flux2Transformer::enable_quality_high(
    Fp8InputScale input_scale) {
  return register_low_precision_weights(backend_, weights_.table(config_), input_scale);
}

namespace {

// apply_lora for the terms of a request's LoRA, or nothing without one.
absl::Status add_lora(Backend& be, const Flux2LoraTerms* terms, const Tensor& x, const Tensor& y,
                      const Flux2Workspace& ws) {
  if (terms == nullptr || terms->empty()) return absl::OkStatus();
  return apply_lora(be, *terms, x, y, ws.lora);
}

}  // namespace

absl::StatusOr<Tensor> Flux2Transformer::embed_conditioning(
    std::span<const float> values, const Tensor& linear_1, const Flux2LoraTerms& lora_1,
    const Tensor& linear_2, const Flux2LoraTerms& lora_2, const Flux2Conditioning& cond) const {
  Backend& be = backend_;
  const int64_t steps = static_cast<int64_t>(values.size()), d = config_.hidden();
  const int64_t channels = config_.timestep_guidance_channels;
  std::vector<float> scaled(values.begin(), values.end());
  for (float& v : scaled) v = scale_conditioning(v, be.activation_dtype());
  const std::vector<float> sinusoids = timestep_sinusoids(scaled, channels);
  FLUX_ASSIGN_OR_RETURN(Tensor proj, be.empty(be.activation_dtype(), {steps, channels}));
  FLUX_RETURN_IF_ERROR(be.upload(sinusoids.data(), DType::kF32, proj));  // [steps, 256]
  FLUX_ASSIGN_OR_RETURN(Tensor hidden, be.empty(be.activation_dtype(), {steps, d}));
  FLUX_RETURN_IF_ERROR(be.linear(proj, linear_1, {}, hidden));  // [steps, D]
  FLUX_RETURN_IF_ERROR(add_lora(be, &lora_1, proj, hidden, *cond.workspace));
  FLUX_RETURN_IF_ERROR(be.silu(hidden, hidden));  // [steps, D]
  FLUX_ASSIGN_OR_RETURN(Tensor emb, be.empty(be.activation_dtype(), {steps, d}));
  FLUX_RETURN_IF_ERROR(be.linear(hidden, linear_2, {}, emb));  // [steps, D]
  FLUX_RETURN_IF_ERROR(add_lora(be, &lora_2, hidden, emb, *cond.workspace));
  return emb;
}

absl::StatusOr<Tensor> Flux2Transformer::modulation_rows(std::span<const float> timesteps,
                                                         std::span<const float> guidance,
                                                         const Flux2Conditioning& cond) const {
  Backend& be = backend_;
  static const Flux2Lora kNoLora;
  const Flux2Lora& lora = cond.lora != nullptr ? *cond.lora : kNoLora;
  FLUX_ASSIGN_OR_RETURN(Tensor temb, embed_conditioning(timesteps, weights_.time_linear_1,
                                                        lora.time_linear_1, weights_.time_linear_2,
                                                        lora.time_linear_2, cond));  // [steps, D]
  if (config_.guidance_embeds) {
    FLUX_ASSIGN_OR_RETURN(
        Tensor gemb,
        embed_conditioning(guidance, weights_.guidance_linear_1, lora.guidance_linear_1,
                           weights_.guidance_linear_2, lora.guidance_linear_2, cond));
    FLUX_RETURN_IF_ERROR(be.add(temb, gemb, temb));  // [steps, D]
  }
  FLUX_RETURN_IF_ERROR(be.silu(temb, temb));  // [steps, D]
  const Flux2ModulationLayout layout(config_.hidden());
  FLUX_ASSIGN_OR_RETURN(Tensor modulation,
                        be.empty(be.activation_dtype(), {temb.rows(), layout.width()}));
  FLUX_RETURN_IF_ERROR(be.linear(temb, weights_.modulation, {}, modulation));  // [steps, 17D]
  FLUX_RETURN_IF_ERROR(add_lora(be, &lora.modulation, temb, modulation, *cond.workspace));
  return modulation;
}

absl::StatusOr<Flux2Conditioning> Flux2Transformer::prepare(
    const Tensor& prompt_embeds, std::span<const int64_t> txt_ids, std::span<const int64_t> img_ids,
    std::span<const float> timesteps, std::span<const float> guidance,
    const Flux2References* references, std::shared_ptr<const Flux2Lora> lora) const {
  Backend& be = backend_;
  const DType act = be.activation_dtype();
  const int64_t d = config_.hidden(), f = config_.mlp_hidden();
  const int64_t axes = static_cast<int64_t>(config_.axes_dims_rope.size());
  const int64_t steps = static_cast<int64_t>(timesteps.size());
  Flux2Conditioning cond;
  cond.text_len = prompt_embeds.rows();
  cond.image_len = static_cast<int64_t>(img_ids.size()) / axes;
  if (references != nullptr) {
    cond.reference_len = static_cast<int64_t>(references->ids.size()) / axes;
    if (static_cast<int64_t>(references->ids.size()) != cond.reference_len * axes) {
      return absl::InvalidArgumentError("reference position ids are not [R, axes]");
    }
  }
  const int64_t seq = cond.text_len + cond.image_len + cond.reference_len;
  if (prompt_embeds.cols() != config_.joint_attention_dim) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_embeds is ", prompt_embeds.describe(),
                                                   ", expected width ",
                                                   config_.joint_attention_dim));
  }
  if (static_cast<int64_t>(txt_ids.size()) != cond.text_len * axes ||
      static_cast<int64_t>(img_ids.size()) % axes != 0 || cond.image_len == 0) {
    return absl::InvalidArgumentError(absl::StrCat("position ids do not match ", cond.text_len,
                                                   " text tokens and ", axes, " axes"));
  }
  if (steps == 0) return absl::InvalidArgumentError("prepare: no timesteps");
  if (config_.guidance_embeds != !guidance.empty() ||
      (!guidance.empty() && static_cast<int64_t>(guidance.size()) != steps)) {
    return absl::InvalidArgumentError(config_.guidance_embeds
                                          ? "this transformer needs one guidance value per step"
                                          : "this transformer has no guidance embedder");
  }

  auto ws = std::make_shared<Flux2Workspace>();
  FLUX_ASSIGN_OR_RETURN(ws->stream, be.empty(act, {seq, d}));
  FLUX_ASSIGN_OR_RETURN(ws->normed, be.empty(act, {seq, d}));
  FLUX_ASSIGN_OR_RETURN(ws->wide, be.empty(act, {seq, 3 * d + 2 * f}));
  FLUX_ASSIGN_OR_RETURN(ws->attn_mlp, be.empty(act, {seq, d + f}));
  FLUX_ASSIGN_OR_RETURN(ws->proj, be.empty(act, {seq, d}));
  if (lora != nullptr && !lora->empty()) {
    cond.lora = std::move(lora);
    FLUX_RETURN_IF_ERROR(ws->lora.allocate(be, *cond.lora, std::max(seq, steps)));
  }
  cond.workspace = std::move(ws);

  // Text conditioning is the same for every step.
  FLUX_ASSIGN_OR_RETURN(cond.txt, be.empty(act, {cond.text_len, d}));
  FLUX_RETURN_IF_ERROR(
      be.linear(prompt_embeds, weights_.context_embedder, {}, cond.txt));  // [L, D]
  if (cond.lora != nullptr) {
    FLUX_RETURN_IF_ERROR(
        add_lora(be, &cond.lora->context_embedder, prompt_embeds, cond.txt, *cond.workspace));
  }

  // RoPE over the joint sequence: text rows, image rows, reference rows.
  std::vector<int64_t> ids(txt_ids.begin(), txt_ids.end());
  ids.insert(ids.end(), img_ids.begin(), img_ids.end());
  if (references != nullptr) ids.insert(ids.end(), references->ids.begin(), references->ids.end());
  FLUX_ASSIGN_OR_RETURN(std::tie(cond.rope_cos, cond.rope_sin), rope_tables(ids));

  // Timestep (+ guidance) embedding and the shared modulation for every step (§1.3 steps 1-3).
  FLUX_ASSIGN_OR_RETURN(cond.modulation,
                        modulation_rows(timesteps, guidance, cond));  // [steps, 17D]
  if (references != nullptr && references->kv_cache && cond.reference_len > 0) {
    // klein-KV: the references are modulated at timestep 0 (diffusers' ref_fixed_timestep), with
    // the first step's guidance when the model embeds it.
    const float zero[1] = {0.0f};
    FLUX_ASSIGN_OR_RETURN(
        cond.reference_modulation,
        modulation_rows(zero, guidance.empty() ? guidance : guidance.first(1), cond));
    const size_t layers = weights_.double_blocks.size() + weights_.single_blocks.size();
    FLUX_ASSIGN_OR_RETURN(cond.kv, Flux2KvCache::allocate(be, layers, cond.reference_len, d));
  }
  return cond;
}

namespace {

// A column range [first, first + count) of a projection's output (count -1: to its end).
struct Columns {
  int64_t first = 0, count = -1;
};
constexpr Columns kAllColumns{};

// The LoRA terms around a SwiGLU MLP (ModulatedRows::swiglu_linear): those of the projection whose
// output holds the SwiGLU's input [gate | up] from column `in_begin` (their products already in
// the LoRA scratch, their B sides deferred by norm_linear), and those of the down projection.
struct MlpLora {
  const Flux2LoraTerms* in = nullptr;
  int64_t in_begin = 0;
  const Flux2LoraTerms* out = nullptr;
};

// Stream rows [begin, end) and the modulation row each reads (flux2_kv_row_modulation: one
// segment, two in klein-KV's extract forward). Each modulated op runs once per segment, with the
// chunk of the segment's modulation row [1, 17D] at the column the caller names
// (Flux2ModulationLayout); `normed` [S, D] is the norms' scratch.
class ModulatedRows {
 public:
  ModulatedRows() = default;
  ModulatedRows(Backend& be, int64_t d, float eps, const Tensor& normed, int64_t begin, int64_t end,
                std::vector<Flux2RowModulation> segments, const Flux2Workspace& ws)
      : be_(&be),
        d_(d),
        eps_(eps),
        normed_(normed),
        begin_(begin),
        end_(end),
        segments_(std::move(segments)),
        ws_(&ws) {
    // A rank's shard may hold no rows of a stream (sequence parallelism): nothing to launch.
    std::erase_if(segments_, [](const Flux2RowModulation& g) { return g.count == 0; });
  }

  // These rows of `t`.
  Tensor rows(const Tensor& t) const { return t.row_slice(begin_, end_ - begin_); }

  // out = ((1 + scale) ⊙ LayerNorm(x) + shift) · wᵀ (Backend::layer_norm_modulate_linear);
  // shift, scale: the chunks at those columns. With LoRA terms, normed kept for the terms'
  // products into the LoRA scratch, and their B sides added now to out's columns
  // `now` only: the others are added fused with their consumer (q and k with their QK-norm in
  // attend, a SwiGLU's input with it in swiglu_linear).
  absl::Status norm_linear(const Tensor& x, int64_t shift, int64_t scale, const Weight& w,
                           const Tensor& out, const Flux2LoraTerms* lora = nullptr,
                           Columns now = kAllColumns) const {
    for (const Flux2RowModulation& g : segments_) {
      if (lora == nullptr || lora->empty()) {
        FLUX_RETURN_IF_ERROR(be_->layer_norm_modulate_linear(
            of(x, g), chunk(g, shift), chunk(g, scale), eps_, of(normed_, g), w, of(out, g)));
        continue;
      }
      FLUX_RETURN_IF_ERROR(be_->layer_norm_modulate_linear_keeping_normed(
          of(x, g), chunk(g, shift), chunk(g, scale), eps_, of(normed_, g), w, of(out, g)));
      const Tensor t = of(ws_->lora.t, g);
      FLUX_RETURN_IF_ERROR(lora_down(*be_, *lora, of(normed_, g), t));
      const int64_t cols = now.count < 0 ? out.cols() - now.first : now.count;
      if (cols == 0) continue;
      FLUX_RETURN_IF_ERROR(be_->lora_up_add(of(out, g).col_slice(now.first, cols),
                                            lora_columns(lora_ups(*lora, t), now.first, cols)));
    }
    return absl::OkStatus();
  }

  // x += gate ⊙ update, gate: the chunk at that column.
  absl::Status gate_residual(const Tensor& x, int64_t gate, const Tensor& update) const {
    for (const Flux2RowModulation& g : segments_) {
      FLUX_RETURN_IF_ERROR(be_->gate_residual(of(x, g), chunk(g, gate), of(update, g)));
    }
    return absl::OkStatus();
  }

  // out = in · wᵀ on these rows, the LoRA terms added, then x += gate ⊙ out (the LoRA terms and
  // the gated residual in one op: Backend::lora_up_gate_residual).
  absl::Status linear_gate_residual(const Tensor& in, const Weight& w, const Flux2LoraTerms& lora,
                                    const Tensor& out, const Tensor& x, int64_t gate) const {
    FLUX_RETURN_IF_ERROR(be_->linear(rows(in), w, {}, rows(out)));
    if (lora.empty()) return gate_residual(x, gate, out);
    FLUX_RETURN_IF_ERROR(lora_down(*be_, lora, rows(in), rows(ws_->lora.t)));
    for (const Flux2RowModulation& g : segments_) {
      FLUX_RETURN_IF_ERROR(be_->lora_up_gate_residual(
          of(out, g), lora_ups(lora, of(ws_->lora.t, g)), of(x, g), chunk(g, gate)));
    }
    return absl::OkStatus();
  }

  // out = [.. | SwiGLU(gate_up)] · wᵀ with the SwiGLU of gate_up = [gate | up] [*, 2F] written
  // into the last columns of `act`, then x += gate ⊙ out (Backend::swiglu_linear with its gated
  // residual). With LoRA: the input projection's deferred terms (norm_linear) added fused with
  // the SwiGLU, the down projection's fused with the gated residual.
  absl::Status swiglu_linear(const Tensor& gate_up, const Tensor& act, const Weight& w,
                             const Tensor& out, const Tensor& x, int64_t gate,
                             const MlpLora& lora = {}) const {
    const int64_t f = gate_up.cols() / 2;
    const bool lora_in = lora.in != nullptr && !lora.in->empty();
    const bool lora_out = lora.out != nullptr && !lora.out->empty();
    for (const Flux2RowModulation& g : segments_) {
      const Tensor y = of(gate_up, g), act_f = of(act, g).col_slice(act.cols() - f, f);
      if (!lora_in && !lora_out) {
        const GatedResidual residual{of(x, g), chunk(g, gate)};
        FLUX_RETURN_IF_ERROR(be_->swiglu_linear(y.col_slice(0, f), y.col_slice(f, f), of(act, g), w,
                                                of(out, g), &residual));
        continue;
      }
      const Tensor t = of(ws_->lora.t, g);
      FLUX_RETURN_IF_ERROR(
          lora_in ? be_->lora_up_swiglu(
                        y, lora_columns(lora_ups(*lora.in, t), lora.in_begin, 2 * f), act_f)
                  : be_->swiglu(y.col_slice(0, f), y.col_slice(f, f), act_f));
      FLUX_RETURN_IF_ERROR(be_->linear(of(act, g), w, {}, of(out, g)));
      if (!lora_out) {
        FLUX_RETURN_IF_ERROR(be_->gate_residual(of(x, g), chunk(g, gate), of(out, g)));
        continue;
      }
      FLUX_RETURN_IF_ERROR(lora_down(*be_, *lora.out, of(act, g), t));  // the products are used
      FLUX_RETURN_IF_ERROR(
          be_->lora_up_gate_residual(of(out, g), lora_ups(*lora.out, t), of(x, g), chunk(g, gate)));
    }
    return absl::OkStatus();
  }

 private:
  static Tensor of(const Tensor& t, const Flux2RowModulation& g) {
    return t.row_slice(g.first, g.count);
  }
  Tensor chunk(const Flux2RowModulation& g, int64_t column) const {
    return g.mod.col_slice(column, d_);
  }

  Backend* be_ = nullptr;
  int64_t d_ = 0;
  float eps_ = 0.0f;
  Tensor normed_;
  int64_t begin_ = 0, end_ = 0;
  std::vector<Flux2RowModulation> segments_;
  const Flux2Workspace* ws_ = nullptr;
};

}  // namespace

// One forward's view of the joint stream: S = L + N + R rows (text, image, references), with
// R = 0 in klein-KV's cached forwards, whose keys also include the R cached reference rows.
// Sequence-parallel, the stream is the rank's shard: rows [first, first + S) of the joint
// sequence, of which L text, N image and R reference rows.
struct Flux2Transformer::Pass {
  explicit Pass(const Flux2Conditioning& conditioning) : cond(conditioning) {}
  const Flux2Conditioning& cond;
  int64_t first = 0;                   // the joint sequence's row of this stream's row 0
  int64_t l = 0, n = 0, r = 0;         // text, image and reference rows in this stream
  Flux2KvMode kv = Flux2KvMode::kOff;  // klein-KV: extract (step 0), cached (later), or off
  Tensor mod;                          // [1, 17D] this step's modulation
  ModulatedRows txt, img, all;         // rows [0, L), [L, S) and [0, S), modulated
  Tensor stream, normed, wide, attn_mlp, proj;  // the workspace's first S rows
  Tensor rope_cos, rope_sin;                    // [S, Dh]
  int64_t s() const { return l + n + r; }
  // The request's LoRA terms of a block (null: none).
  const Flux2LoraDoubleBlock* double_lora(size_t i) const {
    return cond.lora != nullptr ? &cond.lora->double_blocks[i] : nullptr;
  }
  const Flux2LoraSingleBlock* single_lora(size_t j) const {
    return cond.lora != nullptr ? &cond.lora->single_blocks[j] : nullptr;
  }
};

absl::Status Flux2Transformer::attend(const Pass& p, const QkNormRope& norm, const Tensor& q,
                                      const Tensor& k, const Tensor& v, const Tensor& out,
                                      size_t layer,
                                      std::array<const Flux2LoraTerms*, 2> lora) const {
  Backend& be = backend_;
  const int64_t dh = config_.attention_head_dim, d = config_.hidden();
  const AttentionParams params{config_.num_attention_heads, config_.num_attention_heads, dh,
                               static_cast<float>(1.0 / std::sqrt(static_cast<double>(dh)))};
  const bool with_lora =
      (lora[0] != nullptr && !lora[0]->empty()) || (lora[1] != nullptr && !lora[1]->empty());
  const Flux2SequenceParallel* sp = p.cond.sequence_parallel.get();
  if (p.kv == Flux2KvMode::kOff && !with_lora && sp == nullptr) {
    return be.normed_attention(q, k, v, norm, params, out);
  }
  // q's and k's LoRA terms, added with their norm (their products are in the LoRA scratch).
  QkLoraTerms qk_lora;
  if (with_lora) {
    qk_lora = lora_qk_terms(lora[0], lora[1], norm.split, q.rows(), p.cond.workspace->lora.t, d);
  }
  // Post-RoPE q and k in place (a sequence-parallel rank may hold no rows: nothing to launch).
  if (p.s() > 0) FLUX_RETURN_IF_ERROR(be.normed_qk(q, k, norm, dh, with_lora ? &qk_lora : nullptr));
  // Sequence-parallel: QK-norm and RoPE ran per token on this rank's rows; now the exchange.
  if (sp != nullptr) return ulysses_attention(be, *sp, q, k, v, params, out);  // [S, D]
  if (p.kv == Flux2KvMode::kOff) return be.attention(q, k, v, params, out);
  Flux2KvCache& cache = *p.cond.kv;
  if (p.kv == Flux2KvMode::kExtract) {
    return cache.extract(be, layer, params, p.l + p.n, q, k, v, out);  // [S, D]
  }
  // Cached: the R cached reference rows are a second key segment (Backend::
  // attention_with_cached_keys); the workspace rows past S (it was sized for L + N + R) are the
  // room where a backend that attends over one sequence copies them. Both blocks lay out
  // q | k | v first in their fused projections.
  const Tensor& wide = p.cond.workspace->wide;
  const int64_t rows = p.l + p.n + p.cond.reference_len;
  const Tensor k_room = wide.col_slice(d, d).row_slice(0, rows);
  const Tensor v_room = wide.col_slice(2 * d, d).row_slice(0, rows);
  return cache.attend_cached(be, layer, params, q, k, v, k_room, v_room, out);  // [L+N, D]
}

absl::Status Flux2Transformer::double_block(const Flux2DoubleBlockWeights& w, const Pass& p,
                                            size_t layer) const {
  const int64_t d = config_.hidden(), f = config_.mlp_hidden();
  const float eps = static_cast<float>(config_.eps);
  const Flux2ModulationLayout m(d);  // shift, scale, gate of attention (0-2) and MLP (3-5)
  const ModulatedRows& txt = p.txt;
  const ModulatedRows& img = p.img;  // image (and reference) rows
  const Tensor &x = p.stream, &proj = p.proj;
  const Tensor qkv = p.wide.col_slice(0, 3 * d);
  const Tensor q = qkv.col_slice(0, d), k = qkv.col_slice(d, d), v = qkv.col_slice(2 * d, d);
  const Tensor attn = p.attn_mlp.col_slice(0, d);
  const Tensor ff_in = p.wide.col_slice(0, 2 * f);  // [gate | up]
  const Tensor ff_act = p.attn_mlp.col_slice(d, f);
  // QK-norm with the text stream's weights on the first L rows, the image stream's after.
  const QkNormRope norm{
      {w.txt_norm_q, w.img_norm_q}, {w.txt_norm_k, w.img_norm_k}, p.l, eps, p.rope_cos, p.rope_sin,
      RopeStyle::kInterleaved};
  static const Flux2LoraDoubleBlock kNoLora;
  const Flux2LoraDoubleBlock& lora = p.double_lora(layer) ? *p.double_lora(layer) : kNoLora;

  // Attention: both streams attend jointly over [text ; image]. Each projection is fused with
  // the norm that feeds it: at quality=high the CUDA backend's norm writes the FP8 GEMM's input.
  // LoRA's terms on v are added now, those on q and k with their norm in attend.
  const Columns v_columns{2 * d, d};
  FLUX_RETURN_IF_ERROR(img.norm_linear(x, m.img(0), m.img(1), w.img_qkv, qkv, &lora.img_qkv,
                                       v_columns));  // [N (+R), 3D]
  FLUX_RETURN_IF_ERROR(txt.norm_linear(x, m.txt(0), m.txt(1), w.txt_qkv, qkv, &lora.txt_qkv,
                                       v_columns));  // [L, 3D]
  FLUX_RETURN_IF_ERROR(
      attend(p, norm, q, k, v, attn, layer, {&lora.txt_qkv, &lora.img_qkv}));  // [S, D]
  // Output projections and gated residuals: [N, D], then [L, D].
  FLUX_RETURN_IF_ERROR(img.linear_gate_residual(attn, w.img_out, lora.img_out, proj, x, m.img(2)));
  FLUX_RETURN_IF_ERROR(txt.linear_gate_residual(attn, w.txt_out, lora.txt_out, proj, x, m.txt(2)));

  // Feed-forward (SwiGLU), separate weights per stream; LoRA on its input projection is added
  // with the SwiGLU.
  FLUX_RETURN_IF_ERROR(img.norm_linear(x, m.img(3), m.img(4), w.img_ff_in, ff_in, &lora.img_ff_in,
                                       {0, 0}));  // [N, 2F]
  FLUX_RETURN_IF_ERROR(txt.norm_linear(x, m.txt(3), m.txt(4), w.txt_ff_in, ff_in, &lora.txt_ff_in,
                                       {0, 0}));  // [L, 2F]
  // SwiGLU, its down projection and the gated residual: [N, D], then [L, D].
  FLUX_RETURN_IF_ERROR(img.swiglu_linear(ff_in, ff_act, w.img_ff_out, proj, x, m.img(5),
                                         {&lora.img_ff_in, 0, &lora.img_ff_out}));
  FLUX_RETURN_IF_ERROR(txt.swiglu_linear(ff_in, ff_act, w.txt_ff_out, proj, x, m.txt(5),
                                         {&lora.txt_ff_in, 0, &lora.txt_ff_out}));
  return absl::OkStatus();
}

absl::Status Flux2Transformer::single_block(const Flux2SingleBlockWeights& w, const Pass& p,
                                            size_t layer) const {
  const int64_t d = config_.hidden(), f = config_.mlp_hidden();
  const float eps = static_cast<float>(config_.eps);
  const Flux2ModulationLayout m(d);
  const int64_t shift = m.single(0), scale = m.single(1), gate = m.single(2);
  const ModulatedRows& all = p.all;  // text, image (and reference) rows
  const Tensor &x = p.stream, &wide = p.wide, &attn_mlp = p.attn_mlp, &proj = p.proj;
  const Tensor q = wide.col_slice(0, d), k = wide.col_slice(d, d), v = wide.col_slice(2 * d, d);
  const Tensor mlp_in = wide.col_slice(3 * d, 2 * f);  // [gate | up]
  const QkNormRope norm{{w.norm_q, {}}, {w.norm_k, {}},         p.s(), eps, p.rope_cos,
                        p.rope_sin,     RopeStyle::kInterleaved};
  static const Flux2LoraSingleBlock kNoLora;
  const size_t j = layer - weights_.double_blocks.size();
  const Flux2LoraSingleBlock& lora = p.single_lora(j) ? *p.single_lora(j) : kNoLora;

  // One fused projection [q | k | v | mlp gate | mlp up] of the modulated norm, attention beside
  // the SwiGLU, and to_out over [attn | swiglu(mlp)] with the gated residual.
  // LoRA's terms on v are added now, on q and k with their norm in attend, on the MLP columns
  // with the SwiGLU.
  FLUX_RETURN_IF_ERROR(
      all.norm_linear(x, shift, scale, w.qkv_mlp, wide, &lora.qkv_mlp, {2 * d, d}));  // [S, 3D+2F]
  FLUX_RETURN_IF_ERROR(attend(p, norm, q, k, v, attn_mlp.col_slice(0, d), layer,
                              {&lora.qkv_mlp, nullptr}));  // [S, D]
  FLUX_RETURN_IF_ERROR(all.swiglu_linear(mlp_in, attn_mlp, w.out, proj, x, gate,
                                         {&lora.qkv_mlp, 3 * d, &lora.out}));  // [S, D]
  return absl::OkStatus();
}

absl::Status Flux2Transformer::set_up(Pass& p, int64_t step, const Tensor& x,
                                      const Tensor& out) const {
  const Flux2Conditioning& cond = p.cond;
  const Flux2Workspace& ws = *cond.workspace;
  if (step < 0 || step >= cond.modulation.rows()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step, " outside the prepared ", cond.modulation.rows(), " steps"));
  }
  p.kv = flux2_kv_mode(cond.kv != nullptr, step);
  p.l = cond.text_len;
  p.n = cond.image_len;
  p.r = p.kv == Flux2KvMode::kCached ? 0 : cond.reference_len;
  if (x.rows() != p.n + p.r || x.cols() != config_.in_channels || out.rows() != p.n ||
      out.cols() != config_.out_channels) {
    return absl::InvalidArgumentError(absl::StrCat("latents ", x.describe(), " / output ",
                                                   out.describe(), " do not match ", p.n,
                                                   " image and ", p.r, " reference tokens"));
  }
  if (cond.sequence_parallel != nullptr) FLUX_RETURN_IF_ERROR(take_shard(p));
  const int64_t l = p.l, n = p.n, s = p.s();
  p.mod = cond.modulation.row_slice(step, 1);  // [1, 17D]
  // Rows by the modulation they read: this step's (klein-KV's extract forward: the references,
  // from row L + N on, timestep 0's).
  auto modulated = [&](int64_t begin, int64_t end) {
    return ModulatedRows(
        backend_, config_.hidden(), static_cast<float>(config_.eps), p.normed, begin, end,
        flux2_kv_row_modulation(p.kv, p.mod, cond.reference_modulation, l + n, begin, end), ws);
  };
  p.stream = ws.stream.row_slice(0, s);
  p.normed = ws.normed.row_slice(0, s);
  p.txt = modulated(0, l);
  p.img = modulated(l, s);
  p.all = modulated(0, s);
  p.wide = ws.wide.row_slice(0, s);
  p.attn_mlp = ws.attn_mlp.row_slice(0, s);
  p.proj = ws.proj.row_slice(0, s);
  p.rope_cos = cond.rope_cos.row_slice(p.first, s);
  p.rope_sin = cond.rope_sin.row_slice(p.first, s);
  return absl::OkStatus();
}

absl::Status Flux2Transformer::take_shard(Pass& p) const {
  const Flux2SequenceParallel& sp = *p.cond.sequence_parallel;
  if (p.cond.step_cache != nullptr) {
    return absl::InvalidArgumentError(
        "cache: step caching compares whole-sequence residuals and does not run "
        "sequence-parallel");
  }
  const int rank = sp.group->rank();
  const int64_t text = p.l, image = p.n;
  p.first = sp.first_row();
  p.l = sp.shards.part_in(rank, 0, text).second;
  p.n = sp.shards.part_in(rank, text, image).second;
  p.r = sp.shards.part_in(rank, text + image, p.r).second;
  return absl::OkStatus();
}

absl::Status Flux2Transformer::forward(const Flux2Conditioning& cond, int64_t step, const Tensor& x,
                                       const Tensor& out, const ActivationTap& tap,
                                       const std::function<absl::Status()>& between_blocks) const {
  Pass p(cond);
  absl::Status status = set_up(p, step, x, out);
  if (status.ok()) status = forward_rows(p, x, out, tap, between_blocks);
  const Flux2SequenceParallel* sp = cond.sequence_parallel.get();
  if (sp == nullptr) return status;
  // Sequence-parallel: every rank wrote its rows of out; gather the others'. A failure here ends
  // the group, so no rank waits for this one.
  if (status.ok()) status = gather_image_rows(*sp, cond.text_len, out);  // [N, out_channels]
  if (!status.ok()) sp->group->abort(status);
  return status;
}

absl::Status Flux2Transformer::forward_rows(
    Pass& p, const Tensor& x, const Tensor& out, const ActivationTap& tap,
    const std::function<absl::Status()>& between_blocks) const {
  Backend& be = backend_;
  const Flux2Conditioning& cond = p.cond;
  const int64_t d = config_.hidden();
  const float eps = static_cast<float>(config_.eps);
  const int64_t l = p.l, n = p.n, s = p.s();

  // The stream's text rows, then its image (and reference) rows embedded from their rows of x
  // (one rank: all of them).
  const int64_t x_first = std::max<int64_t>(0, p.first + l - cond.text_len);
  const Tensor txt = p.stream.row_slice(0, l), img = p.stream.row_slice(l, s - l);
  if (l > 0) FLUX_RETURN_IF_ERROR(be.copy(cond.txt.row_slice(p.first, l), txt));  // [L, D]
  const Tensor x_rows = s > l ? x.row_slice(x_first, s - l) : Tensor();
  if (s > l) FLUX_RETURN_IF_ERROR(be.linear(x_rows, weights_.x_embedder, {}, img));  // [N (+R), D]
  const Flux2Lora* lora = cond.lora.get();
  if (lora != nullptr && s > l)
    FLUX_RETURN_IF_ERROR(add_lora(be, &lora->x_embedder, x_rows, img, *cond.workspace));

  // Double blocks, then single blocks (layer: their index in that order); `between_blocks`
  // before every block but the first.
  auto check = [&](size_t layer) {
    return layer > 0 && between_blocks ? between_blocks() : absl::OkStatus();
  };
  auto run_double = [&](size_t i) -> absl::Status {
    FLUX_RETURN_IF_ERROR(check(i));
    FLUX_RETURN_IF_ERROR(double_block(weights_.double_blocks[i], p, i));
    if (tap) {
      tap(absl::StrCat("block.double.", i, ".txt"), txt);
      tap(absl::StrCat("block.double.", i, ".img"), img);
    }
    return absl::OkStatus();
  };
  auto run_single = [&](size_t j) -> absl::Status {
    const size_t layer = weights_.double_blocks.size() + j;
    FLUX_RETURN_IF_ERROR(check(layer));
    FLUX_RETURN_IF_ERROR(single_block(weights_.single_blocks[j], p, layer));
    if (tap) tap(absl::StrCat("block.single.", j, ".out"), p.stream);
    return absl::OkStatus();
  };
  // With step caching each list runs its block 0, then its other blocks or its cached residual
  // (model/step_cache.h): the double list's F on the image rows, the single list's on all rows.
  Flux2StepCache* cache = cond.step_cache.get();
  FLUX_RETURN_IF_ERROR(run_block_list(be, cache ? &cache->list(StepCacheList::kDouble) : nullptr,
                                      weights_.double_blocks.size(), p.stream, img, run_double));
  FLUX_RETURN_IF_ERROR(run_block_list(be, cache ? &cache->list(StepCacheList::kSingle) : nullptr,
                                      weights_.single_blocks.size(), p.stream, p.stream,
                                      run_single));

  // Final modulated norm on the generated image's tokens (scale first, then shift), then the
  // projection; the reference rows are dropped.
  const Flux2ModulationLayout m(d);
  if (n == 0) return absl::OkStatus();  // a rank whose shard holds no image rows
  const Tensor final_rows = p.stream.row_slice(l, n), final_normed = p.normed.row_slice(l, n);
  const Tensor shift = p.mod.col_slice(m.out_shift(), d), scale = p.mod.col_slice(m.out_scale(), d);
  const Tensor out_rows = out.row_slice(x_first, n);  // one rank: all of out
  if (lora == nullptr || lora->proj_out.empty()) {
    return be.layer_norm_modulate_linear(final_rows, shift, scale, eps, final_normed,
                                         weights_.proj_out, out_rows);  // [N, out_channels]
  }
  FLUX_RETURN_IF_ERROR(be.layer_norm_modulate_linear_keeping_normed(
      final_rows, shift, scale, eps, final_normed, weights_.proj_out, out_rows));
  return add_lora(be, &lora->proj_out, final_normed, out_rows, *cond.workspace);
}

}  // namespace flux2
