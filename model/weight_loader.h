// The tensor table and the loader it drives: one WeightSpec per checkpoint tensor
// says its name, expected shape and where it goes on the backend. The same table validates the
// checkpoint (missing / unexpected / mis-shaped tensors, all listed in one error), sizes the
// device allocations, counts the bytes and uploads. Tested by tests/host/checkpoint_test.cc.
#pragma once

#include <functional>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/checkpoint.h"

namespace flux2 {

// How a checkpoint tensor is laid out on the backend.
enum class WeightLayout : uint8_t {
  kAsIs,        // same element order as in the checkpoint
  kConvToOhwi,  // conv weight [O, I, kh, kw] stored as [O, kh, kw, I] (NHWC convolution)
};

struct WeightSpec {
  std::string name;        // checkpoint tensor name, e.g. "transformer_blocks.0.attn.to_q.weight"
  Shape shape;             // shape in the checkpoint
  Tensor* target;          // receives the tensor; allocated by the loader
  int64_t target_row = 0;  // first row of `target` (several specs may fill one fused tensor)
  WeightLayout layout = WeightLayout::kAsIs;
  // Set for the projections quality=high runs in FP8 (FP8-eligible): the weight whose `tensor` is
  // `target`; register_low_precision_weights stores the backend's low-precision copy in it.
  Weight* fp8 = nullptr;
  // The target lives in host memory (Backend::empty_host: page-locked on CUDA), for weights the
  // model only gathers from on the host or streams onto the device itself.
  bool host = false;
};

// Checkpoint tensors a model may leave unread (e.g. the VAE encoder).
using UnusedTensorFilter = std::function<bool(absl::string_view name)>;

struct LoadReport {
  int64_t tensors = 0;       // checkpoint tensors read
  int64_t device_bytes = 0;  // bytes allocated on the backend's device
  int64_t host_bytes = 0;    // bytes allocated in host memory (WeightSpec::host)
  double seconds = 0.0;      // wall time of validation, allocation and upload
};

// Tensor names for an error message: the first 20, then ", and N more".
std::string list_names(const std::vector<std::string>& names);

// Checks `checkpoint` against `table` without allocating: every spec's tensor present with its
// shape and a float dtype (or F8_E4M3 with its scales), and every checkpoint tensor either in the
// table or accepted by `unused`. One error lists every problem.
absl::Status validate_weights(const ComponentWeights& checkpoint,
                              const std::vector<WeightSpec>& table,
                              const UnusedTensorFilter& unused);

// The bytes allocate_weights gives each place, {device, host}.
struct WeightBytes {
  int64_t device = 0;
  int64_t host = 0;
};

// Allocates every target of `table` on `backend` (rows = the rows its specs fill, the other
// dimensions must agree; host memory for WeightSpec::host targets) and returns the bytes
// allocated. Targets are left uninitialised.
absl::StatusOr<WeightBytes> allocate_weights(Backend& backend,
                                             const std::vector<WeightSpec>& table);
// allocate_weights for a table without host targets: the device bytes.
absl::StatusOr<int64_t> allocate_device_weights(Backend& backend,
                                                const std::vector<WeightSpec>& table);
// What allocate_weights would allocate, at `value_bytes` per value (the memory plan).
WeightBytes planned_weight_bytes(const std::vector<WeightSpec>& table, int64_t value_bytes);

// Fills every target of `table` (already allocated) with reproducible random values: uniform in
// ±1/sqrt(columns) for matrices, ±1 for vectors. For benchmarks at real shapes without a
// checkpoint.
absl::Status fill_random_weights(Backend& backend, const std::vector<WeightSpec>& table,
                                 uint64_t seed);

// quality=high: registers a low-precision copy of every FP8-eligible weight of `table` (one per
// fused target) with `backend`, stored in the spec's Weight; returns the device bytes added.
absl::StatusOr<int64_t> register_low_precision_weights(Backend& backend,
                                                       const std::vector<WeightSpec>& table);

// Validates, allocates each target (rows = the rows its specs fill), and uploads with dtype
// conversion to backend.weight_dtype(). An FP8 checkpoint tensor (TensorRef::fp8) is dequantized
// to f32 first (dequantize_fp8, model/fp8_checkpoint.h), one tensor at a time.
absl::StatusOr<LoadReport> load_weights(Backend& backend, const ComponentWeights& checkpoint,
                                        const std::vector<WeightSpec>& table,
                                        const UnusedTensorFilter& unused);

}  // namespace flux2
