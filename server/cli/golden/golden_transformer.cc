// check-golden part "transformer": one forward per case of transformer.safetensors (klein or
// dev), comparing the output and, where present, every block's output; at quality=high on the
// CUDA backend the CPU's FP8 emulation runs each case too, for the bound. See golden_check.h.
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/base/numerics.h"
#include "kernels/base/status.h"
#include "model/checkpoint.h"
#include "model/flux2_transformer.h"
#include "model/safetensors.h"
#include "server/cli/golden/golden_check.h"

namespace flux2 {
namespace {

constexpr char kFile[] = "transformer.safetensors";

absl::StatusOr<std::vector<int64_t>> read_ids(const SafetensorsFile& file,
                                              const std::string& name) {
  FLUX_ASSIGN_OR_RETURN(std::vector<float> values, read_f32(file, name));
  return std::vector<int64_t>(values.begin(), values.end());
}

}  // namespace

absl::StatusOr<TransformerInputs> transformer_inputs(Backend& be, const Flux2Config& config,
                                                     const SafetensorsFile& vectors,
                                                     const std::string& p) {
  TransformerInputs in;
  FLUX_ASSIGN_OR_RETURN(std::vector<float> hidden, read_f32(vectors, p + "hidden_states"));
  FLUX_ASSIGN_OR_RETURN(std::vector<float> text, read_f32(vectors, p + "encoder_hidden_states"));
  FLUX_ASSIGN_OR_RETURN(in.timestep, read_f32(vectors, p + "timestep"));
  FLUX_ASSIGN_OR_RETURN(in.img_ids, read_ids(vectors, p + "img_ids"));
  FLUX_ASSIGN_OR_RETURN(in.txt_ids, read_ids(vectors, p + "txt_ids"));
  if (vectors.find(p + "guidance") != nullptr) {
    FLUX_ASSIGN_OR_RETURN(in.guidance, read_f32(vectors, p + "guidance"));
  }
  const int64_t n = static_cast<int64_t>(hidden.size()) / config.in_channels;
  const int64_t l = static_cast<int64_t>(text.size()) / config.joint_attention_dim;
  FLUX_ASSIGN_OR_RETURN(in.prompt, upload_values(be, text, {l, config.joint_attention_dim}));
  FLUX_ASSIGN_OR_RETURN(in.x, upload_values(be, hidden, {n, config.in_channels}));
  return in;
}

namespace {

// The tensors the golden has for case `name` ("case0"), as `model` on `be` computes them: the
// output and every tapped block output.
absl::StatusOr<std::map<std::string, std::vector<float>>> forward_case(
    Backend& be, const Flux2Transformer& model, const SafetensorsFile& vectors,
    const std::string& name) {
  const Flux2Config& config = model.config();
  const std::string p = name + ".";
  FLUX_ASSIGN_OR_RETURN(TransformerInputs in, transformer_inputs(be, config, vectors, p));
  const Tensor& x = in.x;
  FLUX_ASSIGN_OR_RETURN(Tensor out,
                        be.empty(be.activation_dtype(), {x.rows(), config.out_channels}));
  FLUX_ASSIGN_OR_RETURN(Flux2Conditioning cond,
                        model.prepare(in.prompt, in.txt_ids, in.img_ids, in.timestep, in.guidance));

  std::map<std::string, std::vector<float>> taps;
  absl::Status tap_status;
  auto tap = [&](absl::string_view tensor_name, const Tensor& value) {
    if (vectors.find(p + std::string(tensor_name)) == nullptr) return;
    auto values = download_values(be, value);
    if (!values.ok())
      tap_status = values.status();
    else
      taps[std::string(tensor_name)] = std::move(*values);
  };
  FLUX_RETURN_IF_ERROR(model.forward(cond, 0, x, out, tap));
  FLUX_RETURN_IF_ERROR(tap_status);
  FLUX_ASSIGN_OR_RETURN(taps["output"], download_values(be, out));
  return taps;
}

// Runs case `name` and reports every reference tensor it has. With `fp8_reference` (quality=high
// on a bf16 backend) the CPU backend's FP8 emulation runs the case too: its error against the
// golden is the FP8 part of the bound (GoldenContext::tolerance).
absl::Status run_case(const GoldenContext& context, const Flux2Transformer& model,
                      const Flux2Transformer* fp8_reference, const SafetensorsFile& vectors,
                      const std::string& name, GoldenReport& report) {
  FLUX_ASSIGN_OR_RETURN(auto outputs, forward_case(*context.backend, model, vectors, name));
  std::map<std::string, std::vector<float>> emulated;
  if (fp8_reference != nullptr) {
    FLUX_ASSIGN_OR_RETURN(emulated,
                          forward_case(*context.fp8_backend, *fp8_reference, vectors, name));
  }
  const std::string p = name + ".";
  for (const SafetensorsEntry& entry : vectors.entries()) {
    if (entry.name.rfind(p, 0) != 0) continue;
    const std::string tensor = entry.name.substr(p.size());
    if (tensor != "output" && tensor.rfind("block.", 0) != 0) continue;  // inputs
    auto found = outputs.find(tensor);
    if (found == outputs.end()) {
      report.fail(kFile, name, absl::StrCat(tensor, ": the model produced no such tensor"));
      continue;
    }
    FLUX_ASSIGN_OR_RETURN(std::vector<float> reference, read_f32(vectors, entry.name));
    const double fp8_error =
        fp8_reference != nullptr ? relative_l2_error(emulated.at(tensor), reference) : 0.0;
    report.compare(kFile, name, tensor, found->second, reference,
                   context.tolerance(absl::StrCat("transformer.", name, ".", tensor), fp8_error));
  }
  return absl::OkStatus();
}

}  // namespace

void check_golden_transformer(const GoldenContext& context, GoldenReport& report) {
  auto vectors = SafetensorsFile::open(context.dir + "/" + kFile);
  if (!vectors.ok()) return report.fail(kFile, "-", vectors.status().message());
  auto checkpoint = ComponentWeights::open(context.checkpoint_dir() + "/transformer");
  if (!checkpoint.ok()) return report.fail(kFile, "-", checkpoint.status().message());
  auto model = Flux2Transformer::load(*context.backend, *checkpoint);
  if (!model.ok()) return report.fail(kFile, "-", model.status().message());
  std::unique_ptr<Flux2Transformer> fp8_reference;
  std::optional<RequestScope> reference_request;
  if (context.quality == Quality::kHigh) {
    if (auto added = (*model)->enable_quality_high(); !added.ok())
      return report.fail(kFile, "-", added.status().message());
    if (context.fp8_backend != nullptr) {
      auto emulation = Flux2Transformer::load(*context.fp8_backend, *checkpoint);
      if (!emulation.ok()) return report.fail(kFile, "-", emulation.status().message());
      if (auto added = (*emulation)->enable_quality_high(); !added.ok())
        return report.fail(kFile, "-", added.status().message());
      fp8_reference = std::move(*emulation);
      reference_request.emplace(*context.fp8_backend, RequestOptions{Quality::kHigh});
    }
  }
  const RequestScope request(*context.backend, {context.quality});
  for_each_case(**vectors, kFile, "hidden_states", report, [&](const std::string& name) {
    return run_case(context, **model, fp8_reference.get(), **vectors, name, report);
  });
}

}  // namespace flux2
