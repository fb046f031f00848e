// FP8 checkpoint layouts, scales and dequantization; see fp8_checkpoint.h.
// Tested by tests/host/fp8_checkpoint_test.cc and `flux2 check-golden --only fp8,fp8_pipeline`.
#include "model/fp8_checkpoint.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/base/parallel.h"
#include "kernels/base/status.h"

namespace flux2 {
namespace {

constexpr char kMetadataKey[] = "_quantization_metadata";
constexpr char kComfyQuant[] = ".comfy_quant";
constexpr char kScaledFp8Marker[] = "scaled_fp8";
constexpr char kE4M3Format[] = "float8_e4m3fn";

// The per-layer tensor suffixes of a layout.
struct ScaleNames {
  const char* weight;  // ".weight_scale" or ".scale_weight"
  const char* input;   // ".input_scale" or ".scale_input"
};
ScaleNames scale_names(Fp8Layout layout) {
  if (layout == Fp8Layout::kScaledFp8) return {".scale_weight", ".scale_input"};
  return {".weight_scale", ".input_scale"};
}

bool is_fp8(DType dtype) {
  return dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2;
}

absl::Status refuse(const Fp8Source& source, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(source.where, ": ", message));
}

// A layer the checkpoint says is quantized, before its tensors are checked.
struct LayerFormat {
  std::string format;           // e.g. "float8_e4m3fn"
  std::string declared_by;      // where the format came from, for errors
  bool full_precision = false;  // full_precision_matrix_mult
};

// Which layout's markers `source` carries; two layouts in one file, or F8 tensors without any
// marker, are refused.
absl::StatusOr<Fp8Layout> detect_layout(const Fp8Source& source) {
  std::vector<std::pair<Fp8Layout, std::string>> found;
  std::string comfy_quant, legacy, modern, fp8_weight;
  for (const auto& [name, ref] : *source.tensors) {
    if (absl::EndsWith(name, kComfyQuant) && comfy_quant.empty()) comfy_quant = name;
    if ((absl::EndsWith(name, ".scale_weight") || absl::EndsWith(name, ".scale_input") ||
         name == source.prefix + kScaledFp8Marker) &&
        legacy.empty())
      legacy = name;
    if ((absl::EndsWith(name, ".weight_scale") || absl::EndsWith(name, ".input_scale")) &&
        modern.empty())
      modern = name;
    if (is_fp8(ref.entry->dtype) && name != source.prefix + kScaledFp8Marker && fp8_weight.empty())
      fp8_weight = name;
  }
  if (source.modelopt) found.emplace_back(Fp8Layout::kModelOpt, "a ModelOpt quantization_config");
  if (source.metadata->count(kMetadataKey))
    found.emplace_back(Fp8Layout::kQuantMetadata, "__metadata__._quantization_metadata");
  if (!comfy_quant.empty()) found.emplace_back(Fp8Layout::kComfyQuant, comfy_quant);
  if (!legacy.empty()) found.emplace_back(Fp8Layout::kScaledFp8, legacy);
  if (found.size() > 1) {
    return refuse(source, absl::StrCat("mixes FP8 layouts: ", found[0].second, " (",
                                       fp8_layout_name(found[0].first), ") and ", found[1].second,
                                       " (", fp8_layout_name(found[1].first), ")"));
  }
  if (found.empty()) {
    if (fp8_weight.empty() && modern.empty()) return Fp8Layout::kNone;
    return refuse(source,
                  absl::StrCat("unknown FP8 layout: ", fp8_weight.empty() ? modern : fp8_weight,
                               " but no _quantization_metadata, comfy_quant, scaled_fp8 "
                               "marker or ModelOpt quantization_config"));
  }
  const Fp8Layout layout = found[0].first;
  if (layout == Fp8Layout::kScaledFp8 && !modern.empty()) {
    return refuse(source, absl::StrCat("mixes FP8 layouts: ", legacy, " (comfy_scaled_fp8) and ",
                                       modern, " (weight_scale / input_scale)"));
  }
  if (layout == Fp8Layout::kScaledFp8 && !source.tensors->count(source.prefix + kScaledFp8Marker)) {
    return refuse(source, absl::StrCat(legacy, ": ComfyUI scaled-fp8 scales without the ",
                                       source.prefix, kScaledFp8Marker, " marker"));
  }
  return layout;
}

// A layer's format from a JSON object {"format": ..., "full_precision_matrix_mult": ...}.
absl::StatusOr<LayerFormat> parse_layer_format(const Fp8Source& source, const nlohmann::json& json,
                                               const std::string& declared_by) {
  if (!json.is_object() || !json.contains("format") || !json["format"].is_string()) {
    return refuse(source, absl::StrCat(declared_by, ": no \"format\" string"));
  }
  LayerFormat format{json["format"].get<std::string>(), declared_by, false};
  if (json.contains("full_precision_matrix_mult")) {
    if (!json["full_precision_matrix_mult"].is_boolean()) {
      return refuse(source,
                    absl::StrCat(declared_by, ": full_precision_matrix_mult is not a boolean"));
    }
    format.full_precision = json["full_precision_matrix_mult"].get<bool>();
  }
  return format;
}

// The layers listed by __metadata__._quantization_metadata, by full layer name.
absl::StatusOr<std::map<std::string, LayerFormat>> metadata_layers(const Fp8Source& source) {
  const std::string where = "__metadata__._quantization_metadata";
  const nlohmann::json json =
      nlohmann::json::parse(source.metadata->at(kMetadataKey), nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("layers") || !json["layers"].is_object()) {
    return refuse(source, absl::StrCat(where, ": not a JSON object with a \"layers\" object"));
  }
  std::map<std::string, LayerFormat> layers;
  for (auto it = json["layers"].begin(); it != json["layers"].end(); ++it) {
    const std::string layer =
        absl::StartsWith(it.key(), source.prefix) ? it.key() : source.prefix + it.key();
    FLUX_ASSIGN_OR_RETURN(
        layers[layer],
        parse_layer_format(source, it.value(), absl::StrCat(where, " layer ", it.key())));
  }
  return layers;
}

// The layers with a <layer>.comfy_quant tensor (UTF-8 JSON in a U8 tensor), by full layer name.
absl::StatusOr<std::map<std::string, LayerFormat>> comfy_quant_layers(const Fp8Source& source) {
  std::map<std::string, LayerFormat> layers;
  for (const auto& [name, ref] : *source.tensors) {
    if (!absl::EndsWith(name, kComfyQuant)) continue;
    if (ref.entry->dtype != DType::kU8 || ref.entry->shape.size() != 1) {
      return refuse(source, absl::StrCat(name, " is ", dtype_name(ref.entry->dtype),
                                         shape_string(ref.entry->shape),
                                         ", expected a 1-D U8 tensor holding JSON"));
    }
    const std::string text(static_cast<const char*>(ref.data()),
                           static_cast<size_t>(ref.entry->bytes()));
    const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    const std::string layer = name.substr(0, name.size() - std::string(kComfyQuant).size());
    FLUX_ASSIGN_OR_RETURN(layers[layer], parse_layer_format(source, json, name));
  }
  return layers;
}

// Legacy scaled fp8 and ModelOpt name no formats: every F8 weight is a float8_e4m3fn layer.
std::map<std::string, LayerFormat> fp8_weight_layers(const Fp8Source& source, Fp8Layout layout) {
  std::map<std::string, LayerFormat> layers;
  bool full_precision = false;
  const std::string declared_by = layout == Fp8Layout::kModelOpt
                                      ? std::string("the ModelOpt quantization_config")
                                      : source.prefix + kScaledFp8Marker;
  if (layout == Fp8Layout::kScaledFp8) {
    const TensorRef& marker = source.tensors->at(source.prefix + kScaledFp8Marker);
    full_precision = shape_numel(marker.entry->shape) == 2;  // ComfyUI: no fp8 matrix mult
  }
  for (const auto& [name, ref] : *source.tensors) {
    if (!is_fp8(ref.entry->dtype) || !absl::EndsWith(name, ".weight")) continue;
    layers[name.substr(0, name.size() - 7)] = {kE4M3Format, declared_by, full_precision};
  }
  return layers;
}

// The values of a scale tensor as f32, checked: floating dtype, each finite and > 0.
absl::StatusOr<std::vector<float>> read_scale(const Fp8Source& source, const std::string& name,
                                              const TensorRef& ref) {
  const DType dtype = ref.entry->dtype;
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    return refuse(source, absl::StrCat(name, " has dtype ", dtype_name(dtype),
                                       ", expected F32, BF16 or F16"));
  }
  std::vector<float> values(static_cast<size_t>(shape_numel(ref.entry->shape)));
  widen_to_f32(dtype, ref.data(), static_cast<int64_t>(values.size()), values.data());
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i]) || values[i] <= 0.0f) {
      return refuse(source, absl::StrCat(name, "[", i, "] is ", values[i],
                                         ": a scale must be finite and > 0"));
    }
  }
  return values;
}

