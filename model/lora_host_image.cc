// The packed layout of an adapter's matrices and its host image; see lora_host_image.h.
// Tested by tests/host/lora_host_image_test.cc.
#include "model/lora_host_image.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/base/dtype.h"
#include "kernels/base/parallel.h"
#include "kernels/base/status.h"

namespace flux2 {
namespace {

// The fused weight a target writes: its kind and block.
std::pair<int, int64_t> fused_weight(const LoraTarget& target) {
  return {static_cast<int>(target.kind), target.block};
}

int64_t aligned(int64_t offset, int64_t value_bytes) {
  const int64_t step = std::max<int64_t>(1, kLoraPackAlignmentBytes / value_bytes);
  return (offset + step - 1) / step * step;
}

// Each module with its target, those of one fused weight next to each other (adapter order
// otherwise: modules of one adapter on one fused weight write disjoint columns).
absl::StatusOr<std::vector<PackedLoraModule>> grouped_modules(const Flux2Config& config,
                                                              const LoraAdapter& adapter) {
  const std::map<std::string, LoraTarget> targets = flux2_lora_targets(config);
  std::vector<PackedLoraModule> modules;
  for (const LoraModule& m : adapter.modules) {
    auto found = targets.find(m.module);
    if (found == targets.end() || found->second.in_features != m.in_features ||
        found->second.out_features != m.out_features) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoRA module ", m.module, " does not fit this transformer"));
    }
    modules.push_back({found->second, &m});
  }
  std::stable_sort(modules.begin(), modules.end(), [](const auto& x, const auto& y) {
    return fused_weight(x.target) < fused_weight(y.target);
  });
  return modules;
}

// Copies `count` f32 values into `out` as `dtype` (f32, or bf16 rounded to nearest even).
void store_values(const float* in, int64_t count, DType dtype, char* out) {
  if (dtype == DType::kF32) {
    std::memcpy(out, in, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  auto* bits = reinterpret_cast<uint16_t*>(out);
  parallel_for(count, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) bits[i] = f32_to_bf16_bits(in[i]);
  });
}

}  // namespace

absl::StatusOr<LoraPacking> pack_lora_modules(const Flux2Config& config, const LoraAdapter& adapter,
                                              int64_t value_bytes) {
  LoraPacking packing;
  FLUX_ASSIGN_OR_RETURN(packing.modules, grouped_modules(config, adapter));
  std::vector<PackedLoraModule>& modules = packing.modules;
  int64_t offset = 0;
  for (size_t first = 0; first < modules.size();) {
    size_t end = first;
    int64_t rows = 0;
    for (; end < modules.size() &&
           fused_weight(modules[end].target) == fused_weight(modules[first].target);
         ++end) {
      rows += modules[end].source->rank;
    }
    const int64_t stack = aligned(offset, value_bytes);
    offset = stack + rows * modules[first].source->in_features;
    for (int64_t row = 0; first < end; ++first) {
      PackedLoraModule& m = modules[first];
      m.stack = stack;
      m.stack_rows = rows;
      m.a_row = row;
      row += m.source->rank;
      m.b = aligned(offset, value_bytes);
      offset = m.b + m.source->out_features * m.source->rank;
    }
  }
  packing.values = offset;
  return packing;
}

int64_t lora_packed_bytes_bound(const LoraAdapter& adapter, int64_t value_bytes) {
  const int64_t gaps = 2 * static_cast<int64_t>(adapter.modules.size());
  return adapter.values() * value_bytes + gaps * kLoraPackAlignmentBytes;
}

absl::StatusOr<std::shared_ptr<const LoraHostImage>> LoraHostImage::make(
    const Flux2Config& config, const LoraAdapter& adapter, DType dtype,
    const LoraHostAllocator& allocate) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA host image: no ", dtype_name(dtype), " form (f32 or bf16 only)"));
  }
  const int64_t value_bytes = dtype_size(dtype);
  FLUX_ASSIGN_OR_RETURN(const LoraPacking packing, pack_lora_modules(config, adapter, value_bytes));
  auto image = std::make_shared<LoraHostImage>();
  FLUX_ASSIGN_OR_RETURN(image->values_, allocate(dtype, {packing.values}));
  char* base = static_cast<char*>(image->values_.data());
  int64_t written = 0;  // everything before this offset is set; the gaps are zeroed
  const auto skip_to = [&](int64_t offset) {
    if (offset <= written) return;
    std::memset(base + written * value_bytes, 0,
                static_cast<size_t>((offset - written) * value_bytes));
  };
  for (const PackedLoraModule& m : packing.modules) {
    const LoraModule& source = *m.source;
    if (m.stack >= written) {  // the first module of a stack: the stack, A matrices back to back
      skip_to(m.stack);
      written = m.stack + m.stack_rows * source.in_features;
    }
    store_values(source.a.data(), static_cast<int64_t>(source.a.size()), dtype,
                 base + (m.stack + m.a_row * source.in_features) * value_bytes);
    skip_to(m.b);
    store_values(source.b.data(), static_cast<int64_t>(source.b.size()), dtype,
                 base + m.b * value_bytes);
    written = m.b + static_cast<int64_t>(source.b.size());
  }
  skip_to(packing.values);
  return std::shared_ptr<const LoraHostImage>(std::move(image));
}

LoraHostImageMaker lora_host_image_maker(Backend& backend, const Flux2Config& config) {
  if (backend.device() == Device::kCpu) return nullptr;  // its weights are host memory already
  return [&backend, config](const LoraAdapter& adapter) {
    return LoraHostImage::make(config, adapter, backend.weight_dtype(),
                               [&backend](DType dtype, Shape shape) {
                                 return backend.empty_host(dtype, std::move(shape));
                               });
  };
}

}  // namespace flux2
