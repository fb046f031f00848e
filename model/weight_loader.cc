// Tensor-table driven validation and upload; see weight_loader.h.
// Tested by tests/host/checkpoint_test.cc.
#include "model/weight_loader.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/base/status.h"
#include "kernels/base/uniform_hash.h"
#include "model/fp8_checkpoint.h"

namespace flux2 {

std::string list_names(const std::vector<std::string>& names) {
  constexpr size_t kMaxListedNames = 20;
  std::vector<std::string> shown(names.begin(),
                                 names.begin() + std::min(names.size(), kMaxListedNames));
  std::string text = absl::StrJoin(shown, ", ");
  if (names.size() > kMaxListedNames)
    absl::StrAppend(&text, ", and ", names.size() - kMaxListedNames, " more");
  return text;
}

namespace {

Shape target_shape(const WeightSpec& spec) {
  if (spec.layout == WeightLayout::kConvToOhwi && spec.shape.size() == 4) {
    return Shape{spec.shape[0], spec.shape[2], spec.shape[3], spec.shape[1]};
  }
  return spec.shape;
}

// [O, I, kh, kw] -> [O, kh, kw, I], element size `elem` bytes.
std::vector<char> to_ohwi(const char* src, const Shape& shape, int elem) {
  const int64_t o = shape[0], i = shape[1], kh = shape[2], kw = shape[3];
  std::vector<char> out(static_cast<size_t>(o * i * kh * kw * elem));
  for (int64_t a = 0; a < o; ++a)
    for (int64_t b = 0; b < i; ++b)
      for (int64_t y = 0; y < kh; ++y)
        for (int64_t x = 0; x < kw; ++x)
          std::memcpy(&out[static_cast<size_t>((((a * kh + y) * kw + x) * i + b) * elem)],
                      src + (((a * i + b) * kh + y) * kw + x) * elem, static_cast<size_t>(elem));
  return out;
}

}  // namespace

absl::Status validate_weights(const ComponentWeights& checkpoint,
                              const std::vector<WeightSpec>& table,
                              const UnusedTensorFilter& unused) {
  std::vector<std::string> missing, misshaped, unexpected;
  std::set<absl::string_view> wanted;
  for (const WeightSpec& spec : table) {
    wanted.insert(spec.name);
    const TensorRef* ref = checkpoint.find(spec.name);
    if (ref == nullptr) {
      missing.push_back(spec.name);
    } else if (ref->entry->shape != spec.shape) {
      misshaped.push_back(absl::StrCat(spec.name, " is ", shape_string(ref->entry->shape),
                                       ", expected ", shape_string(spec.shape)));
    } else if (ref->entry->dtype != DType::kBF16 && ref->entry->dtype != DType::kF32 &&
               ref->entry->dtype != DType::kF16 &&
               !(ref->entry->dtype == DType::kF8E4M3 && ref->fp8 != nullptr)) {
      misshaped.push_back(absl::StrCat(spec.name, " has dtype ", dtype_name(ref->entry->dtype),
                                       ref->entry->dtype == DType::kF8E4M3
                                           ? " without scales (not an FP8 checkpoint layout)"
                                           : "",
                                       ", expected BF16, F16 or F32"));
    }
  }
  for (const auto& [name, ref] : checkpoint.tensors()) {
    if (!wanted.count(name) && !(unused && unused(name))) unexpected.push_back(name);
  }
  if (missing.empty() && misshaped.empty() && unexpected.empty()) return absl::OkStatus();
  std::string message =
      absl::StrCat(checkpoint.dir(), ": checkpoint does not match ", checkpoint.config_path());
  if (!missing.empty()) absl::StrAppend(&message, "; missing tensors: ", list_names(missing));
  if (!misshaped.empty()) absl::StrAppend(&message, "; wrong shape: ", list_names(misshaped));
  if (!unexpected.empty())
    absl::StrAppend(&message, "; unexpected tensors: ", list_names(unexpected));
  return absl::InvalidArgumentError(message);
}

absl::StatusOr<LowPrecisionReport> register_low_precision_weights(
    Backend& backend, const std::vector<WeightSpec>& table, Fp8InputScale input_scale) {
  LowPrecisionReport report;
  std::set<Weight*> registered;  // fused targets (q | k | v) appear once per part
  for (const WeightSpec& spec : table) {
    if (spec.fp8 == nullptr || !registered.insert(spec.fp8).second) continue;
    Weight& w = *spec.fp8;
    if (w.stored_fp8()) {  // an FP8 checkpoint's codes and scales, as they are
      const std::optional<float> scale =
          input_scale == Fp8InputScale::kStatic ? w.input_scale : std::nullopt;
      FLUX_ASSIGN_OR_RETURN(w.low_precision,
                            backend.add_stored_fp8_weight(w.tensor, w.row_scales, scale));
      report.static_scaled += scale.has_value();
    } else {
      FLUX_ASSIGN_OR_RETURN(w.low_precision, backend.add_fp8_weight(w.tensor));
    }
    report.device_bytes += w.low_precision->device_bytes();
    ++report.gemms;
  }
  FLUX_RETURN_IF_ERROR(backend.synchronize());
  return report;
}

WeightBytes planned_weight_bytes(const std::vector<WeightSpec>& table, int64_t value_bytes) {
  WeightBytes bytes;
  for (const WeightSpec& spec : table) {
    (spec.host ? bytes.host : bytes.device) += shape_numel(spec.shape) * value_bytes;
  }
  return bytes;
}

absl::StatusOr<WeightBytes> allocate_weights(Backend& backend,
                                             const std::vector<WeightSpec>& table) {
  // Size every target from the specs that fill it: rows add up, the rest must agree.
  std::map<Tensor*, Shape> shapes;
  std::set<Tensor*> host;
  for (const WeightSpec& spec : table) {
    if (spec.host) host.insert(spec.target);
    const Shape piece = target_shape(spec);
    auto [it, inserted] = shapes.emplace(spec.target, piece);
    if (!inserted) {
      Shape& shape = it->second;
      FLUX_CHECK(shape.size() == piece.size() &&
                 std::equal(shape.begin() + 1, shape.end(), piece.begin() + 1));
      shape[0] += piece[0];
    }
  }
  WeightBytes bytes;
  for (auto& [target, shape] : shapes) {
    const bool on_host = host.count(target) != 0;
    FLUX_ASSIGN_OR_RETURN(*target, on_host ? backend.empty_host(backend.weight_dtype(), shape)
                                           : backend.empty(backend.weight_dtype(), shape));
    (on_host ? bytes.host : bytes.device) += target->bytes();
  }
  return bytes;
}

absl::StatusOr<int64_t> allocate_device_weights(Backend& backend,
                                                const std::vector<WeightSpec>& table) {
  FLUX_ASSIGN_OR_RETURN(const WeightBytes bytes, allocate_weights(backend, table));
  return bytes.device + bytes.host;
}

absl::Status fill_random_weights(Backend& backend, const std::vector<WeightSpec>& table,
                                 uint64_t seed) {
  std::set<Tensor*> filled;
  for (const WeightSpec& spec : table) {
    if (!filled.insert(spec.target).second) continue;
    const Tensor& t = *spec.target;
    const float scale =
        t.rank() >= 2 ? 1.0f / std::sqrt(static_cast<float>(t.numel() / t.dim(0))) : 1.0f;
    FLUX_RETURN_IF_ERROR(backend.fill_uniform(t, seed + filled.size(), scale));
  }
  return backend.synchronize();
}

std::set<const Weight*> stored_fp8_weights(const ComponentWeights& checkpoint,
                                           const std::vector<WeightSpec>& table) {
  std::set<const Weight*> stored, dequantized;
  for (const WeightSpec& spec : table) {
    if (spec.fp8 == nullptr) continue;
    const TensorRef* ref = checkpoint.find(spec.name);
    const bool keep = ref != nullptr && ref->fp8 != nullptr &&
                      ref->entry->dtype == DType::kF8E4M3 && !ref->fp8->full_precision &&
                      spec.layout == WeightLayout::kAsIs && !spec.host && spec.shape.size() == 2;
    (keep ? stored : dequantized).insert(spec.fp8);
  }
  for (const Weight* w : dequantized) stored.erase(w);  // every part of a fused target, or none
  return stored;
}

WeightBytes planned_weight_bytes(const std::vector<WeightSpec>& table,
                                 const std::set<const Weight*>& stored, int64_t value_bytes) {
  WeightBytes bytes;
  for (const WeightSpec& spec : table) {
    const bool fp8 = spec.fp8 != nullptr && stored.count(spec.fp8) != 0;
    const int64_t values = shape_numel(spec.shape);
    (spec.host ? bytes.host : bytes.device) +=
        fp8 ? values * dtype_size(DType::kF8E4M3) + spec.shape[0] * dtype_size(DType::kF32)
            : values * value_bytes;
  }
  return bytes;
}

namespace {

// Allocates each stored weight's E4M3 codes and f32 row scales (rows = the rows its specs fill).
absl::StatusOr<int64_t> allocate_stored_weights(Backend& backend,
                                                const std::vector<WeightSpec>& table,
                                                const std::set<const Weight*>& stored) {
  std::map<Weight*, Shape> shapes;
  for (const WeightSpec& spec : table) {
    if (spec.fp8 == nullptr || stored.count(spec.fp8) == 0) continue;
    auto [it, inserted] = shapes.emplace(spec.fp8, spec.shape);
    if (!inserted) {
      FLUX_CHECK(it->second[1] == spec.shape[1]);
      it->second[0] += spec.shape[0];
    }
  }
  int64_t bytes = 0;
  for (auto& [w, shape] : shapes) {
    FLUX_ASSIGN_OR_RETURN(w->tensor, backend.empty(DType::kF8E4M3, shape));
    FLUX_ASSIGN_OR_RETURN(w->row_scales, backend.empty(DType::kF32, {shape[0]}));
    bytes += w->tensor.bytes() + w->row_scales.bytes();
  }
  return bytes;
}

// Uploads one spec's stored codes and row scales into rows [target_row, ...) of its weight.
absl::Status upload_stored(Backend& backend, const WeightSpec& spec, const TensorRef& ref) {
  FLUX_RETURN_IF_ERROR(check_fp8_codes(ref));
  const int64_t rows = spec.shape[0];
  const std::vector<float> scales = fp8_row_scales(ref);
  FLUX_RETURN_IF_ERROR(backend.upload(ref.data(), DType::kF8E4M3,
                                      spec.fp8->tensor.row_slice(spec.target_row, rows)));
  const Tensor scale_column = spec.fp8->row_scales.reshape(Shape{spec.fp8->row_scales.numel(), 1});
  return backend.upload(scales.data(), DType::kF32, scale_column.row_slice(spec.target_row, rows));
}

// Each stored weight's Weight::input_scale: the largest of its parts' input scales, none when a
// part has none (load_weights).
void assign_input_scales(const ComponentWeights& checkpoint, const std::vector<WeightSpec>& table,
                         const std::set<const Weight*>& stored) {
  std::set<Weight*> without;  // a part has no input scale
  for (const WeightSpec& spec : table) {
    if (spec.fp8 == nullptr || stored.count(spec.fp8) == 0) continue;
    const std::optional<float> part = checkpoint.find(spec.name)->fp8->input;
    std::optional<float>& scale = spec.fp8->input_scale;
    if (!part) without.insert(spec.fp8);
    if (part) scale = std::max(scale.value_or(*part), *part);
  }
  for (Weight* w : without) w->input_scale.reset();
}

}  // namespace

absl::StatusOr<int64_t> allocate_random_stored_fp8(Backend& backend,
                                                   const std::vector<WeightSpec>& table,
                                                   uint64_t seed) {
  std::vector<WeightSpec> dense;
  std::set<const Weight*> stored;
  for (const WeightSpec& spec : table) {
    if (spec.fp8 != nullptr && spec.shape.size() == 2 && !spec.host) {
      stored.insert(spec.fp8);
    } else {
      dense.push_back(spec);
    }
  }
  FLUX_ASSIGN_OR_RETURN(const int64_t dense_bytes, allocate_device_weights(backend, dense));
  FLUX_RETURN_IF_ERROR(fill_random_weights(backend, dense, seed));
  FLUX_ASSIGN_OR_RETURN(const int64_t stored_bytes,
                        allocate_stored_weights(backend, table, stored));
  // Codes drawn once per weight for a block of rows (at most kBlockBytes) and repeated down the
  // rows: the shapes and bytes matter to a benchmark, not the values. Scales give every weight
  // fill_random_weights' range, ±1/sqrt(K).
  constexpr int64_t kBlockBytes = int64_t{16} << 20;
  std::set<const Weight*> filled;
  for (const WeightSpec& spec : table) {
    if (stored.count(spec.fp8) == 0 || !filled.insert(spec.fp8).second) continue;
    const Weight& w = *spec.fp8;
    const int64_t rows = w.tensor.rows(), cols = w.tensor.cols();
    const int64_t block_rows = std::clamp<int64_t>(kBlockBytes / cols, 1, rows);
    std::vector<uint8_t> codes(static_cast<size_t>(block_rows * cols));
    for (size_t i = 0; i < codes.size(); ++i) {
      const uint8_t code = static_cast<uint8_t>(uniform_hash(seed + filled.size(), i) * 256.0f);
      codes[i] = (code & 0x7f) == 0x7f ? code & 0xfe : code;  // no NaN codes
    }
    for (int64_t r = 0; r < rows; r += block_rows) {
      const int64_t n = std::min(block_rows, rows - r);
      FLUX_RETURN_IF_ERROR(backend.upload(codes.data(), DType::kF8E4M3, w.tensor.row_slice(r, n)));
    }
    const std::vector<float> scales(static_cast<size_t>(rows),
                                    1.0f / (kE4M3Max * std::sqrt(static_cast<float>(cols))));
    FLUX_RETURN_IF_ERROR(backend.upload(scales.data(), DType::kF32, w.row_scales));
    spec.fp8->input_scale = kRandomActivationAmax / kE4M3Max;
  }
  FLUX_RETURN_IF_ERROR(backend.synchronize());
  return dense_bytes + stored_bytes;
}

absl::StatusOr<DequantizedBytes> dequantize_stored_weights(Backend& backend,
                                                           const std::vector<WeightSpec>& table) {
  DequantizedBytes bytes;
  std::set<Weight*> done;
  for (const WeightSpec& spec : table) {
    if (spec.fp8 == nullptr || !spec.fp8->stored_fp8() || !done.insert(spec.fp8).second) continue;
    Weight& w = *spec.fp8;
    FLUX_ASSIGN_OR_RETURN(Tensor values, backend.weight_values(w));
    bytes.values += values.bytes();
    bytes.stored += w.tensor.bytes() + w.row_scales.bytes();
    w.tensor = std::move(values);
    static const Tensor kNoScales;  // a plain weight from now on
    w.row_scales = kNoScales;
    FLUX_RETURN_IF_ERROR(backend.synchronize());  // one layer's codes and values at a time
  }
  return bytes;
}

absl::StatusOr<LoadReport> load_weights(Backend& backend, const ComponentWeights& checkpoint,
                                        const std::vector<WeightSpec>& table,
                                        const UnusedTensorFilter& unused, Fp8Placement placement) {
  const auto start = std::chrono::steady_clock::now();
  FLUX_RETURN_IF_ERROR(validate_weights(checkpoint, table, unused));

  LoadReport report;
  const std::set<const Weight*> stored = placement == Fp8Placement::kStored
                                             ? stored_fp8_weights(checkpoint, table)
                                             : std::set<const Weight*>{};
  std::vector<WeightSpec> dense;  // the specs allocated in the weight dtype
  for (const WeightSpec& spec : table) {
    if (spec.fp8 == nullptr || stored.count(spec.fp8) == 0) dense.push_back(spec);
  }
  FLUX_ASSIGN_OR_RETURN(const WeightBytes bytes, allocate_weights(backend, dense));
  FLUX_ASSIGN_OR_RETURN(const int64_t stored_bytes,
                        allocate_stored_weights(backend, table, stored));
  report.device_bytes = bytes.device + stored_bytes;
  report.host_bytes = bytes.host;
  assign_input_scales(checkpoint, table, stored);

  for (const WeightSpec& spec : table) {
    const TensorRef& ref = *checkpoint.find(spec.name);
    if (spec.fp8 != nullptr && stored.count(spec.fp8) != 0) {
      FLUX_RETURN_IF_ERROR(upload_stored(backend, spec, ref));
      ++report.tensors;
      continue;
    }
    const Shape piece = target_shape(spec);
    const int64_t rows = piece.empty() ? 1 : piece[0];
    FLUX_CHECK(spec.target->rank() > 0 && spec.target_row + rows <= spec.target->dim(0));
    const int64_t row_elems = shape_numel(piece) / std::max<int64_t>(rows, 1);
    // The destination: rows [target_row, target_row + rows) of the first dimension.
    Tensor flat = spec.target->reshape(Shape{spec.target->numel() / row_elems, row_elems});
    Tensor dest = flat.row_slice(spec.target_row, rows);
    const char* src = static_cast<const char*>(ref.data());
    if (ref.fp8 != nullptr) {
      // An FP8 checkpoint's weight: dequantized in f32, then converted to the weight dtype as any
      // f32 upload is (bf16(float(W8) * scale) on a bf16 backend).
      FLUX_CHECK(spec.layout == WeightLayout::kAsIs);
      FLUX_ASSIGN_OR_RETURN(std::vector<float> values, dequantize_fp8(ref));
      FLUX_RETURN_IF_ERROR(backend.upload(values.data(), DType::kF32, dest));
    } else if (spec.layout == WeightLayout::kConvToOhwi) {
      std::vector<char> permuted = to_ohwi(src, spec.shape, dtype_size(ref.entry->dtype));
      FLUX_RETURN_IF_ERROR(backend.upload(permuted.data(), ref.entry->dtype, dest));
    } else {
      FLUX_RETURN_IF_ERROR(backend.upload(src, ref.entry->dtype, dest));
    }
    ++report.tensors;
  }
  FLUX_RETURN_IF_ERROR(backend.synchronize());
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace flux2
