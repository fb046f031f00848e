// --fp8-input-scale's names and start-up check; see fp8_input_scale.h.
// Tested by tests/host/fp8_input_scale_test.cc.
#include "model/fp8_input_scale.h"

#include "absl/strings/str_cat.h"
#include "model/checkpoint.h"

namespace flux2 {

absl::string_view fp8_input_scale_name(Fp8InputScale mode) {
  return mode == Fp8InputScale::kStatic ? "static" : "dynamic";
}

absl::StatusOr<Fp8InputScale> parse_fp8_input_scale(absl::string_view text) {
  if (text == "dynamic") return Fp8InputScale::kDynamic;
  if (text == "static") return Fp8InputScale::kStatic;
  return absl::InvalidArgumentError(
      absl::StrCat("--fp8-input-scale \"", text, "\": expected dynamic or static"));
}

int64_t count_input_scales(const ComponentWeights& weights) {
  int64_t count = 0;
  for (const auto& [name, ref] : weights.tensors()) {
    count += ref.fp8 != nullptr && ref.fp8->input.has_value();
  }
  return count;
}

absl::Status check_fp8_input_scale(Fp8InputScale mode, bool quality_high, bool fp8_transformer,
                                   absl::string_view transformer, int64_t input_scales) {
  if (mode == Fp8InputScale::kDynamic) return absl::OkStatus();
  if (!quality_high) {
    return absl::InvalidArgumentError(
        "--fp8-input-scale static: quality=high is not enabled, and static activation scales are "
        "what its FP8 GEMMs would use (enable quality=high, or leave the flag at dynamic)");
  }
  if (!fp8_transformer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fp8-input-scale static: the transformer checkpoint (", transformer,
        ") is bf16; static activation scales come from an FP8 checkpoint's input_scale tensors "
        "(--transformer-file with BFL's, ComfyUI's or a ModelOpt FP8 file)"));
  }
  if (input_scales == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fp8-input-scale static: the transformer checkpoint (", transformer,
        ") has no input_scale (or scale_input) for any quantized layer; use --fp8-input-scale "
        "dynamic"));
  }
  return absl::OkStatus();
}

}  // namespace flux2
