// --fp8-input-scale: how quality=high's FP8 GEMMs scale the activations of an FP8 checkpoint's
// stored weights, per token from each row's own amax (dynamic, the default) or per tensor with
// the checkpoint's calibrated input_scale (static, as ModelOpt / TensorRT serve these files), and
// the start-up check of the static mode. Tested by tests/host/fp8_input_scale_test.cc.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flux2 {

struct ComponentWeights;  // model/checkpoint.h

// Which activation scales quality=high's FP8 GEMMs use (model/README.md, "FP8 checkpoints").
enum class Fp8InputScale : uint8_t {
  kDynamic,  // "dynamic": every activation row under its own scale amax / 448 (per token)
  kStatic,   // "static": a stored FP8 weight whose checkpoint has an input_scale quantizes its
             // activation per tensor under it, codes e4m3(x / input_scale); weights without one
             // stay dynamic
};
// "dynamic" / "static"; parse_fp8_input_scale reads them back (InvalidArgument naming the flag).
absl::string_view fp8_input_scale_name(Fp8InputScale mode);
absl::StatusOr<Fp8InputScale> parse_fp8_input_scale(absl::string_view text);

// The quantized (F8_E4M3) tensors of `weights` that carry a static activation scale.
int64_t count_input_scales(const ComponentWeights& weights);

// --fp8-input-scale `mode` against what is loaded, before the weights are: static is refused
// (InvalidArgument naming the flag) without quality=high (`quality_high`), for a bf16 transformer
// (`fp8_transformer` false; `transformer` names its format, e.g. "diffusers" or "comfy_fp8") and
// for an FP8 one whose quantized tensors carry no input scale (`input_scales`,
// count_input_scales). Dynamic is always OK.
absl::Status check_fp8_input_scale(Fp8InputScale mode, bool quality_high, bool fp8_transformer,
                                   absl::string_view transformer, int64_t input_scales);

}  // namespace flux2
