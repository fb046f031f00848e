// check-golden part "randn": every tensor of randn.safetensors (`seed{S}.{dims joined by x}.f32`
// or `.bf16`, torch.randn from a fresh manual_seed(S) generator) against torch_randn_f32/_bf16.
// float32 within 1e-6 absolute, bf16 exactly (tests/data/README.md). See golden_check.h.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/base/status.h"
#include "model/safetensors.h"
#include "model/torch_randn.h"
#include "server/cli/golden/golden_check.h"

namespace flux2 {
namespace {

constexpr char kFile[] = "randn.safetensors";
// tests/data/README.md: "the float32 values within 1e-6 absolute"; bf16 must be identical.
constexpr double kF32AbsTolerance = 1e-6;

struct RandnKey {
  uint64_t seed = 0;
  Shape shape;
  bool bf16 = false;
};

// "seed42.1x128x64x64.f32" -> seed 42, shape [1, 128, 64, 64], float32.
absl::StatusOr<RandnKey> parse_key(const std::string& name) {
  const std::vector<std::string> parts = absl::StrSplit(name, '.');
  RandnKey key;
  if (parts.size() != 3 || parts[0].rfind("seed", 0) != 0 ||
      !absl::SimpleAtoi(parts[0].substr(4), &key.seed) ||
      (parts[2] != "f32" && parts[2] != "bf16")) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor name \"", name, "\" is not seed{S}.{dims}.f32|bf16"));
  }
  key.bf16 = parts[2] == "bf16";
  for (absl::string_view dim : absl::StrSplit(parts[1], 'x')) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(dim, &value) || value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name \"", name, "\": bad dims \"", parts[1], "\""));
    }
    key.shape.push_back(value);
  }
  return key;
}

absl::Status check_tensor(const SafetensorsFile& vectors, const SafetensorsEntry& entry,
                          GoldenReport& report) {
  FLUX_ASSIGN_OR_RETURN(const RandnKey key, parse_key(entry.name));
  if (entry.shape != key.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", shape_string(entry.shape), " does not match the name"));
  }
  FLUX_ASSIGN_OR_RETURN(const std::vector<float> reference, read_f32(vectors, entry.name));
  const int64_t numel = shape_numel(key.shape);
  const std::vector<float> ours =
      key.bf16 ? torch_randn_bf16(key.seed, numel) : torch_randn_f32(key.seed, numel);
  if (ours.size() != reference.size()) {
    return absl::InternalError(absl::StrCat("produced ", ours.size(), " values for ", numel));
  }
  double max_abs = 0.0;
  int64_t differing = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(ours[i]) - reference[i]);
    if (!(diff <= max_abs)) max_abs = diff;  // NaN propagates as a failure
    differing += ours[i] != reference[i];
  }
  const double tolerance = key.bf16 ? 0.0 : kF32AbsTolerance;
  const std::string case_name = absl::StrCat("seed", key.seed);
  const std::string tensor =
      absl::StrCat(absl::StrJoin(key.shape, "x"), key.bf16 ? ".bf16" : ".f32");
  report.record(max_abs <= tolerance, kFile, case_name, tensor,
                absl::StrFormat("max_abs=%.3e tol=%.1e differing=%d/%d", max_abs, tolerance,
                                differing, numel));
  return absl::OkStatus();
}

}  // namespace

void check_golden_randn(const GoldenContext& context, GoldenReport& report) {
  auto vectors = SafetensorsFile::open(context.dir + "/" + kFile);
  if (!vectors.ok()) return report.fail(kFile, "-", vectors.status().message());
  if ((*vectors)->entries().empty()) return report.fail(kFile, "-", "no tensors");
  for (const SafetensorsEntry& entry : (*vectors)->entries()) {
    if (absl::Status status = check_tensor(**vectors, entry, report); !status.ok()) {
      report.fail(kFile, entry.name, status.message());
    }
  }
}

}  // namespace flux2
