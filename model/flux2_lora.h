// LoRA adapters on the transformer's backend: each adapter's A and B uploaded once
// (Flux2LoraWeights), and per request the terms each fused weight adds (Flux2Lora), adapters in
// request order, applied unfused with PEFT's rounding points. Tested by `flux2 check-golden
// --only lora` (tests/golden) and tests/host/lora_apply_test.cc.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/flux2_config.h"
#include "model/lora_adapter.h"
#include "model/lora_host_image.h"
#include "model/lora_targets.h"

namespace flux2 {

// One adapter's contribution to one fused weight's output y [M, *]:
//   y[:, out_offset : out_offset + out] += round(round(round(x · aᵀ) · bᵀ) · scale)
// (round: to the activation dtype; PEFT's `result + lora_B(lora_A(x)) * scaling`). `a` is rows
// [a_row, a_row + r) of `a_stack`, the A matrices of one adapter's modules on this fused weight
// stacked at upload, so apply_lora runs one GEMM for consecutive terms of the same stack.
struct Flux2LoraTerm {
  Tensor a;  // [r, in]
  Tensor b;  // [out, r]
  float scale = 1.0f;
  int64_t out_offset = 0;
  Tensor a_stack;  // [sum of r, in]
  int64_t a_row = 0;
};
using Flux2LoraTerms = std::vector<Flux2LoraTerm>;

struct Flux2LoraDoubleBlock {
  Flux2LoraTerms img_qkv, txt_qkv, img_out, txt_out, img_ff_in, img_ff_out, txt_ff_in, txt_ff_out;
};
struct Flux2LoraSingleBlock {
  Flux2LoraTerms qkv_mlp, out;
};

// The terms of one request, by the fused weight of model/flux2_weights.h they add to.
struct Flux2Lora {
  Flux2LoraTerms x_embedder, context_embedder, time_linear_1, time_linear_2, guidance_linear_1,
      guidance_linear_2, modulation, proj_out;
  std::vector<Flux2LoraDoubleBlock> double_blocks;
  std::vector<Flux2LoraSingleBlock> single_blocks;
  // The widest x · aᵀ apply_lora computes at once (the terms of one list, summed): its scratch.
  int64_t max_rank = 0;

  bool empty() const { return max_rank == 0; }
  // The list a target's terms go to.
  Flux2LoraTerms& terms(const LoraTarget& target);
};

// One adapter's modules on a backend, in its weight dtype (bf16 on CUDA: PEFT casts the adapter to
// the base layer's dtype).
class Flux2LoraWeights {
 public:
  // Uploads every module of `adapter` (parsed for `config`: parse_lora_adapter) into one buffer
  // packed as pack_lora_modules says: the modules of one fused weight next to each other with
  // their A matrices in one stack. With `image` (the adapter's LoraHostImage for this backend)
  // that is one copy, finished on return; without, each matrix is converted from f32 on its way.
  static absl::StatusOr<std::shared_ptr<const Flux2LoraWeights>> upload(
      Backend& backend, const Flux2Config& config, std::shared_ptr<const LoraAdapter> adapter,
      const LoraHostImage* image = nullptr);
  // The device bytes `adapter` is charged once uploaded to a backend storing `value_bytes` per
  // value: lora_packed_bytes_bound (its buffer is at most that).
  static int64_t device_bytes(const LoraAdapter& adapter, int64_t value_bytes);

  struct Module {
    LoraTarget target;
    const LoraModule* source = nullptr;  // in adapter()
    Tensor a, b;                         // [r, in], [out, r]
    Tensor a_stack;                      // a is its rows [a_row, a_row + r) (Flux2LoraTerm)
    int64_t a_row = 0;
  };

  const LoraAdapter& adapter() const { return *adapter_; }
  const std::vector<Module>& modules() const { return modules_; }
  int64_t device_bytes() const { return device_bytes_; }

 private:
  std::shared_ptr<const LoraAdapter> adapter_;
  std::vector<Module> modules_;
  int64_t device_bytes_ = 0;
};

// An adapter as a request uses it: its device weights and the request's weight (set_adapters'
// adapter_weights: the PEFT scaling is scaling(weight)).
struct Flux2LoraUse {
  std::shared_ptr<const Flux2LoraWeights> weights;
  double weight = 1.0;
};

// The terms of `uses`, in order; an adapter of weight 0 adds nothing and is left out.
Flux2Lora flux2_lora(const Flux2Config& config, std::span<const Flux2LoraUse> uses);

// The LoRA products t = x · aᵀ [rows, >= max_rank]: a list's terms take its columns in order.
struct Flux2LoraScratch {
  Tensor t;
  // Allocates t for `rows` rows of `lora`'s terms (nothing for an empty one).
  absl::Status allocate(Backend& backend, const Flux2Lora& lora, int64_t rows);
};

// The first half of the terms: t = x · aᵀ of each into its columns of `t` (rows: x's), one GEMM per
// run of terms sharing a stack. Their B sides then come from lora_ups(terms, t), which the
// consumer adds (Backend::lora_up_add or a fused consumer).
absl::Status lora_down(Backend& backend, const Flux2LoraTerms& terms, const Tensor& x,
                       const Tensor& t);
// The B sides of `terms` whose products lora_down wrote into `t`.
std::vector<LoraUpTerm> lora_ups(const Flux2LoraTerms& terms, const Tensor& t);
// The parts of `ups` on the columns [begin, begin + cols) of their output, as terms of that
// column range.
std::vector<LoraUpTerm> lora_columns(const std::vector<LoraUpTerm>& ups, int64_t begin,
                                     int64_t cols);

// The B sides of q's and k's columns (the first 2·d of a fused [q | k | v ...] output), for
// Backend::normed_qk: part 0's terms on rows [0, split), part 1's on rows [split, rows) (either may
// be null), their products in those rows of `t`.
QkLoraTerms lora_qk_terms(const Flux2LoraTerms* part0, const Flux2LoraTerms* part1, int64_t split,
                          int64_t rows, const Tensor& t, int64_t d);

// y += every term of `terms` applied to x [M, in] (a no-op without terms), in order: lora_down into
// the scratch, then Backend::lora_up_add.
absl::Status apply_lora(Backend& backend, const Flux2LoraTerms& terms, const Tensor& x,
                        const Tensor& y, const Flux2LoraScratch& scratch);

}  // namespace flux2
