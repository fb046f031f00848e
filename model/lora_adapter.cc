// Reads a LoRA adapter file of any FLUX.2 layout into diffusers' per-module form; see
// lora_adapter.h and model/README.md "LoRA adapter layouts". Tested by
// tests/host/lora_adapter_test.cc.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/lora_adapter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include <pcre2.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "kernels/base/dtype.h"
#include "kernels/base/status.h"
#include "model/lora_key_names.h"
#include "model/lora_targets.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace flux2 {
namespace {

using lora_keys::GroupedKeys;
using lora_keys::kDiffusersPrefix;
using lora_keys::KeyGroup;
using lora_keys::Mapping;
using lora_keys::NameTables;
using lora_keys::SourceModule;
using lora_keys::Spelling;

template <typename... Parts>
absl::Status invalid(const Parts&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

// Refusals decided by key names alone: kinds of adapter we do not apply.
absl::Status refuse_unsupported_kinds(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    if (absl::StrContains(key, "lora_magnitude_vector") || absl::StrContains(key, "dora_scale")) {
      return invalid("DoRA (lora_magnitude_vector / dora_scale) is not supported");
    }
  }
  for (const std::string& key : keys) {
    if (absl::StrContains(key, "lokr_") || absl::StrContains(key, "hada_")) {
      return invalid("LoKr/LoHa (lokr_w1 / hada_w1_a) is not supported");
    }
  }
  for (const std::string& key : keys) {
    if ((absl::StrContains(key, "lora_B") || absl::StrContains(key, "lora_up")) &&
        absl::EndsWith(key, ".bias")) {
      return invalid("lora_B bias is not supported");
    }
  }
  for (const std::string& key : keys) {
    if (absl::StartsWith(key, "lora_te") || absl::StartsWith(key, "text_encoder")) {
      return invalid("text-encoder keys (", key,
                     ") are not supported: FLUX.2 adapters apply to the transformer only");
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// PEFT's LoraConfig from the header (__metadata__["lora_adapter_metadata"], keys "transformer.").

struct PeftConfig {
  bool present = false;
  int64_t r = 8;  // LoraConfig's defaults
  double lora_alpha = 8.0;
  nlohmann::ordered_json rank_pattern = nlohmann::ordered_json::object();
  nlohmann::ordered_json alpha_pattern = nlohmann::ordered_json::object();
  bool use_rslora = false;
};

absl::Status metadata_type_error(absl::string_view field, absl::string_view expected) {
  return invalid("lora_adapter_metadata: 'transformer.", field, "' is not ", expected);
}

absl::StatusOr<PeftConfig> parse_peft_config(const std::map<std::string, std::string>& metadata) {
  PeftConfig config;
  auto it = metadata.find("lora_adapter_metadata");
  if (it == metadata.end()) return config;
  const auto json = nlohmann::ordered_json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return invalid("lora_adapter_metadata is not a JSON object");
  config.present = true;
  auto field = [&](const char* name) -> const nlohmann::ordered_json* {
    auto found = json.find(absl::StrCat(kDiffusersPrefix, name));
    return found == json.end() || found->is_null() ? nullptr : &*found;
  };
  if (const auto* use_dora = field("use_dora"); use_dora != nullptr && *use_dora == true) {
    return invalid("DoRA (lora_magnitude_vector / dora_scale) is not supported");
  }
  if (const auto* lora_bias = field("lora_bias"); lora_bias != nullptr && *lora_bias == true) {
    return invalid("lora_B bias is not supported");
  }
  if (const auto* r = field("r")) {
    if (!r->is_number_integer() || r->get<int64_t>() <= 0) {
      return metadata_type_error("r", "a positive integer");
    }
    config.r = r->get<int64_t>();
  }
  if (const auto* alpha = field("lora_alpha")) {
    if (!alpha->is_number()) return metadata_type_error("lora_alpha", "a number");
    config.lora_alpha = alpha->get<double>();
  }
  if (const auto* rslora = field("use_rslora")) {
    if (!rslora->is_boolean()) return metadata_type_error("use_rslora", "a boolean");
    config.use_rslora = rslora->get<bool>();
  }
  for (auto [name, out] : {std::pair{"rank_pattern", &config.rank_pattern},
                           std::pair{"alpha_pattern", &config.alpha_pattern}}) {
    const auto* pattern = field(name);
    if (pattern == nullptr) continue;
    if (!pattern->is_object()) return metadata_type_error(name, "an object");
    for (const auto& [key, value] : pattern->items()) {
      if (!value.is_number()) return metadata_type_error(absl::StrCat(name, ".", key), "a number");
    }
    *out = *pattern;
  }
  return config;
}

// Whether Python's re.match(pattern, text) matches (PCRE2, anchored at the start; `$` as Python's).
// std::regex is avoided: GCC 12 warns inside it under the sanitizer build.
absl::StatusOr<bool> python_re_match(const std::string& pattern, const std::string& text) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_ANCHORED, &error, &error_offset, nullptr);
  if (code == nullptr) return absl::InvalidArgumentError("not a valid regex");
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code, nullptr);
  const int matched = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                                  0, data, nullptr);
  pcre2_match_data_free(data);
  pcre2_code_free(code);
  return matched >= 0;
}

