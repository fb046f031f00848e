// check-golden part "text_encoder": encodes each case of text_encoder.safetensors with the Qwen3
// encoder of <golden>/checkpoint/text_encoder and compares every tapped hidden state and the
// stacked prompt_embeds (padding rows included). See golden_check.h.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "model/text_encoder.h"
#include "nlohmann/json.hpp"
#include "server/cli/golden/golden_check.h"

namespace flux2 {
namespace {

constexpr char kFile[] = "text_encoder.safetensors";

// The tapped layers: the file's "layers" metadata ("[9, 18, 27]"), else klein's.
absl::StatusOr<std::vector<int64_t>> golden_taps(const SafetensorsFile& vectors) {
  auto it = vectors.metadata().find("layers");
  if (it == vectors.metadata().end()) return std::vector<int64_t>{9, 18, 27};
  const nlohmann::json layers =
      nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  std::vector<int64_t> taps;
  if (layers.is_array()) {
    for (const auto& layer : layers) {
      if (!layer.is_number_integer()) break;
      taps.push_back(layer.get<int64_t>());
    }
  }
  if (taps.empty() || taps.size() != layers.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFile, ": metadata \"layers\" is not an array of integers: ", it->second));
  }
  return taps;
}

// Runs case `name` ("case0") and reports every hidden state and prompt_embeds it has.
absl::Status run_case(const GoldenContext& context, const TextEncoder& model,
                      const SafetensorsFile& vectors, const std::string& name,
                      GoldenReport& report) {
  Backend& be = *context.backend;
  const std::string p = name + ".";
  FLUX_ASSIGN_OR_RETURN(std::vector<float> id_values, read_f32(vectors, p + "input_ids"));
  FLUX_ASSIGN_OR_RETURN(std::vector<float> mask, read_f32(vectors, p + "attention_mask"));
  if (mask.size() != id_values.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention_mask has ", mask.size(), " values, input_ids ", id_values.size()));
  }
  // Right padding: the mask is ones, then zeros.
  int64_t num_valid = 0;
  while (num_valid < static_cast<int64_t>(mask.size()) && mask[num_valid] == 1.0f) ++num_valid;
  for (size_t i = static_cast<size_t>(num_valid); i < mask.size(); ++i) {
    if (mask[i] != 0.0f) {
      return absl::InvalidArgumentError(absl::StrCat("attention_mask is not right padding (value ",
                                                     mask[i], " at position ", i, ")"));
    }
  }
  // Ids are < 2^24, so they survive the float round trip exactly.
  const std::vector<int32_t> ids(id_values.begin(), id_values.end());

  std::map<std::string, std::vector<float>> outputs;
  absl::Status tap_status;
  auto tap = [&](absl::string_view tensor_name, const Tensor& value) {
    auto values = download_values(be, value);
    if (!values.ok())
      tap_status = values.status();
    else
      outputs[std::string(tensor_name)] = std::move(*values);
  };
  FLUX_ASSIGN_OR_RETURN(Tensor prompt_embeds, model.encode(ids, num_valid, tap));
  FLUX_RETURN_IF_ERROR(tap_status);
  FLUX_ASSIGN_OR_RETURN(outputs["prompt_embeds"], download_values(be, prompt_embeds));

  for (const SafetensorsEntry& entry : vectors.entries()) {
    if (entry.name.rfind(p, 0) != 0) continue;
    const std::string tensor = entry.name.substr(p.size());
    if (tensor != "prompt_embeds" && tensor.rfind("hidden_states.", 0) != 0) continue;  // inputs
    auto found = outputs.find(tensor);
    if (found == outputs.end()) {
      report.fail(kFile, name, absl::StrCat(tensor, ": the encoder produced no such tensor"));
      continue;
    }
    FLUX_ASSIGN_OR_RETURN(std::vector<float> reference, read_f32(vectors, entry.name));
    absl::StatusOr<double> tolerance =
        context.tolerance(absl::StrCat("text_encoder.", name, ".", tensor));
    if (tensor == "prompt_embeds") {
      // prompt_embeds is the column-wise concatenation of the tapped hidden states, so its relative
      // error is at most the largest of theirs (||concat e||² = Σ||e_k||² <= max_k r_k²
      // Σ||ref_k||²): its bound is the largest of the taps' bounds (bf16_reference.json lists only
      // the taps).
      tolerance = 0.0;
      for (const auto& [other, values] : outputs) {
        if (other.rfind("hidden_states.", 0) != 0) continue;
        const absl::StatusOr<double> tap =
            context.tolerance(absl::StrCat("text_encoder.", name, ".", other));
        tolerance = tap.ok() ? std::max(*tolerance, *tap) : tap;
        if (!tap.ok()) break;
      }
    }
    report.compare(kFile, name, tensor, found->second, reference, tolerance);
  }
  return absl::OkStatus();
}

}  // namespace

void check_golden_text_encoder(const GoldenContext& context, GoldenReport& report) {
  auto vectors = SafetensorsFile::open(context.dir + "/" + kFile);
  if (!vectors.ok()) return report.fail(kFile, "-", vectors.status().message());
  auto taps = golden_taps(**vectors);
  if (!taps.ok()) return report.fail(kFile, "-", taps.status().message());
  auto checkpoint = ComponentWeights::open(context.checkpoint_dir() + "/text_encoder");
  if (!checkpoint.ok()) return report.fail(kFile, "-", checkpoint.status().message());
  auto model = TextEncoder::load(*context.backend, *checkpoint, *taps);
  if (!model.ok()) return report.fail(kFile, "-", model.status().message());
  for_each_case(**vectors, kFile, "input_ids", report, [&](const std::string& name) {
    return run_case(context, **model, **vectors, name, report);
  });
}

}  // namespace flux2
