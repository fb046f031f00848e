// The tensor table and the loader it drives: one WeightSpec per checkpoint tensor
// says its name, expected shape and where it goes on the backend. The same table validates the
// checkpoint (missing / unexpected / mis-shaped tensors, all listed in one error), sizes the
// device allocations, counts the bytes and uploads. Tested by tests/host/checkpoint_test.cc.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/checkpoint.h"
#include "model/fp8_input_scale.h"

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

// What register_low_precision_weights registered.
struct LowPrecisionReport {
  int64_t device_bytes = 0;   // the low-precision copies' bytes on the device
  int64_t gemms = 0;          // weights registered: one FP8 GEMM each (a fused target once)
  int64_t static_scaled = 0;  // of them, with the checkpoint's static activation scale
};

// quality=high: registers a low-precision copy of every FP8-eligible weight of `table` (one per
// fused target) with `backend`, stored in the spec's Weight. With Fp8InputScale::kStatic, a
// stored FP8 weight with an input_scale (Weight::input_scale) is registered with it (its GEMMs
// quantize their activation per tensor under it); every other weight is per token.
absl::StatusOr<LowPrecisionReport> register_low_precision_weights(
    Backend& backend, const std::vector<WeightSpec>& table,
    Fp8InputScale input_scale = Fp8InputScale::kDynamic);

// Where load_weights puts an FP8 checkpoint's FP8-eligible projections (WeightSpec::fp8).
enum class Fp8Placement : uint8_t {
  kDequantized,  // the weight dtype, dequantized on the host at load (every other tensor too)
  kStored,       // as the file stores them: E4M3 codes and f32 row scales (Weight::stored_fp8)
};

// The Weights of `table` that load_weights keeps stored under Fp8Placement::kStored: FP8-eligible
// targets every part of which the checkpoint stores as F8_E4M3 with scales and without
// full_precision_matrix_mult (a fused q | k | v with one bf16 part is dequantized).
std::set<const Weight*> stored_fp8_weights(const ComponentWeights& checkpoint,
                                           const std::vector<WeightSpec>& table);

// The device bytes load_weights allocates for `table` with `stored` kept as E4M3 (1 byte per
// value plus a 4-byte scale per row) and the rest at `value_bytes` per value (the memory plan).
WeightBytes planned_weight_bytes(const std::vector<WeightSpec>& table,
                                 const std::set<const Weight*>& stored, int64_t value_bytes);

// Validates, allocates each target (rows = the rows its specs fill), and uploads with dtype
// conversion to backend.weight_dtype(). An FP8 checkpoint tensor (TensorRef::fp8) is dequantized
// to f32 first (dequantize_fp8, model/fp8_checkpoint.h), one tensor at a time; with
// Fp8Placement::kStored the stored_fp8_weights keep their codes (checked by check_fp8_codes) and
// row scales instead, and their Weight::input_scale: the largest of their parts' input scales (a
// fused q | k | v quantizes one activation; ModelOpt's separately calibrated q, k and v see the
// same input, and vLLM takes the max too), none when a part has none.
absl::StatusOr<LoadReport> load_weights(Backend& backend, const ComponentWeights& checkpoint,
                                        const std::vector<WeightSpec>& table,
                                        const UnusedTensorFilter& unused,
                                        Fp8Placement placement = Fp8Placement::kDequantized);

// The static activation scale allocate_random_stored_fp8 gives every stored weight: an
// activation amax of 8 (kRandomActivationAmax / 448, ModelOpt's calibration formula), about what
// the random transformer's normalized activations reach; larger values saturate at ±448, which
// `flux2 bench --fp8-input-scale static` times the same.
constexpr float kRandomActivationAmax = 8.0f;

// create_random for an FP8 checkpoint's form: the FP8-eligible targets of `table` as stored FP8
// weights (random E4M3 codes, row scales giving fill_random_weights' range, and the input scale
// kRandomActivationAmax / 448, as BFL's files carry one per layer), the rest allocated and filled
// as fill_random_weights does. Returns the device bytes allocated.
absl::StatusOr<int64_t> allocate_random_stored_fp8(Backend& backend,
                                                   const std::vector<WeightSpec>& table,
                                                   uint64_t seed);

// What dequantize_stored_weights changed.
struct DequantizedBytes {
  int64_t values = 0;  // the weight-dtype values it allocated
  int64_t stored = 0;  // the codes and row scales the weights no longer hold
};

// The stored FP8 weights of `table` (Weight::stored_fp8) given their values in the weight dtype,
// dequantized on the backend one at a time (Backend::weight_values: the bits host dequantization
// gives); the codes are freed unless a low-precision copy shares them: --fp8-lossless=resident.
absl::StatusOr<DequantizedBytes> dequantize_stored_weights(Backend& backend,
                                                           const std::vector<WeightSpec>& table);

}  // namespace flux2