// PEFT's get_pattern_key: the first key `k` of `pattern` with re.match(r"(.*\.)?(k)$", module).
absl::StatusOr<const nlohmann::ordered_json*> match_pattern(const nlohmann::ordered_json& pattern,
                                                            const std::string& module) {
  for (auto it = pattern.begin(); it != pattern.end(); ++it) {
    absl::StatusOr<bool> matched =
        python_re_match(absl::StrCat("(.*\\.)?(", it.key(), ")$"), module);
    if (!matched.ok()) {
      return invalid("lora_adapter_metadata: pattern '", it.key(), "' is not a valid regex");
    }
    if (*matched) return &*it;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Tensors.

struct Matrix {
  std::string key;
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<float> values;
  int64_t rows() const { return shape.size() == 2 ? shape[0] : -1; }
  int64_t cols() const { return shape.size() == 2 ? shape[1] : -1; }
};

absl::StatusOr<Matrix> read_tensor(const SafetensorsFile& file, const SafetensorsEntry& entry) {
  if (entry.dtype != DType::kF32 && entry.dtype != DType::kBF16 && entry.dtype != DType::kF16) {
    return invalid("'", entry.name, "' has dtype ", dtype_name(entry.dtype),
                   ": LoRA tensors must be F32, BF16 or F16");
  }
  Matrix matrix{entry.name, entry.dtype, entry.shape, {}};
  matrix.values.resize(static_cast<size_t>(shape_numel(entry.shape)));
  widen_to_f32(entry.dtype, file.data(entry), static_cast<int64_t>(matrix.values.size()),
               matrix.values.data());
  for (float value : matrix.values) {
    if (!std::isfinite(value)) return invalid("non-finite values in ", entry.name);
  }
  return matrix;
}

// `value` rounded to the nearest IEEE binary16 (ties to even), as float; beyond 65504 after
// rounding: infinity. Written out because clang 14 has no _Float16 on x86 (the fuzz build).
float round_to_f16(float value) {
  if (!std::isfinite(value) || value == 0.0f) return value;
  int exponent = 0;
  std::frexp(value, &exponent);  // |value| = m * 2^exponent, m in [0.5, 1)
  // 11 significant bits for normal halves; subnormals share the quantum of 2^-24.
  const int quantum_exponent = std::max(exponent - 11, -24);
  const float quantum = std::ldexp(1.0f, quantum_exponent);
  const float rounded = std::nearbyint(value / quantum) * quantum;  // exact scaling by 2^k
  return std::fabs(rounded) > 65504.0f ? std::copysign(INFINITY, value) : rounded;
}

// A value rounded to `dtype` as PyTorch stores a product computed in float (round to nearest even).
float round_to_dtype(float value, DType dtype) {
  if (dtype == DType::kBF16) return round_to_bf16(value);
  if (dtype == DType::kF16) return round_to_f16(value);
  return value;
}

// diffusers' kohya alpha baking: alpha/r split into scale_down * scale_up, scale_up a power of 2.
struct BakedScales {
  float down = 1.0f;  // as the multiplication reads it (float)
  float up = 1.0f;
};

// Non-qkv modules: scale = alpha.item() / r in Python doubles.
BakedScales kohya_scales_in_double(double scale) {
  double down = scale, up = 1.0;
  while (down * 2 < up) {
    down *= 2;
    up /= 2;
  }
  return {static_cast<float>(down), static_cast<float>(up)};
}

// qkv modules (_convert_to_ai_toolkit_cat): alpha stays a 0-dim tensor, so alpha / r is computed
// in the alpha tensor's dtype (Q6).
BakedScales kohya_scales_in_alpha_dtype(float alpha, DType alpha_dtype, int64_t rank) {
  float down = round_to_dtype(alpha / static_cast<float>(rank), alpha_dtype);
  double up = 1.0;
  while (static_cast<double>(down) * 2 < up) {
    down *= 2;
    up /= 2;
  }
  return {down, static_cast<float>(up)};
}

void bake(Matrix* matrix, float scale) {
  for (float& value : matrix->values) value = round_to_dtype(value * scale, matrix->dtype);
}

// Rows [row0, row0 + rows) and columns [col0, col0 + cols) of a row-major matrix.
std::vector<float> block(const Matrix& matrix, int64_t row0, int64_t rows, int64_t col0,
                         int64_t cols) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(rows * cols));
  for (int64_t r = row0; r < row0 + rows; ++r) {
    const float* row = matrix.values.data() + r * matrix.cols();
    out.insert(out.end(), row + col0, row + col0 + cols);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// One group into modules.

struct Deviations {
  bool swapped_final_adaln = false;  // Q1
  bool alpha_keys = false;           // Q3
  bool kohya_dropped = false;        // Q5
};

std::string group_label(const SourceModule& source) {
  std::string label = source.modules[0];
  for (size_t i = 1; i < source.modules.size(); ++i) {
    absl::StrAppend(&label, "/", source.modules[i].substr(source.modules[i].rfind('.') + 1));
  }
  return label;
}

// The shapes of a module's lora_A and lora_B (from the file's header) against the model's.
absl::Status check_shapes(const KeyGroup& group, const Shape& a, const Shape& b,
                          const NameTables& names, const LoraParseOptions& options) {
  const std::string label = group_label(*group.source);
  if (a.size() == 2 && b.size() == 2 && a[0] != b[1]) {
    return invalid("lora_A rank ", a[0], " != lora_B rank ", b[1], " at ", label);
  }
  int64_t out = 0;
  const int64_t in = names.targets.at(group.source->modules[0]).in_features;
  for (const std::string& module : group.source->modules) {
    out += names.targets.at(module).out_features;
  }
  if (a.size() != 2 || b.size() != 2 || a[1] != in || b[0] != out) {
    return invalid(label, ": lora_A ", shape_string(a), " / lora_B ", shape_string(b),
                   " do not fit [", out, ", ", in, "] (an adapter for another FLUX.2 variant?)");
  }
  if (a[0] == 0) return invalid("rank 0 at ", label, ": an adapted module needs rank >= 1");
  if (a[0] > options.max_rank) {
    return invalid("rank ", a[0], " at ", label, " exceeds --max-lora-rank ", options.max_rank);
  }
  return absl::OkStatus();
}

LoraModule make_module(const std::string& name, const NameTables& names, int64_t rank,
                       std::vector<float> a, std::vector<float> b) {
  LoraModule module;
  module.module = name;
  module.rank = rank;
  module.in_features = names.targets.at(name).in_features;
  module.out_features = names.targets.at(name).out_features;
  module.a = std::move(a);
  module.b = std::move(b);
  return module;
}

// Kohya's fused qkv: the "split qkv" form (block-diagonal up, rank r/3 each) or a shared down.
std::vector<LoraModule> split_kohya_qkv(const KeyGroup& group, const Matrix& down, const Matrix& up,
                                        const NameTables& names) {
  const int64_t rank = down.rows(), rows = up.rows() / 3;
  bool block_diagonal = rank % 3 == 0;
  for (int64_t i = 0; block_diagonal && i < 3; ++i) {
    for (int64_t j = 0; block_diagonal && j < 3; ++j) {
      if (i == j) continue;
      for (float value : block(up, i * rows, rows, j * rank / 3, rank / 3)) {
        if (value != 0.0f) block_diagonal = false;
      }
    }
  }
  std::vector<LoraModule> modules;
  for (int64_t i = 0; i < 3; ++i) {
    const std::string& name = group.source->modules[i];
    if (block_diagonal) {
      const int64_t r = rank / 3;
      modules.push_back(make_module(name, names, r, block(down, i * r, r, 0, down.cols()),
                                    block(up, i * rows, rows, i * r, r)));
    } else {
      modules.push_back(
          make_module(name, names, rank, down.values, block(up, i * rows, rows, 0, rank)));
    }
  }
  return modules;
}

// A kohya module with diffusers' alpha baking; alpha is then the rank (scaling 1).
std::vector<LoraModule> convert_kohya(const KeyGroup& group, Matrix down, Matrix up,
                                      const Matrix* alpha, const NameTables& names) {
  const int64_t rank = down.rows();
  const bool qkv = group.source->mapping == Mapping::kQkv;
  BakedScales scales;
  if (alpha == nullptr) {
    scales = kohya_scales_in_double(1.0);
  } else if (qkv) {
    scales = kohya_scales_in_alpha_dtype(alpha->values[0], alpha->dtype, rank);
  } else {
    scales = kohya_scales_in_double(static_cast<double>(alpha->values[0]) / rank);
  }
  bake(&down, scales.down);
  bake(&up, scales.up);
  std::vector<LoraModule> modules;
  if (qkv) {
    modules = split_kohya_qkv(group, down, up, names);
  } else {
    modules.push_back(make_module(group.source->modules[0], names, rank, std::move(down.values),
                                  std::move(up.values)));
  }
  if (group.source->mapping == Mapping::kSwapHalves) {
    std::vector<float>& b = modules[0].b;
    std::rotate(b.begin(), b.begin() + static_cast<int64_t>(b.size() / 2), b.end());
  }
  for (LoraModule& module : modules) module.alpha = static_cast<double>(module.rank);
  return modules;
}

// A lora_A / lora_B module (every layout but kohya): shared A and B's row thirds for BFL's qkv.
std::vector<LoraModule> convert_plain(const KeyGroup& group, Matrix a, Matrix b,
                                      const NameTables& names) {
  const int64_t rank = a.rows();
  std::vector<LoraModule> modules;
  if (group.source->mapping == Mapping::kQkv) {
    const int64_t rows = b.rows() / 3;
    for (int64_t i = 0; i < 3; ++i) {
      modules.push_back(make_module(group.source->modules[i], names, rank, a.values,
                                    block(b, i * rows, rows, 0, rank)));
    }
    return modules;
  }
  if (group.source->mapping == Mapping::kSwapHalves) {  // BFL shift|scale -> scale|shift (Q1)
    std::rotate(b.values.begin(), b.values.begin() + static_cast<int64_t>(b.values.size() / 2),
                b.values.end());
  }
  modules.push_back(
      make_module(group.source->modules[0], names, rank, std::move(a.values), std::move(b.values)));
  return modules;
}

// Alpha (and rank check) from an .alpha key, PEFT's config in the header, or alpha = rank.
absl::Status assign_alpha(const Matrix* alpha, const PeftConfig& peft, LoraModule* module) {
  module->alpha = static_cast<double>(module->rank);
  module->rslora = peft.use_rslora;
  if (peft.present) {
    int64_t rank = peft.r;
    FLUX_ASSIGN_OR_RETURN(const auto* rank_match, match_pattern(peft.rank_pattern, module->module));
    if (rank_match != nullptr) rank = rank_match->get<int64_t>();
    if (rank != module->rank) {
      return invalid(module->module, ": rank ", module->rank,
                     " differs from lora_adapter_metadata's rank ", rank);
    }
    module->alpha = peft.lora_alpha;
    FLUX_ASSIGN_OR_RETURN(const auto* alpha_match,
                          match_pattern(peft.alpha_pattern, module->module));
    if (alpha_match != nullptr) module->alpha = alpha_match->get<double>();
  }
  if (alpha != nullptr) module->alpha = static_cast<double>(alpha->values[0]);
  return absl::OkStatus();
}

absl::StatusOr<Matrix> read_alpha(const SafetensorsFile& file, const SafetensorsEntry& entry) {
  FLUX_ASSIGN_OR_RETURN(Matrix alpha, read_tensor(file, entry));
  if (alpha.values.size() != 1 || alpha.shape.size() > 1) {
    return invalid("'", entry.name, "' is ", shape_string(entry.shape), ": alpha must be a scalar");
  }
  // Zero or negative: no scaling to speak of, and kohya's baking (alpha/r halved into two factors
  // until one is below the other) would never end (found by tests/fuzz/fuzz_lora_adapter.cc).
  if (!(alpha.values[0] > 0.0f)) {
    return invalid("'", entry.name, "' is ", alpha.values[0], ": alpha must be positive");
  }
  return alpha;
}

absl::Status convert_group(const SafetensorsFile& file, const KeyGroup& group,
                           const NameTables& names, const PeftConfig& peft,
                           const LoraParseOptions& options, std::vector<LoraModule>* modules,
                           Deviations* deviations) {
  const bool down_up = group.spelling == Spelling::kDownUp;
  const char* a_name = down_up ? "lora_down" : "lora_A";
  const char* b_name = down_up ? "lora_up" : "lora_B";
  const std::string label = group_label(*group.source);
  if (group.a == nullptr && group.b == nullptr) {
    return invalid(label, ": alpha without lora_A / lora_B");
  }
  if (group.a == nullptr) return invalid(label, ": ", b_name, " without ", a_name);
  if (group.b == nullptr) return invalid(label, ": ", a_name, " without ", b_name);
  FLUX_ASSIGN_OR_RETURN(Matrix a, read_tensor(file, *group.a));
  FLUX_ASSIGN_OR_RETURN(Matrix b, read_tensor(file, *group.b));
  std::optional<Matrix> alpha;
  if (group.alpha != nullptr) {
    FLUX_ASSIGN_OR_RETURN(alpha, read_alpha(file, *group.alpha));
  }
  FLUX_RETURN_IF_ERROR(check_shapes(group, a.shape, b.shape, names, options));
  const Matrix* alpha_ptr = alpha ? &*alpha : nullptr;
  std::vector<LoraModule> converted;
  if (group.layout == LoraLayout::kKohya) {
    converted = convert_kohya(group, std::move(a), std::move(b), alpha_ptr, names);
    deviations->kohya_dropped |= group.source->kohya_dropped;
    // Finite factors whose product overflows the file's dtype (found by fuzz_lora_adapter).
    for (const LoraModule& module : converted) {
      auto finite = [](float v) { return std::isfinite(v); };
      if (!std::all_of(module.a.begin(), module.a.end(), finite) ||
          !std::all_of(module.b.begin(), module.b.end(), finite)) {
        return invalid("non-finite values in ", module.module, " once its alpha is baked in");
      }
    }
  } else {
    converted = convert_plain(group, std::move(a), std::move(b), names);
    for (LoraModule& module : converted) {
      FLUX_RETURN_IF_ERROR(assign_alpha(alpha_ptr, peft, &module));
    }
    deviations->alpha_keys |= alpha_ptr != nullptr;
  }
  deviations->swapped_final_adaln |= group.source->mapping == Mapping::kSwapHalves;
  for (LoraModule& module : converted) modules->push_back(std::move(module));
  return absl::OkStatus();
}

// PEFT's scaling at the largest |scale| a request may give must be a float32 number: an infinite
// one turns every product into inf or NaN (a black image), whatever the request.
absl::Status check_scaling(const LoraModule& module, double max_scale) {
  if (std::isfinite(module.scaling(max_scale))) return absl::OkStatus();
  return invalid(module.module, ": lora_alpha ", module.alpha, " over rank ", module.rank,
                 module.rslora ? "'s square root (rsLoRA)" : "", " at |scale| ", max_scale,
                 " is not a finite float32 scaling");
}

// Unknown keys are refused; but a FLUX.1 adapter says so first, and the modules the model does
// have are checked next (their shapes, and so their ranks too): an adapter for a larger variant
// (klein-9B on klein-4B) has both more blocks and wider matrices, and the shapes name the mismatch.
absl::Status refuse_unknown_keys(const GroupedKeys& grouped, const NameTables& names,
                                 const LoraParseOptions& options) {
  if (grouped.unknown.empty()) return absl::OkStatus();
  FLUX_RETURN_IF_ERROR(lora_keys::flux1_keys_error(grouped.unknown));
  for (const KeyGroup& group : grouped.groups) {
    if (group.a != nullptr && group.b != nullptr) {
      FLUX_RETURN_IF_ERROR(check_shapes(group, group.a->shape, group.b->shape, names, options));
    }
  }
  return lora_keys::unknown_keys_error(grouped.unknown);
}

std::vector<std::string> deviation_phrases(LoraLayout layout, const Deviations& found) {
  std::vector<std::string> phrases;
  if (found.swapped_final_adaln) {
    phrases.push_back("final_layer.adaLN_modulation.1 B halves swapped to scale|shift (Q1)");
  }
  if (layout == LoraLayout::kBflDownUp) {
    phrases.push_back("diffusion_model. lora_down/lora_up loaded with alpha/r (Q2)");
  }
  if (found.alpha_keys && layout != LoraLayout::kBflDownUp) {
    phrases.push_back(".alpha keys read as lora_alpha (Q3)");
  }
  if (layout == LoraLayout::kBareBfl || layout == LoraLayout::kBareDiffusers) {
    phrases.push_back("keys without a prefix loaded (Q4)");
  }
  if (found.kohya_dropped) {
    phrases.push_back("kohya modulation / guidance_in / final adaLN loaded (Q5)");
  }
  return phrases;
}

}  // namespace

const char* lora_layout_name(LoraLayout layout) {
  switch (layout) {
    case LoraLayout::kDiffusers:
      return "diffusers";
    case LoraLayout::kBfl:
      return "bfl";
    case LoraLayout::kFal:
      return "fal";
    case LoraLayout::kKohya:
      return "kohya";
    case LoraLayout::kBflDownUp:
      return "bfl_down_up";
    case LoraLayout::kBareBfl:
      return "bare_bfl";
    case LoraLayout::kBareDiffusers:
      return "bare_diffusers";
    case LoraLayout::kDiffusersNames:
      return "diffusers_names";
  }
  return "unknown";
}

float LoraModule::scaling(double weight) const {
  const double divisor = rslora ? std::sqrt(static_cast<double>(rank)) : static_cast<double>(rank);
  return static_cast<float>((weight * alpha) / divisor);
}

int64_t LoraAdapter::max_rank() const {
  int64_t rank = 0;
  for (const LoraModule& module : modules) rank = std::max(rank, module.rank);
  return rank;
}

int64_t LoraAdapter::values() const {
  int64_t count = 0;
  for (const LoraModule& module : modules) {
    count += static_cast<int64_t>(module.a.size() + module.b.size());
  }
  return count;
}

absl::StatusOr<LoraAdapter> parse_lora_adapter(std::span<const uint8_t> file,
                                               const Flux2Config& config,
                                               const LoraParseOptions& options) {
  auto tensors = SafetensorsFile::from_bytes(file, "");
  if (!tensors.ok()) return invalid("not a safetensors file (", tensors.status().message(), ")");
  std::vector<std::string> keys;
  for (const SafetensorsEntry& entry : (*tensors)->entries()) keys.push_back(entry.name);
  std::sort(keys.begin(), keys.end());
  if (keys.empty()) return invalid("no LoRA tensors in the file");
  FLUX_RETURN_IF_ERROR(refuse_unsupported_kinds(keys));
  FLUX_ASSIGN_OR_RETURN(const PeftConfig peft, parse_peft_config((*tensors)->metadata()));
  const NameTables names = lora_keys::make_name_tables(config);
  FLUX_ASSIGN_OR_RETURN(const GroupedKeys grouped, lora_keys::group_keys(**tensors, keys, names));
  FLUX_RETURN_IF_ERROR(refuse_unknown_keys(grouped, names, options));
  const std::vector<KeyGroup>& groups = grouped.groups;
  FLUX_RETURN_IF_ERROR(lora_keys::check_one_layout(groups));

  LoraAdapter adapter;
  adapter.layout = groups[0].layout;
  Deviations deviations;
  std::map<std::string, std::string> stem_of_module;
  for (const KeyGroup& group : groups) {
    const size_t first = adapter.modules.size();
    FLUX_RETURN_IF_ERROR(
        convert_group(**tensors, group, names, peft, options, &adapter.modules, &deviations));
    for (size_t i = first; i < adapter.modules.size(); ++i) {
      auto [it, inserted] = stem_of_module.emplace(adapter.modules[i].module, group.stem);
      if (!inserted) {
        return invalid(it->first, " given twice ('", it->second, "', '", group.stem, "')");
      }
    }
  }
  std::sort(adapter.modules.begin(), adapter.modules.end(),
            [](const LoraModule& x, const LoraModule& y) { return x.module < y.module; });
  for (const LoraModule& module : adapter.modules) {
    FLUX_RETURN_IF_ERROR(check_scaling(module, options.max_scale));
  }
  adapter.deviations = deviation_phrases(adapter.layout, deviations);
  return adapter;
}

}  // namespace flux2
