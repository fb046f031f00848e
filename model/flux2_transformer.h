// The FLUX.2 transformer (Flux2Transformer2DModel, architecture §1) for every variant, written
// once against the backend interface. Batch 1: text, image and reference tokens share one joint
// residual stream [L + N + R, D] (text rows, then the generated image's, then the references'), so
// the double blocks' concatenation and the final split are row slices, never copies. Editing
// rides references in the image stream (only the first N outputs are the velocity); klein-KV runs
// them once at step 0 and attends to their cached K/V after. Tested by `flux2 check-golden --only
// transformer` and `--only edit` / `edit_kv` (tests/golden).
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/base/communicator.h"
#include "model/activation_tap.h"
#include "model/checkpoint.h"
#include "model/flux2_config.h"
#include "model/flux2_kv_cache.h"
#include "model/flux2_lora.h"
#include "model/flux2_weights.h"
#include "model/fp8_input_scale.h"
#include "model/step_cache.h"
#include "model/weight_loader.h"

namespace flux2 {

struct Flux2SequenceParallel;  // model/sequence_parallel.h

// Activation buffers for one (text, image, reference) length, reused by every step of a request.
struct Flux2Workspace {
  Tensor stream;  // [S, D]        joint residual stream: text, image, then reference rows
  Tensor normed;  // [S, D]        modulated LayerNorm output
  Tensor wide;    // [S, 3D + 2F]  fused projections: q|k|v (+ mlp gate|up in single blocks)
  Tensor
      attn_mlp;  // [S, D + F]    attention output | SwiGLU output (the single block's to_out input)
  Tensor proj;   // [S, D]        output projections before the gated residual
  Flux2LoraScratch lora;  // LoRA intermediates (empty without adapters)
};

// The reference tokens of an editing request, as the transformer sees them.
struct Flux2References {
  std::vector<int64_t> ids;  // [R, 4] position ids (T = 10 (k + 1), row, col, 0) per reference
  // klein-KV: the first forward runs the references (timestep-0 modulation, attending only to
  // themselves) and caches their K/V; later forwards take only the N image rows and attend to the
  // cache. Otherwise the references ride in the stream at every forward.
  bool kv_cache = false;
};

// Everything the steps of one request share.
struct Flux2Conditioning {
  int64_t text_len = 0;         // L
  int64_t image_len = 0;        // N: the generated image's tokens (the velocity's rows)
  int64_t reference_len = 0;    // R: reference tokens (0: text-to-image)
  Tensor txt;                   // [L, D]      context_embedder(prompt_embeds), step independent
  Tensor rope_cos;              // [L + N + R, Dh] text rows, then image rows, then references
  Tensor rope_sin;              // [L + N + R, Dh]
  Tensor modulation;            // [steps, 17D] shared modulation per step (Flux2ModulationLayout)
  Tensor reference_modulation;  // [1, 17D] klein-KV: the timestep-0 modulation of references
  std::shared_ptr<Flux2KvCache> kv;       // klein-KV only (flux2_kv_cache.h)
  std::shared_ptr<const Flux2Lora> lora;  // the request's LoRA adapters (null: none)
  std::shared_ptr<Flux2Workspace> workspace;
  // Step caching of this branch's forwards (model/step_cache.h; null: every block runs).
  std::shared_ptr<Flux2StepCache> step_cache;
  // Sequence parallelism (Flux2Transformer::enable_sequence_parallel): this rank's shard of the
  // joint sequence and its exchange buffers; null: this forward runs the whole sequence.
  std::shared_ptr<const Flux2SequenceParallel> sequence_parallel;
};

class Flux2Transformer {
 public:
  // Reads transformer/config.json and the weights of `checkpoint` onto `backend`; an FP8
  // checkpoint's block projections as `placement` says (weight_loader.h).
  static absl::StatusOr<std::unique_ptr<Flux2Transformer>> load(
      Backend& backend, const ComponentWeights& checkpoint,
      Fp8Placement placement = Fp8Placement::kDequantized);

  // A transformer of `config` with reproducible random weights (fill_random_weights): the real
  // shapes without a checkpoint, for `flux2 bench` and GPU tests. With `stored_fp8` the block
  // projections are stored FP8 weights instead (random E4M3 codes and row scales, as an FP8
  // checkpoint loaded with Fp8Placement::kStored: `flux2 bench --weights fp8`).
  static absl::StatusOr<std::unique_ptr<Flux2Transformer>> create_random(Backend& backend,
                                                                         Flux2Config config,
                                                                         uint64_t seed,
                                                                         bool stored_fp8 = false);

  // quality=high: the backend's low-precision copies of the FP8-eligible weights of the tensor
  // table (the blocks' projections), kept in the weights; a stored FP8 weight's copy is made from
  // its own codes and scales (Backend::add_stored_fp8_weight), with Fp8InputScale::kStatic and
  // its checkpoint's input scale (Weight::input_scale) under that static activation scale.
  // Returns the device bytes added and the GEMMs registered (register_low_precision_weights).
  absl::StatusOr<LowPrecisionReport> enable_quality_high(
      Fp8InputScale input_scale = Fp8InputScale::kDynamic);
  // --fp8-lossless=resident: the stored FP8 weights given resident values in the weight dtype
  // (dequantize_stored_weights).
  absl::StatusOr<DequantizedBytes> dequantize_stored_weights();

  const Flux2Config& config() const { return config_; }
  const LoadReport& load_report() const { return load_report_; }

