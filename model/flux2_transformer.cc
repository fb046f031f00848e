// The FLUX.2 transformer forward in paper order; see flux2_transformer.h.
// Tested by `flux2 check-golden --only transformer` on tests/data/tiny-{klein,dev}.
#include "model/flux2_transformer.h"

#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "model/rope.h"
#include "model/timestep_embedding.h"

namespace flux2 {

absl::StatusOr<std::unique_ptr<Flux2Transformer>> Flux2Transformer::load(
    Backend& backend, const ComponentWeights& checkpoint) {
  FLUX_ASSIGN_OR_RETURN(Flux2Config config,
                        Flux2Config::from_json(checkpoint.config(), checkpoint.config_path()));
  std::unique_ptr<Flux2Transformer> model(new Flux2Transformer(backend, std::move(config)));
  const std::vector<WeightSpec> table = model->weights_.table(model->config_);
  FLUX_ASSIGN_OR_RETURN(model->load_report_, load_weights(backend, checkpoint, table, nullptr));
  return model;
}

absl::StatusOr<std::unique_ptr<Flux2Transformer>> Flux2Transformer::create_random(
    Backend& backend, Flux2Config config, uint64_t seed) {
  std::unique_ptr<Flux2Transformer> model(new Flux2Transformer(backend, std::move(config)));
  const std::vector<WeightSpec> table = model->weights_.table(model->config_);
  FLUX_ASSIGN_OR_RETURN(model->load_report_.device_bytes, allocate_weights(backend, table));
  FLUX_RETURN_IF_ERROR(fill_random_weights(backend, table, seed));
  model->load_report_.tensors = static_cast<int64_t>(table.size());
  return model;
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

absl::StatusOr<int64_t> Flux2Transformer::enable_quality_high() {
  return register_low_precision_weights(backend_, weights_.table(config_));
}

absl::StatusOr<Tensor> Flux2Transformer::embed_conditioning(std::span<const float> values,
                                                            const Tensor& linear_1,
                                                            const Tensor& linear_2) const {
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
  FLUX_RETURN_IF_ERROR(be.silu(hidden, hidden));                // [steps, D]
  FLUX_ASSIGN_OR_RETURN(Tensor emb, be.empty(be.activation_dtype(), {steps, d}));
  FLUX_RETURN_IF_ERROR(be.linear(hidden, linear_2, {}, emb));  // [steps, D]
  return emb;
}

absl::StatusOr<Flux2Conditioning> Flux2Transformer::prepare(const Tensor& prompt_embeds,
                                                            std::span<const int64_t> txt_ids,
                                                            std::span<const int64_t> img_ids,
                                                            std::span<const float> timesteps,
                                                            std::span<const float> guidance) const {
  Backend& be = backend_;
  const DType act = be.activation_dtype();
  const int64_t d = config_.hidden(), f = config_.mlp_hidden();
  const int64_t axes = static_cast<int64_t>(config_.axes_dims_rope.size());
  const int64_t steps = static_cast<int64_t>(timesteps.size());
  Flux2Conditioning cond;
  cond.text_len = prompt_embeds.rows();
  cond.image_len = static_cast<int64_t>(img_ids.size()) / axes;
  const int64_t seq = cond.text_len + cond.image_len;
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

  // Text conditioning is the same for every step.
  FLUX_ASSIGN_OR_RETURN(cond.txt, be.empty(act, {cond.text_len, d}));
  FLUX_RETURN_IF_ERROR(
      be.linear(prompt_embeds, weights_.context_embedder, {}, cond.txt));  // [L, D]

  // RoPE over the joint sequence, text rows first.
  std::vector<int64_t> ids(txt_ids.begin(), txt_ids.end());
  ids.insert(ids.end(), img_ids.begin(), img_ids.end());
  FLUX_ASSIGN_OR_RETURN(std::tie(cond.rope_cos, cond.rope_sin), rope_tables(ids));

  // Timestep (+ guidance) embedding and the shared modulation for every step (§1.3 steps 1-3).
  FLUX_ASSIGN_OR_RETURN(Tensor temb, embed_conditioning(timesteps, weights_.time_linear_1,
                                                        weights_.time_linear_2));  // [steps, D]
  if (config_.guidance_embeds) {
    FLUX_ASSIGN_OR_RETURN(Tensor gemb, embed_conditioning(guidance, weights_.guidance_linear_1,
                                                          weights_.guidance_linear_2));
    FLUX_RETURN_IF_ERROR(be.add(temb, gemb, temb));  // [steps, D]
  }
  FLUX_RETURN_IF_ERROR(be.silu(temb, temb));  // [steps, D]
  const Flux2ModulationLayout layout(d);
  FLUX_ASSIGN_OR_RETURN(cond.modulation, be.empty(act, {steps, layout.width()}));
  FLUX_RETURN_IF_ERROR(be.linear(temb, weights_.modulation, {}, cond.modulation));  // [steps, 17D]

  auto ws = std::make_shared<Flux2Workspace>();
  FLUX_ASSIGN_OR_RETURN(ws->stream, be.empty(act, {seq, d}));
  FLUX_ASSIGN_OR_RETURN(ws->normed, be.empty(act, {seq, d}));
  FLUX_ASSIGN_OR_RETURN(ws->wide, be.empty(act, {seq, 3 * d + 2 * f}));
  FLUX_ASSIGN_OR_RETURN(ws->attn_mlp, be.empty(act, {seq, d + f}));
  FLUX_ASSIGN_OR_RETURN(ws->proj, be.empty(act, {seq, d}));
  cond.workspace = std::move(ws);
  return cond;
}

absl::Status Flux2Transformer::double_block(const Flux2DoubleBlockWeights& w, const Tensor& mod,
                                            const Flux2Conditioning& cond) const {
  Backend& be = backend_;
  const Flux2Workspace& ws = *cond.workspace;
  const int64_t l = cond.text_len, n = cond.image_len;
  const int64_t d = config_.hidden(), f = config_.mlp_hidden(), dh = config_.attention_head_dim;
  const float eps = static_cast<float>(config_.eps);
  const Flux2ModulationLayout m(d);
  auto img_mod = [&](int chunk) {
    return mod.col_slice(m.img(chunk), d);
  };  // shift, scale, gate x2
  auto txt_mod = [&](int chunk) { return mod.col_slice(m.txt(chunk), d); };
  auto txt_rows = [&](const Tensor& t) { return t.row_slice(0, l); };
  auto img_rows = [&](const Tensor& t) { return t.row_slice(l, n); };
  const Tensor& x = ws.stream;
  const Tensor qkv = ws.wide.col_slice(0, 3 * d);
  const Tensor q = qkv.col_slice(0, d), k = qkv.col_slice(d, d), v = qkv.col_slice(2 * d, d);
  const Tensor attn = ws.attn_mlp.col_slice(0, d);
  const Tensor ff_in = ws.wide.col_slice(0, 2 * f);
  const Tensor ff_act = ws.attn_mlp.col_slice(d, f);
  const AttentionParams params{config_.num_attention_heads, config_.num_attention_heads, dh,
                               static_cast<float>(1.0 / std::sqrt(static_cast<double>(dh)))};

  // Attention: both streams attend jointly over [text ; image].
  // Each projection fused with the norm that feeds it: at quality=high the CUDA backend's norm
  // writes the FP8 GEMM's input rows directly.
  FLUX_RETURN_IF_ERROR(be.layer_norm_modulate_linear(img_rows(x), img_mod(0), img_mod(1), eps,
                                                     img_rows(ws.normed), w.img_qkv,
                                                     img_rows(qkv)));  // [N, 3D]
  FLUX_RETURN_IF_ERROR(be.layer_norm_modulate_linear(txt_rows(x), txt_mod(0), txt_mod(1), eps,
                                                     txt_rows(ws.normed), w.txt_qkv,
                                                     txt_rows(qkv)));  // [L, 3D]
  // QK-norm (text rows, then image rows, each stream with its weights) and RoPE, then attention.
  const QkNormRope norm{{w.txt_norm_q, w.img_norm_q},
                        {w.txt_norm_k, w.img_norm_k},
                        l,
                        eps,
                        cond.rope_cos,
                        cond.rope_sin,
                        RopeStyle::kInterleaved};
  FLUX_RETURN_IF_ERROR(be.normed_attention(q, k, v, norm, params, attn));              // [S, D]
  FLUX_RETURN_IF_ERROR(be.linear(img_rows(attn), w.img_out, {}, img_rows(ws.proj)));   // [N, D]
  FLUX_RETURN_IF_ERROR(be.linear(txt_rows(attn), w.txt_out, {}, txt_rows(ws.proj)));   // [L, D]
  FLUX_RETURN_IF_ERROR(be.gate_residual(img_rows(x), img_mod(2), img_rows(ws.proj)));  // [N, D]
  FLUX_RETURN_IF_ERROR(be.gate_residual(txt_rows(x), txt_mod(2), txt_rows(ws.proj)));  // [L, D]

  // Feed-forward (SwiGLU), separate weights per stream.
  FLUX_RETURN_IF_ERROR(be.layer_norm_modulate_linear(img_rows(x), img_mod(3), img_mod(4), eps,
                                                     img_rows(ws.normed), w.img_ff_in,
                                                     img_rows(ff_in)));  // [N, 2F]
  FLUX_RETURN_IF_ERROR(be.layer_norm_modulate_linear(txt_rows(x), txt_mod(3), txt_mod(4), eps,
                                                     txt_rows(ws.normed), w.txt_ff_in,
                                                     txt_rows(ff_in)));  // [L, 2F]
  const Tensor ff_gate = ff_in.col_slice(0, f), ff_up = ff_in.col_slice(f, f);
  // Each stream's SwiGLU, its down projection ([N, D], then [L, D]) and gated residual.
  const GatedResidual img_residual{img_rows(x), img_mod(5)}, txt_residual{txt_rows(x), txt_mod(5)};
  FLUX_RETURN_IF_ERROR(be.swiglu_linear(img_rows(ff_gate), img_rows(ff_up), img_rows(ff_act),
                                        w.img_ff_out, img_rows(ws.proj), &img_residual));
  FLUX_RETURN_IF_ERROR(be.swiglu_linear(txt_rows(ff_gate), txt_rows(ff_up), txt_rows(ff_act),
                                        w.txt_ff_out, txt_rows(ws.proj), &txt_residual));
  return absl::OkStatus();
}

absl::Status Flux2Transformer::single_block(const Flux2SingleBlockWeights& w, const Tensor& mod,
                                            const Flux2Conditioning& cond) const {
  Backend& be = backend_;
  const Flux2Workspace& ws = *cond.workspace;
  const int64_t d = config_.hidden(), f = config_.mlp_hidden(), dh = config_.attention_head_dim;
  const float eps = static_cast<float>(config_.eps);
  const Flux2ModulationLayout m(d);
  const Tensor shift = mod.col_slice(m.single(0), d), scale = mod.col_slice(m.single(1), d);
  const Tensor gate = mod.col_slice(m.single(2), d);
  const Tensor& x = ws.stream;
  const Tensor q = ws.wide.col_slice(0, d), k = ws.wide.col_slice(d, d),
               v = ws.wide.col_slice(2 * d, d);
  const Tensor mlp_gate = ws.wide.col_slice(3 * d, f), mlp_up = ws.wide.col_slice(3 * d + f, f);
  const AttentionParams params{config_.num_attention_heads, config_.num_attention_heads, dh,
                               static_cast<float>(1.0 / std::sqrt(static_cast<double>(dh)))};

  FLUX_RETURN_IF_ERROR(be.layer_norm_modulate_linear(x, shift, scale, eps, ws.normed, w.qkv_mlp,
                                                     ws.wide));  // [S, 3D + 2F]
  const QkNormRope norm{{w.norm_q, {}}, {w.norm_k, {}},         q.rows(), eps, cond.rope_cos,
                        cond.rope_sin,  RopeStyle::kInterleaved};
  FLUX_RETURN_IF_ERROR(
      be.normed_attention(q, k, v, norm, params, ws.attn_mlp.col_slice(0, d)));  // [S, D]
  // to_out reads [attn | swiglu(mlp)]: the SwiGLU lands next to the attention output; then the
  // gated residual.
  const GatedResidual residual{x, gate};
  FLUX_RETURN_IF_ERROR(
      be.swiglu_linear(mlp_gate, mlp_up, ws.attn_mlp, w.out, ws.proj, &residual));  // [S, D]
  return absl::OkStatus();
}

absl::Status Flux2Transformer::forward(const Flux2Conditioning& cond, int64_t step, const Tensor& x,
                                       const Tensor& out, const ActivationTap& tap) const {
  Backend& be = backend_;
  const Flux2Workspace& ws = *cond.workspace;
  const int64_t l = cond.text_len, n = cond.image_len, d = config_.hidden();
  const float eps = static_cast<float>(config_.eps);
  if (step < 0 || step >= cond.modulation.rows()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step, " outside the prepared ", cond.modulation.rows(), " steps"));
  }
  if (x.rows() != n || x.cols() != config_.in_channels || out.rows() != n ||
      out.cols() != config_.out_channels) {
    return absl::InvalidArgumentError(absl::StrCat("latents ", x.describe(), " / output ",
                                                   out.describe(), " do not match ", n,
                                                   " image tokens"));
  }
  const Tensor mod = cond.modulation.row_slice(step, 1);  // [1, 17D]
  const Tensor txt = ws.stream.row_slice(0, l), img = ws.stream.row_slice(l, n);
  FLUX_RETURN_IF_ERROR(be.copy(cond.txt, txt));                      // [L, D]
  FLUX_RETURN_IF_ERROR(be.linear(x, weights_.x_embedder, {}, img));  // [N, D]

  for (size_t i = 0; i < weights_.double_blocks.size(); ++i) {
    FLUX_RETURN_IF_ERROR(double_block(weights_.double_blocks[i], mod, cond));
    if (tap) {
      tap(absl::StrCat("block.double.", i, ".txt"), txt);
      tap(absl::StrCat("block.double.", i, ".img"), img);
    }
  }
  for (size_t j = 0; j < weights_.single_blocks.size(); ++j) {
    FLUX_RETURN_IF_ERROR(single_block(weights_.single_blocks[j], mod, cond));
    if (tap) tap(absl::StrCat("block.single.", j, ".out"), ws.stream);
  }

  // Final modulated norm on the image tokens (scale first, then shift), then the projection.
  const Flux2ModulationLayout m(d);
  const Tensor img_normed = ws.normed.row_slice(l, n);
  FLUX_RETURN_IF_ERROR(be.layer_norm_modulate_linear(
      img, mod.col_slice(m.out_shift(), d), mod.col_slice(m.out_scale(), d), eps, img_normed,
      weights_.proj_out, out));  // [N, out_channels]
  return absl::OkStatus();
}

}  // namespace flux2