// The scales of quantized layer `layer` (its weight checked to be 2-D F8_E4M3).
absl::StatusOr<Fp8Scales> layer_scales(const Fp8Source& source, Fp8Layout layout,
                                       const std::string& layer, const LayerFormat& format,
                                       Fp8Layers& out) {
  if (format.format != kE4M3Format) {
    return refuse(source, absl::StrCat(format.declared_by, ": format \"", format.format, "\"",
                                       format.format == "float8_e5m2" ? " (E5M2)" : "",
                                       " is not supported (float8_e4m3fn only)"));
  }
  const std::string weight_name = layer + ".weight";
  auto weight = source.tensors->find(weight_name);
  if (weight == source.tensors->end()) {
    return refuse(source, absl::StrCat(format.declared_by, ": quantized layer ", layer,
                                       " has no tensor ", weight_name));
  }
  const SafetensorsEntry& w = *weight->second.entry;
  if (w.dtype == DType::kF8E5M2) {
    return refuse(source, absl::StrCat(weight_name,
                                       " is F8_E5M2; E5M2 checkpoints are not "
                                       "supported (float8_e4m3fn only)"));
  }
  if (w.dtype != DType::kF8E4M3 || w.shape.size() != 2) {
    return refuse(source,
                  absl::StrCat(weight_name, " is ", dtype_name(w.dtype), shape_string(w.shape),
                               ", but ", format.declared_by, " says it is a float8_e4m3fn matrix"));
  }
  const ScaleNames names = scale_names(layout);
  const std::string scale_name = layer + names.weight;
  auto scale = source.tensors->find(scale_name);
  if (scale == source.tensors->end())
    return refuse(source, absl::StrCat("quantized weight ", weight_name, " has no ", scale_name));
  const Shape& s = scale->second.entry->shape;
  const int64_t rows = w.shape[0];
  const bool per_tensor = s.empty();
  const bool per_row =
      (s.size() == 1 && s[0] == rows) || (s.size() == 2 && s[0] == rows && s[1] == 1);
  if (!per_tensor && !per_row) {
    return refuse(source, absl::StrCat(scale_name, " is ", shape_string(s), "; a weight scale of ",
                                       weight_name, " ", shape_string(w.shape), " is [], [", rows,
                                       "] or [", rows, ", 1]"));
  }
  Fp8Scales scales;
  scales.full_precision = format.full_precision;
  FLUX_ASSIGN_OR_RETURN(scales.weight, read_scale(source, scale_name, scale->second));
  out.side_tensors.insert(scale_name);
  const std::string input_name = layer + names.input;
  if (auto input = source.tensors->find(input_name); input != source.tensors->end()) {
    if (shape_numel(input->second.entry->shape) != 1) {
      return refuse(source,
                    absl::StrCat(input_name, " is ", shape_string(input->second.entry->shape),
                                 "; an input scale is one value"));
    }
    FLUX_ASSIGN_OR_RETURN(std::vector<float> value, read_scale(source, input_name, input->second));
    scales.input = value[0];
    out.side_tensors.insert(input_name);
  }
  return scales;
}