  // Per-request precomputation. prompt_embeds [L, J]; txt_ids [L, 4] and img_ids [N, 4] integer
  // positions; timesteps: the model's `timestep` input per step, in sigma units (0..1);
  // guidance: one raw guidance scale per step when the model has a guidance embedder, else empty;
  // references: the editing request's reference tokens (null: text-to-image); lora: the request's
  // adapters (flux2_lora; null or empty: none), applied to every forward of the request.
  absl::StatusOr<Flux2Conditioning> prepare(const Tensor& prompt_embeds,
                                            std::span<const int64_t> txt_ids,
                                            std::span<const int64_t> img_ids,
                                            std::span<const float> timesteps,
                                            std::span<const float> guidance,
                                            const Flux2References* references = nullptr,
                                            std::shared_ptr<const Flux2Lora> lora = nullptr) const;

  // Makes `cond`'s forwards run sequence-parallel as rank group.rank() of group.size()
  // (model/sequence_parallel.h): this rank's shard of the [text ; image ; references] rows, its
  // workspace cut to them. Every rank of the group prepares the same request, calls this with its
  // communicator (which must outlive cond) and then runs the same forwards; each ends with the
  // whole velocity. InvalidArgument when the heads do not divide among the ranks, for klein-KV
  // and (at forward) with step caching. A group of one runs the exchange path with one rank.
  absl::Status enable_sequence_parallel(Flux2Conditioning& cond, Communicator& group) const;

  // out [N, out_channels] = the velocity at `step` for x [N + R, in_channels]: the latent tokens,
  // then the R reference tokens (R = 0 for text-to-image; klein-KV: x is [N + R] at step 0, which
  // fills the cache, and [N] at later steps, which read it: step 0 runs first).
  // `between_blocks`, when set, runs on the host before every block but the first; a non-OK
  // status stops the forward and is returned (out is then undefined, and a klein-KV cache
  // incomplete: the request must end). On an asynchronous backend it runs as the ops are
  // enqueued, ahead of the device. Sequence-parallel (cond.sequence_parallel): x and out are the
  // whole request's on every rank, `tap` sees this rank's rows, and a failure on this rank ends
  // the group (Communicator::abort), so the other ranks' forwards fail too instead of waiting.
  absl::Status forward(const Flux2Conditioning& cond, int64_t step, const Tensor& x,
                       const Tensor& out, const ActivationTap& tap = nullptr,
                       const std::function<absl::Status()>& between_blocks = nullptr) const;

 private:
  Flux2Transformer(Backend& backend, Flux2Config config)
      : backend_(backend), config_(std::move(config)) {}

  struct Pass;  // one forward's row layout and modulations (flux2_transformer.cc)
  // Lays out the forward at `step` for x and out (forward's shapes), or InvalidArgument.
  absl::Status set_up(Pass& pass, int64_t step, const Tensor& x, const Tensor& out) const;
  // Sequence parallelism: narrows the pass to this rank's rows of the joint sequence.
  absl::Status take_shard(Pass& pass) const;
  // The forward after set_up, up to the output rows this pass holds (forward's contract).
  absl::Status forward_rows(Pass& pass, const Tensor& x, const Tensor& out,
                            const ActivationTap& tap,
                            const std::function<absl::Status()>& between_blocks) const;
  absl::Status double_block(const Flux2DoubleBlockWeights& w, const Pass& pass, size_t layer) const;
  absl::Status single_block(const Flux2SingleBlockWeights& w, const Pass& pass, size_t layer) const;
  // The attention of one block: q, k, v [S, D] views of the pass's fused projections; QK-norm
  // and RoPE, then joint attention into out [S, D] (klein-KV's through Flux2KvCache). `lora`: the
  // LoRA terms of the projection's rows [0, norm.split) and [norm.split, S) (null: none), whose
  // q and k columns norm_linear left to be added here with the norm.
  absl::Status attend(const Pass& pass, const QkNormRope& norm, const Tensor& q, const Tensor& k,
                      const Tensor& v, const Tensor& out, size_t layer,
                      std::array<const Flux2LoraTerms*, 2> lora) const;
  // The shared modulation [steps, 17D] of timesteps (+ guidance): silu(temb) · modulationᵀ.
  // With `lora`, its adapters act on the embedders and the modulation.
  absl::StatusOr<Tensor> modulation_rows(std::span<const float> timesteps,
                                         std::span<const float> guidance,
                                         const Flux2Conditioning& cond) const;
  // MLP(sinusoid(scaled values)) for every step: [steps, D] (TimestepEmbedding, §1.4), each
  // linear with its LoRA terms.
  absl::StatusOr<Tensor> embed_conditioning(std::span<const float> values, const Tensor& linear_1,
                                            const Flux2LoraTerms& lora_1, const Tensor& linear_2,
                                            const Flux2LoraTerms& lora_2,
                                            const Flux2Conditioning& cond) const;

  // RoPE tables [S, Dh] for the position ids of a request, cached on the device by the ids (a
  // size and text length share them; at most 8 distinct ones, the smallest key evicted first):
  // computing them in float64 costs milliseconds per request.
  absl::StatusOr<std::pair<Tensor, Tensor>> rope_tables(const std::vector<int64_t>& ids) const;

  Backend& backend_;
  Flux2Config config_;
  Flux2Weights weights_;
  LoadReport load_report_;
  mutable std::map<std::vector<int64_t>, std::pair<Tensor, Tensor>> rope_cache_;
};

}  // namespace flux2
