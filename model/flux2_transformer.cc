// The FLUX.2 transformer forward in paper order; see flux2_transformer.h.
// Tested by `flux2 check-golden --only transformer` on tests/data/tiny-{klein,dev}.
#include "model/flux2_transformer.h"

#include <algorithm>
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
  FLUX_ASSIGN_OR_RETURN(model->load_report_.device_bytes, allocate_device_weights(backend, table));
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

absl::StatusOr<Tensor> Flux2Transformer::modulation_rows(std::span<const float> timesteps,
                                                         std::span<const float> guidance) const {
  Backend& be = backend_;
  FLUX_ASSIGN_OR_RETURN(Tensor temb, embed_conditioning(timesteps, weights_.time_linear_1,
                                                        weights_.time_linear_2));  // [steps, D]
  if (config_.guidance_embeds) {
    FLUX_ASSIGN_OR_RETURN(Tensor gemb, embed_conditioning(guidance, weights_.guidance_linear_1,
                                                          weights_.guidance_linear_2));
    FLUX_RETURN_IF_ERROR(be.add(temb, gemb, temb));  // [steps, D]
  }
  FLUX_RETURN_IF_ERROR(be.silu(temb, temb));  // [steps, D]
  const Flux2ModulationLayout layout(config_.hidden());
  FLUX_ASSIGN_OR_RETURN(Tensor modulation,
                        be.empty(be.activation_dtype(), {temb.rows(), layout.width()}));
  FLUX_RETURN_IF_ERROR(be.linear(temb, weights_.modulation, {}, modulation));  // [steps, 17D]
  return modulation;
}

absl::StatusOr<Flux2Conditioning> Flux2Transformer::prepare(
    const Tensor& prompt_embeds, std::span<const int64_t> txt_ids, std::span<const int64_t> img_ids,
    std::span<const float> timesteps, std::span<const float> guidance,
    const Flux2References* references) const {
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

  // Text conditioning is the same for every step.
  FLUX_ASSIGN_OR_RETURN(cond.txt, be.empty(act, {cond.text_len, d}));
  FLUX_RETURN_IF_ERROR(
      be.linear(prompt_embeds, weights_.context_embedder, {}, cond.txt));  // [L, D]

  // RoPE over the joint sequence: text rows, image rows, reference rows.
  std::vector<int64_t> ids(txt_ids.begin(), txt_ids.end());
  ids.insert(ids.end(), img_ids.begin(), img_ids.end());
  if (references != nullptr) ids.insert(ids.end(), references->ids.begin(), references->ids.end());
  FLUX_ASSIGN_OR_RETURN(std::tie(cond.rope_cos, cond.rope_sin), rope_tables(ids));

  // Timestep (+ guidance) embedding and the shared modulation for every step (§1.3 steps 1-3).
  FLUX_ASSIGN_OR_RETURN(cond.modulation, modulation_rows(timesteps, guidance));  // [steps, 17D]
  if (references != nullptr && references->kv_cache && cond.reference_len > 0) {
    // klein-KV: the references are modulated at timestep 0 (diffusers' ref_fixed_timestep), with
    // the first step's guidance when the model embeds it.
    const float zero[1] = {0.0f};
    FLUX_ASSIGN_OR_RETURN(cond.reference_modulation,
                          modulation_rows(zero, guidance.empty() ? guidance : guidance.first(1)));
    auto cache = std::make_shared<Flux2KvCache>();
    const size_t layers = weights_.double_blocks.size() + weights_.single_blocks.size();
    for (size_t i = 0; i < layers; ++i) {
      FLUX_ASSIGN_OR_RETURN(Tensor keys, be.empty(act, {cond.reference_len, d}));
      FLUX_ASSIGN_OR_RETURN(Tensor values, be.empty(act, {cond.reference_len, d}));
      cache->keys.push_back(keys);
      cache->values.push_back(values);
    }
    cond.kv = std::move(cache);
  }

  auto ws = std::make_shared<Flux2Workspace>();
  FLUX_ASSIGN_OR_RETURN(ws->stream, be.empty(act, {seq, d}));
  FLUX_ASSIGN_OR_RETURN(ws->normed, be.empty(act, {seq, d}));
  FLUX_ASSIGN_OR_RETURN(ws->wide, be.empty(act, {seq, 3 * d + 2 * f}));
  FLUX_ASSIGN_OR_RETURN(ws->attn_mlp, be.empty(act, {seq, d + f}));
  FLUX_ASSIGN_OR_RETURN(ws->proj, be.empty(act, {seq, d}));
  cond.workspace = std::move(ws);
  return cond;
}