// Every F8 tensor must be a quantized layer's weight; E5M2 is refused by name.
absl::Status check_fp8_tensors(const Fp8Source& source, const Fp8Layers& layers) {
  for (const auto& [name, ref] : *source.tensors) {
    if (!is_fp8(ref.entry->dtype) || layers.side_tensors.count(name)) continue;
    if (ref.entry->dtype == DType::kF8E5M2) {
      return refuse(source, absl::StrCat(name,
                                         " is F8_E5M2; E5M2 checkpoints are not supported "
                                         "(float8_e4m3fn only)"));
    }
    if (!layers.scales.count(name)) {
      return refuse(source,
                    absl::StrCat(name, " is F8_E4M3 but no ", fp8_layout_name(layers.layout),
                                 " marker declares its layer quantized"));
    }
  }
  return absl::OkStatus();
}

// Scale tensors not consumed by a quantized layer: a bf16 layer's (ignored, counted), else
// refused.
absl::Status check_leftover_scales(const Fp8Source& source, Fp8Layers& layers) {
  const ScaleNames names = scale_names(layers.layout);
  for (const auto& [name, ref] : *source.tensors) {
    if (layers.side_tensors.count(name)) continue;
    for (const char* suffix : {names.weight, names.input}) {
      if (!absl::EndsWith(name, suffix)) continue;
      const std::string weight =
          name.substr(0, name.size() - std::string(suffix).size()) + ".weight";
      auto found = source.tensors->find(weight);
      if (found == source.tensors->end()) {
        return refuse(source, absl::StrCat(name, " scales no weight (no tensor ", weight, ")"));
      }
      if (is_fp8(found->second.entry->dtype)) {
        return refuse(source,
                      absl::StrCat(name, " belongs to ", weight, ", which no ",
                                   fp8_layout_name(layers.layout), " marker declares quantized"));
      }
      layers.side_tensors.insert(name);
      ++layers.ignored_scales;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view fp8_layout_name(Fp8Layout layout) {
  switch (layout) {
    case Fp8Layout::kNone:
      return "bf16";
    case Fp8Layout::kQuantMetadata:
      return "bfl_fp8";
    case Fp8Layout::kComfyQuant:
      return "comfy_fp8";
    case Fp8Layout::kScaledFp8:
      return "comfy_scaled_fp8";
    case Fp8Layout::kModelOpt:
      return "modelopt_fp8";
  }
  return "unknown";
}

absl::StatusOr<Fp8Layers> collect_fp8_layers(const Fp8Source& source) {
  Fp8Layers layers;
  FLUX_ASSIGN_OR_RETURN(layers.layout, detect_layout(source));
  std::map<std::string, LayerFormat> formats;
  switch (layers.layout) {
    case Fp8Layout::kNone:
      return layers;
    case Fp8Layout::kQuantMetadata: {
      FLUX_ASSIGN_OR_RETURN(formats, metadata_layers(source));
      break;
    }
    case Fp8Layout::kComfyQuant: {
      FLUX_ASSIGN_OR_RETURN(formats, comfy_quant_layers(source));
      for (const auto& [layer, format] : formats) layers.side_tensors.insert(layer + kComfyQuant);
      break;
    }
    case Fp8Layout::kScaledFp8: {
      const std::string marker = source.prefix + kScaledFp8Marker;
      if (source.tensors->at(marker).entry->dtype != DType::kF8E4M3) {
        return refuse(source, absl::StrCat(marker, " is ",
                                           dtype_name(source.tensors->at(marker).entry->dtype),
                                           ": only F8_E4M3 scaled fp8 is supported (E5M2 is not)"));
      }
      layers.side_tensors.insert(marker);
      formats = fp8_weight_layers(source, layers.layout);
      break;
    }
    case Fp8Layout::kModelOpt:
      formats = fp8_weight_layers(source, layers.layout);
      break;
  }
  for (const auto& [layer, format] : formats) {
    FLUX_ASSIGN_OR_RETURN(Fp8Scales scales,
                          layer_scales(source, layers.layout, layer, format, layers));
    layers.scales.emplace(layer + ".weight", std::move(scales));
  }
  FLUX_RETURN_IF_ERROR(check_fp8_tensors(source, layers));
  FLUX_RETURN_IF_ERROR(check_leftover_scales(source, layers));
  return layers;
}

absl::StatusOr<bool> modelopt_quantization(const nlohmann::json& config,
                                           const std::string& config_path) {
  if (!config.is_object() || !config.contains("quantization_config")) return false;
  const nlohmann::json& q = config["quantization_config"];
  const std::string method =
      q.is_object() && q.contains("quant_method") && q["quant_method"].is_string()
          ? q["quant_method"].get<std::string>()
          : "";
  const std::string algo = q.is_object() && q.contains("quant_algo") && q["quant_algo"].is_string()
                               ? q["quant_algo"].get<std::string>()
                               : "";
  if (method != "modelopt") {
    return absl::InvalidArgumentError(absl::StrCat(config_path,
                                                   ": quantization_config.quant_method \"", method,
                                                   "\" is not supported (modelopt FP8 only)"));
  }
  if (algo != "FP8") {
    return absl::InvalidArgumentError(absl::StrCat(config_path,
                                                   ": quantization_config.quant_algo \"", algo,
                                                   "\" is not supported (ModelOpt FP8 only)"));
  }
  return true;
}

ComponentWeights apply_fp8_layers(const ComponentWeights& folder, const Fp8Layers& layers) {
  struct Storage {
    ComponentWeights folder;  // keeps the files mapped
    std::deque<Fp8Scales> scales;
  };
  auto storage = std::make_shared<Storage>(Storage{folder, {}});
  std::map<std::string, TensorRef, std::less<>> tensors;
  for (const auto& [name, ref] : storage->folder.tensors()) {
    if (layers.side_tensors.count(name)) continue;
    TensorRef view = ref;
    if (auto found = layers.scales.find(name); found != layers.scales.end())
      view.fp8 = &storage->scales.emplace_back(found->second);
    tensors.emplace(name, view);
  }
  nlohmann::json config = folder.config();
  config.erase("quantization_config");
  return ComponentWeights::from_view(folder.dir(), std::move(config), folder.config_path(),
                                     std::move(tensors), std::move(storage));
}

namespace {

// Whether E4M3 code is one of the two NaN codes (0x7F, 0xFF): the only non-finite codes.
bool nan_code(uint8_t code) {
  return (code & 0x7f) == 0x7f;
}

// Why row `r` of `entry` cannot be dequantized with scale `s` (overflow or a NaN code), or OK.
absl::Status check_row(const SafetensorsEntry& entry, int64_t r, const uint8_t* row, int64_t cols,
                       float s) {
  if (!std::isfinite(kE4M3Max * s)) {
    return absl::InvalidArgumentError(
        absl::StrCat(entry.name, ": row ", r, "'s scale ", s, " overflows float32 times 448"));
  }
  const int64_t c = std::find_if(row, row + cols, nan_code) - row;
  if (c == cols) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(entry.name, ": element [", r, ", ", c, "] is an E4M3 NaN code"));
}

// An FP8 tensor as rows: its codes and each row's dequantization scale.
struct Fp8RowView {
  explicit Fp8RowView(const TensorRef& ref)
      : entry(*checked(ref).entry),
        scales(ref.fp8->weight),
        codes(static_cast<const uint8_t*>(ref.data())),
        rows(entry.shape[0]),
        cols(shape_numel(entry.shape) / std::max<int64_t>(rows, 1)) {
    FLUX_CHECK(scales.size() == 1 || static_cast<int64_t>(scales.size()) == rows);
  }
  static const TensorRef& checked(const TensorRef& ref) {
    FLUX_CHECK(ref.fp8 != nullptr && ref.entry->dtype == DType::kF8E4M3 &&
               !ref.entry->shape.empty());
    return ref;
  }
  float scale(int64_t r) const { return scales.size() == 1 ? scales[0] : scales[size_t(r)]; }
  const uint8_t* row(int64_t r) const { return codes + r * cols; }
  // Row r's error (check_row).
  absl::Status error(int64_t r) const { return check_row(entry, r, row(r), cols, scale(r)); }
  // Rows per parallel_for chunk: about 64 K codes.
  int64_t min_chunk_rows() const {
    return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(cols, 1));
  }

  const SafetensorsEntry& entry;
  const std::vector<float>& scales;
  const uint8_t* codes;
  int64_t rows, cols;
};

// first = min(first, r), atomically (the first bad row whatever the chunks' timing).
void lower_to(std::atomic<int64_t>& first, int64_t r) {
  int64_t seen = first.load();
  while (r < seen && !first.compare_exchange_weak(seen, r)) {
  }
}

}  // namespace

absl::StatusOr<std::vector<float>> dequantize_fp8(const TensorRef& ref) {
  const Fp8RowView v(ref);
  std::vector<float> values(static_cast<size_t>(v.rows * v.cols));
  // The rows of [begin, end), each chunk with its own code table; false at a bad row.
  auto dequantize_rows = [&](int64_t begin, int64_t end, int64_t* bad_row) {
    std::array<float, 256> table;  // code -> e4m3(code) * s, computed once per scale
    float table_scale = std::numeric_limits<float>::quiet_NaN();  // no table yet
    for (int64_t r = begin; r < end; ++r) {
      const float s = v.scale(r);
      if (!std::isfinite(kE4M3Max * s)) {
        *bad_row = r;
        return false;
      }
      if (s != table_scale) {
        for (int code = 0; code < 256; ++code)
          table[static_cast<size_t>(code)] = e4m3_to_f32(static_cast<uint8_t>(code)) * s;
        table_scale = s;
      }
      const uint8_t* row = v.row(r);
      float* out = values.data() + r * v.cols;
      bool nan = false;
      for (int64_t c = 0; c < v.cols; ++c) {
        nan |= nan_code(row[c]);
        out[c] = table[row[c]];
      }
      if (nan) {
        *bad_row = r;
        return false;
      }
    }
    return true;
  };
  // Rows on the host's threads; the first bad row in row order is reported whatever the chunks'
  // timing.
  std::atomic<int64_t> first_bad{v.rows};
  parallel_for(v.rows, v.min_chunk_rows(), [&](int64_t begin, int64_t end) {
    int64_t r = v.rows;
    if (!dequantize_rows(begin, end, &r)) lower_to(first_bad, r);
  });
  const int64_t bad = first_bad.load();
  if (bad < v.rows) return v.error(bad);
  return values;
}

absl::Status check_fp8_codes(const TensorRef& ref) {
  const Fp8RowView v(ref);
  // Rows on the host's threads; the first bad row in row order is reported.
  std::atomic<int64_t> first_bad{v.rows};
  parallel_for(v.rows, v.min_chunk_rows(), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end && r < first_bad.load(); ++r) {
      const uint8_t* row = v.row(r);
      if (std::isfinite(kE4M3Max * v.scale(r)) && std::none_of(row, row + v.cols, nan_code)) {
        continue;
      }
      lower_to(first_bad, r);
      return;
    }
  });
  const int64_t bad = first_bad.load();
  return bad == v.rows ? absl::OkStatus() : v.error(bad);
}

std::vector<float> fp8_row_scales(const TensorRef& ref) {
  FLUX_CHECK(ref.fp8 != nullptr && !ref.entry->shape.empty());
  const std::vector<float>& scale = ref.fp8->weight;
  if (scale.size() != 1) return scale;
  return std::vector<float>(static_cast<size_t>(ref.entry->shape[0]), scale[0]);
}

std::string describe_stored(const std::string& format, Fp8Layout layout, int64_t fp8_tensors,
                            int64_t checkpoint_bytes) {
  std::string text = format;
  if (layout != Fp8Layout::kNone) absl::StrAppend(&text, " (", fp8_tensors, " FP8 tensors");
  absl::StrAppend(&text, layout != Fp8Layout::kNone ? ", " : " (",
                  checkpoint_bytes >= 1e9
                      ? absl::StrFormat("%.3f GB as stored", checkpoint_bytes / 1e9)
                      : absl::StrFormat("%.1f MB as stored", checkpoint_bytes / 1e6));
  return text;
}

}  // namespace flux2
