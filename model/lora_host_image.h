// How an adapter's matrices are packed into the one buffer Flux2LoraWeights holds on a device
// (pack_lora_modules), and that buffer's host copy in the device's dtype (LoraHostImage), made
// where the adapter is loaded so an upload is one copy. Tested by
// tests/host/lora_host_image_test.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/flux2_config.h"
#include "model/lora_adapter.h"
#include "model/lora_targets.h"

namespace flux2 {

// Every A stack and every B starts on a boundary of this many bytes (cuBLASLt's default alignment
// assumption; lora_down's 16-byte row loads need less).
inline constexpr int64_t kLoraPackAlignmentBytes = 256;

// One module's place in the packed buffer, in elements from its start.
struct PackedLoraModule {
  LoraTarget target;
  const LoraModule* source = nullptr;  // in the adapter packed
  int64_t stack = 0;       // the A stack of its fused weight: [stack_rows, in] at this offset
  int64_t stack_rows = 0;  // the sum of the ranks of the stack's modules
  int64_t a_row = 0;       // its A [rank, in] is rows [a_row, a_row + rank) of the stack
  int64_t b = 0;           // its B [out, rank] at this offset
};

struct LoraPacking {
  std::vector<PackedLoraModule> modules;  // those of one fused weight next to each other
  int64_t values = 0;                     // the buffer's elements, alignment gaps included
};

// The packing of `adapter` (parsed for `config`) at `value_bytes` per element: for each fused
// weight its modules' A matrices stacked (apply_lora runs one product for a run of them), then each
// module's B. InvalidArgument when a module does not fit `config`.
absl::StatusOr<LoraPacking> pack_lora_modules(const Flux2Config& config, const LoraAdapter& adapter,
                                              int64_t value_bytes);
// An upper bound of the packed bytes that needs no config: the values plus one alignment gap per
// A stack and B at most.
int64_t lora_packed_bytes_bound(const LoraAdapter& adapter, int64_t value_bytes);

// Host memory for an image: Backend::empty_host (page-locked on CUDA, so the upload is one DMA).
using LoraHostAllocator = std::function<absl::StatusOr<Tensor>(DType, Shape)>;

// An adapter's packed buffer in host memory, in the dtype of the device it is uploaded to: f32
// values rounded to nearest even for bf16 (PEFT casts the adapter to the base layer's dtype), gaps
// zero.
class LoraHostImage {
 public:
  static absl::StatusOr<std::shared_ptr<const LoraHostImage>> make(
      const Flux2Config& config, const LoraAdapter& adapter, DType dtype,
      const LoraHostAllocator& allocate);

  const Tensor& values() const { return values_; }  // [LoraPacking::values], contiguous
  int64_t bytes() const { return values_.bytes(); }

 private:
  Tensor values_;
};

// Makes the images of adapters for a transformer of `config` on `backend` (its weight dtype, its
// empty_host memory). Thread-safe: the LoRA registry calls it on request threads. Null for the
// CPU backend, whose "device" weights are host memory already: an image would only copy them.
using LoraHostImageMaker =
    std::function<absl::StatusOr<std::shared_ptr<const LoraHostImage>>(const LoraAdapter&)>;
LoraHostImageMaker lora_host_image_maker(Backend& backend, const Flux2Config& config);

}  // namespace flux2