// One forward's view of the joint stream: S = L + N + R rows (text, image, references), with
// R = 0 in klein-KV's cached forwards, whose keys also include the R cached reference rows.
struct Flux2Transformer::Pass {
  explicit Pass(const Flux2Conditioning& conditioning) : cond(conditioning) {}
  const Flux2Conditioning& cond;
  int64_t l = 0, n = 0, r = 0;  // text, image and reference rows in this forward's stream
  Tensor mod;                   // [1, 17D] this step's modulation
  Tensor ref_mod;               // klein-KV's extract forward: the references' modulation
  bool extract = false;         // klein-KV: runs the references and fills the cache
  bool cached = false;          // klein-KV: attends to the cached reference K/V as well
  Tensor stream, normed, wide, attn_mlp, proj;  // the workspace's first S rows
  Tensor rope_cos, rope_sin;                    // [S, Dh]
  int64_t s() const { return l + n + r; }
};

namespace {

// Rows [first, first + count) of the stream that share one modulation row.
struct Segment {
  int64_t first = 0, count = 0;
  const Tensor* mod = nullptr;
};

Tensor rows_of(const Tensor& t, const Segment& segment) {
  return t.row_slice(segment.first, segment.count);
}

// Rows [begin, end) split where their modulation changes: in klein-KV's extract forward the
// reference rows (from L + N on) use the timestep-0 modulation; otherwise one segment.
std::vector<Segment> modulation_segments(const Tensor& mod, const Tensor& ref_mod, bool extract,
                                         int64_t references_from, int64_t begin, int64_t end) {
  if (!extract) return {Segment{begin, end - begin, &mod}};
  const int64_t split = std::clamp(references_from, begin, end);
  std::vector<Segment> segments;
  if (split > begin) segments.push_back({begin, split - begin, &mod});
  if (end > split) segments.push_back({split, end - split, &ref_mod});
  return segments;
}

}  // namespace

absl::Status Flux2Transformer::attend(const Pass& p, const QkNormRope& norm, const Tensor& q,
                                      const Tensor& k, const Tensor& v, const Tensor& out,
                                      size_t layer) const {
  Backend& be = backend_;
  const int64_t dh = config_.attention_head_dim;
  const AttentionParams params{config_.num_attention_heads, config_.num_attention_heads, dh,
                               static_cast<float>(1.0 / std::sqrt(static_cast<double>(dh)))};
  if (!p.extract && !p.cached) return be.normed_attention(q, k, v, norm, params, out);
  FLUX_RETURN_IF_ERROR(be.normed_qk(q, k, norm, dh));  // post-RoPE q and k in place
  Flux2KvCache& cache = *p.cond.kv;
  const int64_t joint = p.l + p.n;  // text and image rows: they attend to every key
  if (p.extract) {
    // The references' keys and values are cached; text and image rows attend to all keys, the
    // references only to themselves (diffusers' _flux2_kv_causal_attention).
    const Tensor ref_q = q.row_slice(joint, p.r), ref_k = k.row_slice(joint, p.r),
                 ref_v = v.row_slice(joint, p.r);
    FLUX_RETURN_IF_ERROR(be.copy(ref_k, cache.keys[layer]));    // [R, D]
    FLUX_RETURN_IF_ERROR(be.copy(ref_v, cache.values[layer]));  // [R, D]
    FLUX_RETURN_IF_ERROR(
        be.attention(q.row_slice(0, joint), k, v, params, out.row_slice(0, joint)));  // [L+N, D]
    return be.attention(ref_q, ref_k, ref_v, params, out.row_slice(joint, p.r));      // [R, D]
  }
  // Cached: the R reference rows go after the stream's keys, in the workspace rows past S (it
  // was sized for L + N + R), so one attention sees [text; image; references].
  const int64_t refs = p.cond.reference_len;
  // Both blocks lay out q | k | v first in the workspace's fused projections.
  const Tensor& wide = p.cond.workspace->wide;
  const int64_t d = config_.hidden();
  const Tensor all_k = wide.col_slice(d, d).row_slice(0, joint + refs);
  const Tensor all_v = wide.col_slice(2 * d, d).row_slice(0, joint + refs);
  if (all_k.data() != k.data() || all_v.data() != v.data()) {
    return absl::InternalError("klein-KV attention: k and v are not the workspace's q|k|v columns");
  }
  FLUX_RETURN_IF_ERROR(be.copy(cache.keys[layer], all_k.row_slice(joint, refs)));
  FLUX_RETURN_IF_ERROR(be.copy(cache.values[layer], all_v.row_slice(joint, refs)));
  return be.attention(q, all_k, all_v, params, out);  // [L+N, D]
}

