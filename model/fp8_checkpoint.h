// FP8 transformer checkpoints as people download them (model/README.md, "FP8 checkpoints"): the
// layout of a file's quantization (BFL's _quantization_metadata, ComfyUI's comfy_quant and legacy
// scaled_fp8, ModelOpt's quantization_config), every quantized layer's scales, checked against the
// tensors they scale, and dequantization W = float(W8) * scale. Tested by
// tests/host/fp8_checkpoint_test.cc and `flux2 check-golden --only fp8,fp8_pipeline`.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/checkpoint.h"
#include "nlohmann/json.hpp"

namespace flux2 {

// How a checkpoint marks its quantized layers. Every layout stores F8_E4M3 weights with F32 scales.
enum class Fp8Layout : uint8_t {
  kNone,           // no quantized tensor: a bf16 (or f16/f32) checkpoint
  kQuantMetadata,  // "bfl_fp8": __metadata__["_quantization_metadata"] lists the layers (BFL's
                   // FLUX.2-klein-*-fp8 files; ComfyUI's header form), <layer>.weight_scale
  kComfyQuant,     // "comfy_fp8": a <layer>.comfy_quant U8 tensor holding the layer's JSON format
                   // (ComfyUI's mixed-precision files), <layer>.weight_scale
  kScaledFp8,      // "comfy_scaled_fp8": ComfyUI's legacy scaled_fp8 marker, <layer>.scale_weight
  kModelOpt,       // "modelopt_fp8": config.json quantization_config {quant_method: modelopt,
                   // quant_algo: FP8}, diffusers names, <module>.weight_scale
};

// "bf16", "bfl_fp8", "comfy_fp8", "comfy_scaled_fp8", "modelopt_fp8".
absl::string_view fp8_layout_name(Fp8Layout layout);

// The tensors of one checkpoint, as collect_fp8_layers reads them.
struct Fp8Source {
  const std::map<std::string, TensorRef, std::less<>>* tensors = nullptr;  // every tensor
  const std::map<std::string, std::string>* metadata = nullptr;  // safetensors __metadata__
  std::string prefix;     // before every layer name ("model.diffusion_model." or "")
  std::string where;      // the file or directory, first in every error
  bool modelopt = false;  // config.json declares ModelOpt FP8 (modelopt_quantization)
};

// The quantized layers of a checkpoint.
struct Fp8Layers {
  Fp8Layout layout = Fp8Layout::kNone;
  std::map<std::string, Fp8Scales> scales;  // weight tensor name (as in the file) -> its scales
  // Tensors that are not weights: scales, comfy_quant, the scaled_fp8 marker, and the scales of
  // layers the file keeps in bf16 (BFL's files carry some; they are ignored).
  std::set<std::string> side_tensors;
  int64_t ignored_scales = 0;  // of those, scales of layers stored in bf16
};

// Finds the layout of `source` and every quantized layer's scales. Refused (InvalidArgument,
// naming the tensor or marker): markers of two layouts in one file; F8 tensors without any marker;
// E5M2 weights or markers, and layer formats other than float8_e4m3fn (nvfp4, mxfp8, ...); a
// quantized layer whose weight is not a 2-D F8_E4M3 tensor, or an F8 weight no marker covers; a
// weight scale missing, not F32/BF16/F16, shaped other than [], [N] or [N, 1] (N: the weight's
// rows), non-finite or <= 0; an input scale with more than one value; a scale of no weight.
absl::StatusOr<Fp8Layers> collect_fp8_layers(const Fp8Source& source);

// Whether the component config `config` (from `config_path`) declares ModelOpt FP8 weights
// (quantization_config.quant_method "modelopt", quant_algo "FP8"); any other quantization_config
// (another method, NVFP4, ...) is refused naming it.
absl::StatusOr<bool> modelopt_quantization(const nlohmann::json& config,
                                           const std::string& config_path);

// `folder` (a diffusers transformer/ directory) with its FP8 layers applied: the side tensors
// dropped, each quantized weight's TensorRef carrying its Fp8Scales; its config without
// quantization_config. Keeps `folder`'s files mapped.
ComponentWeights apply_fp8_layers(const ComponentWeights& folder, const Fp8Layers& layers);

// The weight `ref` (F8_E4M3 with ref.fp8 set) as f32: float(W8[r, c]) * scale[r or 0], exact in
// f32 up to the product's one rounding (what PyTorch's W8.float() * scale gives). A NaN code or a
// non-finite product is refused naming the tensor.
absl::StatusOr<std::vector<float>> dequantize_fp8(const TensorRef& ref);

// The checks dequantize_fp8 makes, without dequantizing: for a weight kept as stored (E4M3 codes
// on the device, Weight::stored_fp8). A NaN code or a row whose scale times 448 overflows is
// refused naming the tensor and the element.
absl::Status check_fp8_codes(const TensorRef& ref);

// The scale of each of ref's rows (a per-tensor scale repeated), for a stored FP8 weight.
std::vector<float> fp8_row_scales(const TensorRef& ref);

// A checkpoint file's start-up description without its closing parenthesis: "bfl_fp8 (120 FP8
// tensors, 3.870 GB as stored" (no FP8 count for a bf16 file), for the format's describe().
std::string describe_stored(const std::string& format, Fp8Layout layout, int64_t fp8_tensors,
                            int64_t checkpoint_bytes);

}  // namespace flux2
