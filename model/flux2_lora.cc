// LoRA adapters on the backend and their unfused application; see flux2_lora.h.
// Tested by `flux2 check-golden --only lora` (tests/golden) and tests/host/lora_apply_test.cc.
#include "model/flux2_lora.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "model/lora_host_image.h"

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
  return lora_packed_bytes_bound(adapter, value_bytes);
}

namespace {

// `count` elements of `buffer` [n] from element `offset`, as a [rows, cols] matrix.
Tensor packed(const Tensor& buffer, int64_t offset, int64_t rows, int64_t cols) {
  return buffer.reshape({buffer.numel(), 1}).row_slice(offset, rows * cols).reshape({rows, cols});
}

// Fills `buffer` with `image` when it holds this packing in the buffer's dtype: one copy, waited
// for, so the image (page-locked host memory the registry may drop) is free again on return.
// False when it does not fit.
absl::StatusOr<bool> copy_image(Backend& backend, const LoraHostImage* image,
                                const Tensor& buffer) {
  if (image == nullptr || image->values().dtype() != buffer.dtype() ||
      image->values().numel() != buffer.numel()) {
    return false;
  }
  FLUX_ASSIGN_OR_RETURN(const CopyTicket ticket, backend.start_copies({{image->values(), buffer}}));
  FLUX_RETURN_IF_ERROR(backend.await_copies(ticket));
  FLUX_RETURN_IF_ERROR(backend.synchronize());
  return true;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Flux2LoraWeights>> Flux2LoraWeights::upload(
    Backend& backend, const Flux2Config& config, std::shared_ptr<const LoraAdapter> adapter,
    const LoraHostImage* image) {
  auto weights = std::make_shared<Flux2LoraWeights>();
  weights->adapter_ = std::move(adapter);
  const DType dtype = backend.weight_dtype();
  FLUX_ASSIGN_OR_RETURN(const LoraPacking packing,
                        pack_lora_modules(config, *weights->adapter_, dtype_size(dtype)));
  FLUX_ASSIGN_OR_RETURN(const Tensor buffer, backend.empty(dtype, {packing.values}));
  FLUX_ASSIGN_OR_RETURN(const bool copied, copy_image(backend, image, buffer));
  for (const PackedLoraModule& p : packing.modules) {
    const LoraModule& m = *p.source;
    const Tensor stack = packed(buffer, p.stack, p.stack_rows, m.in_features);
    Module module{p.target,
                  &m,
                  stack.row_slice(p.a_row, m.rank),
                  packed(buffer, p.b, m.out_features, m.rank),
                  stack,
                  p.a_row};
    if (!copied) {  // converted from the adapter's f32 values, tensor by tensor
      FLUX_RETURN_IF_ERROR(backend.upload(m.a.data(), DType::kF32, module.a));
      FLUX_RETURN_IF_ERROR(backend.upload(m.b.data(), DType::kF32, module.b));
    }
    weights->modules_.push_back(std::move(module));
  }
  weights->device_bytes_ = device_bytes(*weights->adapter_, dtype_size(dtype));
  return std::shared_ptr<const Flux2LoraWeights>(std::move(weights));
}

namespace {

int64_t total_rank(const Flux2LoraTerms& terms) {
  int64_t rank = 0;
  for (const Flux2LoraTerm& term : terms) rank += term.a.rows();
  return rank;
}

// The widest list of `lora`: apply_lora's scratch width.
int64_t widest_list(const Flux2Lora& lora) {
  int64_t widest = 0;
  for (const Flux2LoraTerms* terms :
       {&lora.x_embedder, &lora.context_embedder, &lora.time_linear_1, &lora.time_linear_2,
        &lora.guidance_linear_1, &lora.guidance_linear_2, &lora.modulation, &lora.proj_out}) {
    widest = std::max(widest, total_rank(*terms));
  }
  for (const Flux2LoraDoubleBlock& block : lora.double_blocks) {
    for (const Flux2LoraTerms* terms :
         {&block.img_qkv, &block.txt_qkv, &block.img_out, &block.txt_out, &block.img_ff_in,
          &block.img_ff_out, &block.txt_ff_in, &block.txt_ff_out}) {
      widest = std::max(widest, total_rank(*terms));
    }
  }
  for (const Flux2LoraSingleBlock& block : lora.single_blocks) {
    widest = std::max({widest, total_rank(block.qkv_mlp), total_rank(block.out)});
  }
  return widest;
}

// Whether `next` continues `term`'s rows of the same A stack (one GEMM computes both).
bool continues(const Flux2LoraTerm& term, const Flux2LoraTerm& next) {
  return next.a_stack.data() == term.a_stack.data() && next.a_row == term.a_row + term.a.rows();
}

}  // namespace

Flux2Lora flux2_lora(const Flux2Config& config, std::span<const Flux2LoraUse> uses) {
  Flux2Lora lora;
  lora.double_blocks.resize(static_cast<size_t>(config.num_layers));
  lora.single_blocks.resize(static_cast<size_t>(config.num_single_layers));
  for (const Flux2LoraUse& use : uses) {
    if (use.weight == 0.0) continue;  // PEFT adds round(u · 0) = 0: nothing
    for (const Flux2LoraWeights::Module& m : use.weights->modules()) {
      lora.terms(m.target).push_back(
          {m.a, m.b, m.source->scaling(use.weight), m.target.out_offset, m.a_stack, m.a_row});
    }
  }
  lora.max_rank = widest_list(lora);
  return lora;
}

absl::Status Flux2LoraScratch::allocate(Backend& backend, const Flux2Lora& lora, int64_t rows) {
  if (lora.empty()) return absl::OkStatus();
  FLUX_ASSIGN_OR_RETURN(t, backend.empty(backend.activation_dtype(), {rows, lora.max_rank}));
  return absl::OkStatus();
}

absl::Status lora_down(Backend& backend, const Flux2LoraTerms& terms, const Tensor& x,
                       const Tensor& t) {
  if (terms.empty()) return absl::OkStatus();
  if (t.rows() != x.rows() || total_rank(terms) > t.cols()) {
    return absl::InternalError("lora_down: the LoRA scratch is smaller than these terms");
  }
  // Terms continuing one A stack (an adapter's modules on one fused weight) are one stack's rows.
  std::vector<Tensor> stacks;
  int64_t column = 0;
  for (size_t first = 0; first < terms.size();) {
    size_t end = first + 1;
    int64_t rank = terms[first].a.rows();
    for (; end < terms.size() && continues(terms[end - 1], terms[end]); ++end) {
      rank += terms[end].a.rows();
    }
    const Flux2LoraTerm& lead = terms[first];
    stacks.push_back(lead.a_stack.row_slice(lead.a_row, rank));
    column += rank;
    first = end;
  }
  return backend.lora_down(x, stacks, t.col_slice(0, column));  // [M, sum of r]
}

std::vector<LoraUpTerm> lora_ups(const Flux2LoraTerms& terms, const Tensor& t) {
  std::vector<LoraUpTerm> ups;
  ups.reserve(terms.size());
  int64_t column = 0;
  for (const Flux2LoraTerm& term : terms) {
    const int64_t r = term.a.rows();
    ups.push_back({t.col_slice(column, r), term.b, term.scale, term.out_offset});
    column += r;
  }
  return ups;
}

std::vector<LoraUpTerm> lora_columns(const std::vector<LoraUpTerm>& ups, int64_t begin,
                                     int64_t cols) {
  std::vector<LoraUpTerm> part;
  for (const LoraUpTerm& up : ups) {
    const int64_t first = std::max(begin, up.out_offset);
    const int64_t end = std::min(begin + cols, up.out_offset + up.b.rows());
    if (first >= end) continue;
    part.push_back(
        {up.t, up.b.row_slice(first - up.out_offset, end - first), up.scale, first - begin});
  }
  return part;
}

QkLoraTerms lora_qk_terms(const Flux2LoraTerms* part0, const Flux2LoraTerms* part1, int64_t split,
                          int64_t rows, const Tensor& t, int64_t d) {
  QkLoraTerms qk;
  const Flux2LoraTerms* parts[2] = {part0, part1};
  for (int part = 0; part < 2; ++part) {
    const int64_t first = part == 0 ? 0 : split, count = part == 0 ? split : rows - split;
    if (parts[part] == nullptr || parts[part]->empty() || count == 0) continue;
    const std::vector<LoraUpTerm> ups = lora_ups(*parts[part], t.row_slice(first, count));
    qk.q[part] = lora_columns(ups, 0, d);
    qk.k[part] = lora_columns(ups, d, d);
  }
  return qk;
}

absl::Status apply_lora(Backend& backend, const Flux2LoraTerms& terms, const Tensor& x,
                        const Tensor& y, const Flux2LoraScratch& scratch) {
  if (terms.empty()) return absl::OkStatus();
  if (x.rows() > scratch.t.rows()) {
    return absl::InternalError("apply_lora: the LoRA scratch is smaller than these terms");
  }
  const Tensor t = scratch.t.row_slice(0, x.rows());
  FLUX_RETURN_IF_ERROR(lora_down(backend, terms, x, t));
  return backend.lora_up_add(y, lora_ups(terms, t));
}

}  // namespace flux2