absl::Status Flux2Transformer::double_block(const Flux2DoubleBlockWeights& w, const Pass& p,
                                            size_t layer) const {
  Backend& be = backend_;
  const int64_t l = p.l, s = p.s();
  const int64_t d = config_.hidden(), f = config_.mlp_hidden();
  const float eps = static_cast<float>(config_.eps);
  const Flux2ModulationLayout m(d);
  // shift, scale, gate x2 of each stream
  auto img_mod = [&](const Tensor& mod, int chunk) { return mod.col_slice(m.img(chunk), d); };
  auto txt_mod = [&](int chunk) { return p.mod.col_slice(m.txt(chunk), d); };
  auto txt_rows = [&](const Tensor& t) { return t.row_slice(0, l); };
  auto img_rows = [&](const Tensor& t) { return t.row_slice(l, s - l); };  // image + references
  // The image stream's rows by modulation (one segment but in klein-KV's extract forward).
  const std::vector<Segment> img_segments =
      modulation_segments(p.mod, p.ref_mod, p.extract, p.l + p.n, l, s);
  const Tensor& x = p.stream;
  const Tensor qkv = p.wide.col_slice(0, 3 * d);
  const Tensor q = qkv.col_slice(0, d), k = qkv.col_slice(d, d), v = qkv.col_slice(2 * d, d);
  const Tensor attn = p.attn_mlp.col_slice(0, d);
  const Tensor ff_in = p.wide.col_slice(0, 2 * f);
  const Tensor ff_act = p.attn_mlp.col_slice(d, f);

  // Attention: both streams attend jointly over [text ; image].
  // Each projection fused with the norm that feeds it: at quality=high the CUDA backend's norm
  // writes the FP8 GEMM's input rows directly.
  for (const Segment& g : img_segments) {
    FLUX_RETURN_IF_ERROR(be.layer_norm_modulate_linear(
        rows_of(x, g), img_mod(*g.mod, 0), img_mod(*g.mod, 1), eps, rows_of(p.normed, g), w.img_qkv,
        rows_of(qkv, g)));  // [N (+R), 3D]
  }
  FLUX_RETURN_IF_ERROR(be.layer_norm_modulate_linear(txt_rows(x), txt_mod(0), txt_mod(1), eps,
                                                     txt_rows(p.normed), w.txt_qkv,
                                                     txt_rows(qkv)));  // [L, 3D]
  // QK-norm (text rows, then image rows, each stream with its weights) and RoPE, then attention.
  const QkNormRope norm{
      {w.txt_norm_q, w.img_norm_q}, {w.txt_norm_k, w.img_norm_k}, l, eps, p.rope_cos, p.rope_sin,
      RopeStyle::kInterleaved};
  FLUX_RETURN_IF_ERROR(attend(p, norm, q, k, v, attn, layer));                       // [S, D]
  FLUX_RETURN_IF_ERROR(be.linear(img_rows(attn), w.img_out, {}, img_rows(p.proj)));  // [N, D]
  FLUX_RETURN_IF_ERROR(be.linear(txt_rows(attn), w.txt_out, {}, txt_rows(p.proj)));  // [L, D]
  for (const Segment& g : img_segments) {
    FLUX_RETURN_IF_ERROR(
        be.gate_residual(rows_of(x, g), img_mod(*g.mod, 2), rows_of(p.proj, g)));  // [N, D]
  }
  FLUX_RETURN_IF_ERROR(be.gate_residual(txt_rows(x), txt_mod(2), txt_rows(p.proj)));  // [L, D]

  // Feed-forward (SwiGLU), separate weights per stream.
  for (const Segment& g : img_segments) {
    FLUX_RETURN_IF_ERROR(be.layer_norm_modulate_linear(
        rows_of(x, g), img_mod(*g.mod, 3), img_mod(*g.mod, 4), eps, rows_of(p.normed, g),
        w.img_ff_in, rows_of(ff_in, g)));  // [N, 2F]
  }
  FLUX_RETURN_IF_ERROR(be.layer_norm_modulate_linear(txt_rows(x), txt_mod(3), txt_mod(4), eps,
                                                     txt_rows(p.normed), w.txt_ff_in,
                                                     txt_rows(ff_in)));  // [L, 2F]
  const Tensor ff_gate = ff_in.col_slice(0, f), ff_up = ff_in.col_slice(f, f);
  // Each stream's SwiGLU, its down projection ([N, D], then [L, D]) and gated residual.
  for (const Segment& g : img_segments) {
    const GatedResidual residual{rows_of(x, g), img_mod(*g.mod, 5)};
    FLUX_RETURN_IF_ERROR(be.swiglu_linear(rows_of(ff_gate, g), rows_of(ff_up, g),
                                          rows_of(ff_act, g), w.img_ff_out, rows_of(p.proj, g),
                                          &residual));
  }
  const GatedResidual txt_residual{txt_rows(x), txt_mod(5)};
  FLUX_RETURN_IF_ERROR(be.swiglu_linear(txt_rows(ff_gate), txt_rows(ff_up), txt_rows(ff_act),
                                        w.txt_ff_out, txt_rows(p.proj), &txt_residual));
  return absl::OkStatus();
}

