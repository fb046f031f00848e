// LoRA adapters on the backend and their unfused application; see flux2_lora.h.
// Tested by `flux2 check-golden --only lora` (tests/golden) and tests/host/lora_apply_test.cc.
#include "model/flux2_lora.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"

namespace flux2 {

Flux2LoraTerms& Flux2Lora::terms(const LoraTarget& target) {
  using K = LoraTargetKind;
  const size_t i = static_cast<size_t>(std::max<int64_t>(target.block, 0));
  switch (target.kind) {
    case K::kXEmbedder:
      return x_embedder;
    case K::kContextEmbedder:
      return context_embedder;
    case K::kTimeLinear1:
      return time_linear_1;
    case K::kTimeLinear2:
      return time_linear_2;
    case K::kGuidanceLinear1:
      return guidance_linear_1;
    case K::kGuidanceLinear2:
      return guidance_linear_2;
    case K::kModulation:
      return modulation;
    case K::kProjOut:
      return proj_out;
    case K::kDoubleImgQkv:
      return double_blocks[i].img_qkv;
    case K::kDoubleTxtQkv:
      return double_blocks[i].txt_qkv;
    case K::kDoubleImgOut:
      return double_blocks[i].img_out;
    case K::kDoubleTxtOut:
      return double_blocks[i].txt_out;
    case K::kDoubleImgFfIn:
      return double_blocks[i].img_ff_in;
    case K::kDoubleImgFfOut:
      return double_blocks[i].img_ff_out;
    case K::kDoubleTxtFfIn:
      return double_blocks[i].txt_ff_in;
    case K::kDoubleTxtFfOut:
      return double_blocks[i].txt_ff_out;
    case K::kSingleQkvMlp:
      return single_blocks[i].qkv_mlp;
    case K::kSingleOut:
      return single_blocks[i].out;
  }
  return x_embedder;  // unreachable: every kind is listed
}

int64_t Flux2LoraWeights::device_bytes(const LoraAdapter& adapter, int64_t value_bytes) {
  return adapter.values() * value_bytes;
}

absl::StatusOr<std::shared_ptr<const Flux2LoraWeights>> Flux2LoraWeights::upload(
    Backend& backend, const Flux2Config& config, std::shared_ptr<const LoraAdapter> adapter) {
  const std::map<std::string, LoraTarget> targets = flux2_lora_targets(config);
  auto weights = std::make_shared<Flux2LoraWeights>();
  weights->adapter_ = std::move(adapter);
  const DType dtype = backend.weight_dtype();
  for (const LoraModule& m : weights->adapter_->modules) {
    auto found = targets.find(m.module);
    if (found == targets.end() || found->second.in_features != m.in_features ||
        found->second.out_features != m.out_features) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoRA module ", m.module, " does not fit this transformer"));
    }
    Module module{found->second, &m, {}, {}};
    FLUX_ASSIGN_OR_RETURN(module.a, backend.empty(dtype, {m.rank, m.in_features}));
    FLUX_ASSIGN_OR_RETURN(module.b, backend.empty(dtype, {m.out_features, m.rank}));
    FLUX_RETURN_IF_ERROR(backend.upload(m.a.data(), DType::kF32, module.a));
    FLUX_RETURN_IF_ERROR(backend.upload(m.b.data(), DType::kF32, module.b));
    weights->modules_.push_back(std::move(module));
  }
  weights->device_bytes_ = device_bytes(*weights->adapter_, dtype_size(dtype));
  return std::shared_ptr<const Flux2LoraWeights>(std::move(weights));
}

Flux2Lora flux2_lora(const Flux2Config& config, std::span<const Flux2LoraUse> uses) {
  Flux2Lora lora;
  lora.double_blocks.resize(static_cast<size_t>(config.num_layers));
  lora.single_blocks.resize(static_cast<size_t>(config.num_single_layers));
  for (const Flux2LoraUse& use : uses) {
    if (use.weight == 0.0) continue;  // PEFT adds round(u · 0) = 0: nothing
    for (const Flux2LoraWeights::Module& m : use.weights->modules()) {
      lora.terms(m.target).push_back(
          {m.a, m.b, m.source->scaling(use.weight), m.target.out_offset});
      lora.max_rank = std::max(lora.max_rank, m.source->rank);
      lora.max_out = std::max(lora.max_out, m.source->out_features);
    }
  }
  return lora;
}

absl::Status Flux2LoraScratch::allocate(Backend& backend, const Flux2Lora& lora, int64_t rows) {
  if (lora.empty()) return absl::OkStatus();
  const DType act = backend.activation_dtype();
  FLUX_ASSIGN_OR_RETURN(t, backend.empty(act, {rows, lora.max_rank}));
  FLUX_ASSIGN_OR_RETURN(u, backend.empty(act, {rows, lora.max_out}));
  return absl::OkStatus();
}

absl::Status apply_lora(Backend& backend, const Flux2LoraTerms& terms, const Tensor& x,
                        const Tensor& y, const Flux2LoraScratch& scratch) {
  const int64_t m = x.rows();
  for (const Flux2LoraTerm& term : terms) {
    const int64_t rank = term.a.rows(), out = term.b.rows();
    if (m > scratch.t.rows() || rank > scratch.t.cols() || out > scratch.u.cols()) {
      return absl::InternalError("apply_lora: the LoRA scratch is smaller than this term");
    }
    const Tensor t = scratch.t.row_slice(0, m).col_slice(0, rank);
    const Tensor u = scratch.u.row_slice(0, m).col_slice(0, out);
    FLUX_RETURN_IF_ERROR(backend.linear(x, term.a, {}, t));  // [M, r]
    FLUX_RETURN_IF_ERROR(backend.linear(t, term.b, {}, u));  // [M, out]
    FLUX_RETURN_IF_ERROR(backend.add_scaled(y.col_slice(term.out_offset, out), u, term.scale));
  }
  return absl::OkStatus();
}

}  // namespace flux2