absl::Status Flux2Transformer::single_block(const Flux2SingleBlockWeights& w, const Pass& p,
                                            size_t layer) const {
  Backend& be = backend_;
  const int64_t d = config_.hidden(), f = config_.mlp_hidden();
  const float eps = static_cast<float>(config_.eps);
  const Flux2ModulationLayout m(d);
  auto shift = [&](const Tensor& mod) { return mod.col_slice(m.single(0), d); };
  auto scale = [&](const Tensor& mod) { return mod.col_slice(m.single(1), d); };
  auto gate = [&](const Tensor& mod) { return mod.col_slice(m.single(2), d); };
  const std::vector<Segment> segments =
      modulation_segments(p.mod, p.ref_mod, p.extract, p.l + p.n, 0, p.s());
  const Tensor& x = p.stream;
  const Tensor q = p.wide.col_slice(0, d), k = p.wide.col_slice(d, d),
               v = p.wide.col_slice(2 * d, d);
  const Tensor mlp_gate = p.wide.col_slice(3 * d, f), mlp_up = p.wide.col_slice(3 * d + f, f);

  for (const Segment& g : segments) {
    FLUX_RETURN_IF_ERROR(be.layer_norm_modulate_linear(rows_of(x, g), shift(*g.mod), scale(*g.mod),
                                                       eps, rows_of(p.normed, g), w.qkv_mlp,
                                                       rows_of(p.wide, g)));  // [S, 3D + 2F]
  }
  const QkNormRope norm{{w.norm_q, {}}, {w.norm_k, {}},         q.rows(), eps, p.rope_cos,
                        p.rope_sin,     RopeStyle::kInterleaved};
  FLUX_RETURN_IF_ERROR(attend(p, norm, q, k, v, p.attn_mlp.col_slice(0, d), layer));  // [S, D]
  // to_out reads [attn | swiglu(mlp)]: the SwiGLU lands next to the attention output; then the
  // gated residual.
  for (const Segment& g : segments) {
    const GatedResidual residual{rows_of(x, g), gate(*g.mod)};
    FLUX_RETURN_IF_ERROR(be.swiglu_linear(rows_of(mlp_gate, g), rows_of(mlp_up, g),
                                          rows_of(p.attn_mlp, g), w.out, rows_of(p.proj, g),
                                          &residual));  // [S, D]
  }
  return absl::OkStatus();
}

absl::Status Flux2Transformer::forward(const Flux2Conditioning& cond, int64_t step, const Tensor& x,
                                       const Tensor& out, const ActivationTap& tap) const {
  Backend& be = backend_;
  const Flux2Workspace& ws = *cond.workspace;
  const int64_t d = config_.hidden();
  const float eps = static_cast<float>(config_.eps);
  if (step < 0 || step >= cond.modulation.rows()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step, " outside the prepared ", cond.modulation.rows(), " steps"));
  }
  Pass p(cond);
  p.l = cond.text_len;
  p.n = cond.image_len;
  p.extract = cond.kv != nullptr && step == 0;  // diffusers' kv_cache_mode "extract"
  p.cached = cond.kv != nullptr && step > 0;    // and "cached"
  p.r = p.cached ? 0 : cond.reference_len;
  const int64_t l = p.l, n = p.n, s = p.s();
  if (x.rows() != n + p.r || x.cols() != config_.in_channels || out.rows() != n ||
      out.cols() != config_.out_channels) {
    return absl::InvalidArgumentError(absl::StrCat("latents ", x.describe(), " / output ",
                                                   out.describe(), " do not match ", n,
                                                   " image and ", p.r, " reference tokens"));
  }
  p.mod = cond.modulation.row_slice(step, 1);  // [1, 17D]
  p.ref_mod = p.extract ? cond.reference_modulation : p.mod;
  p.stream = ws.stream.row_slice(0, s);
  p.normed = ws.normed.row_slice(0, s);
  p.wide = ws.wide.row_slice(0, s);
  p.attn_mlp = ws.attn_mlp.row_slice(0, s);
  p.proj = ws.proj.row_slice(0, s);
  p.rope_cos = cond.rope_cos.row_slice(0, s);
  p.rope_sin = cond.rope_sin.row_slice(0, s);

  const Tensor txt = p.stream.row_slice(0, l), img = p.stream.row_slice(l, s - l);
  FLUX_RETURN_IF_ERROR(be.copy(cond.txt, txt));                      // [L, D]
  FLUX_RETURN_IF_ERROR(be.linear(x, weights_.x_embedder, {}, img));  // [N (+R), D]

  size_t layer = 0;
  for (size_t i = 0; i < weights_.double_blocks.size(); ++i, ++layer) {
    FLUX_RETURN_IF_ERROR(double_block(weights_.double_blocks[i], p, layer));
    if (tap) {
      tap(absl::StrCat("block.double.", i, ".txt"), txt);
      tap(absl::StrCat("block.double.", i, ".img"), img);
    }
  }
  for (size_t j = 0; j < weights_.single_blocks.size(); ++j, ++layer) {
    FLUX_RETURN_IF_ERROR(single_block(weights_.single_blocks[j], p, layer));
    if (tap) tap(absl::StrCat("block.single.", j, ".out"), p.stream);
  }

  // Final modulated norm on the generated image's tokens (scale first, then shift), then the
  // projection; the reference rows are dropped.
  const Flux2ModulationLayout m(d);
  FLUX_RETURN_IF_ERROR(be.layer_norm_modulate_linear(
      p.stream.row_slice(l, n), p.mod.col_slice(m.out_shift(), d),
      p.mod.col_slice(m.out_scale(), d), eps, p.normed.row_slice(l, n), weights_.proj_out,
      out));  // [N, out_channels]
  return absl::OkStatus();
}

}  // namespace flux2
