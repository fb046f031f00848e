// The check-golden driver: option parsing, the part table and the report; see golden_check.h.
#include "server/cli/golden/golden_check.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/backend_factory.h"
#include "kernels/base/numerics.h"
#include "kernels/base/status.h"
#include "model/json_util.h"
#include "server/cli/commands.h"
#include "server/common/backend_flags.h"
#include "server/common/command_line.h"

namespace flux2 {
namespace {

using PartFn = void (*)(const GoldenContext&, GoldenReport&);

constexpr int kExitNoDevice = 77;  // ctest's SKIP_RETURN_CODE for GPU tests

struct GoldenPart {
  const char* name;  // --only spelling
  const char* file;  // the vector file whose presence means the part is in the directory
  PartFn run;
};

// In the order the checker runs them.
const GoldenPart kParts[] = {
    {"tokenizer", "tokenizer_cases.json", check_golden_tokenizer},
    {"text_encoder", "text_encoder.safetensors", check_golden_text_encoder},
    {"transformer", "transformer.safetensors", check_golden_transformer},
    {"vae", "vae_decode.safetensors", check_golden_vae},
    {"vae_encode", "vae_encode_cases.json", check_golden_vae_encode},
    {"scheduler", "scheduler_cases.json", check_golden_scheduler},
    {"randn", "randn.safetensors", check_golden_randn},
    {"pipeline", "pipeline_cases.json", check_golden_pipeline},
    {"sigmas", "sigmas_cases.json", check_golden_sigmas},
    {"cache", "cache_cases.json", check_golden_cache},
    {"cache_steps", "cache_cases.json", check_golden_cache_steps},
    {"edit", "edit_cases.json", check_golden_edit},
    {"edit_kv", "edit_kv_cases.json", check_golden_edit_kv},
    {"lora", "lora_transformer.safetensors", check_golden_lora},
    {"lora_pipeline", "lora_pipeline.safetensors", check_golden_lora_pipeline},
    {"fp8", "fp8_transformer.safetensors", check_golden_fp8},
    {"fp8_pipeline", "fp8_pipeline.safetensors", check_golden_fp8_pipeline},
};

void print_usage() {
  std::fprintf(stderr,
               "usage: flux2 check-golden --golden DIR [--backend cpu|cuda] [--only PART,...] "
               "[--quality lossless|high (cuda)]\n"
               "parts: tokenizer, text_encoder, transformer, vae, vae_encode, scheduler, randn, "
               "pipeline, sigmas, cache, edit, edit_kv, lora, lora_pipeline, fp8, fp8_pipeline\n");
}

}  // namespace

void GoldenReport::compare(absl::string_view file, absl::string_view case_name,
                           absl::string_view tensor, std::span<const float> out,
                           std::span<const float> ref, const absl::StatusOr<double>& tolerance) {
  if (!tolerance.ok()) {
    record(false, file, case_name, tensor, tolerance.status().message());
    return;
  }
  if (out.size() != ref.size()) {
    record(false, file, case_name, tensor,
           absl::StrCat("size ", out.size(), " != reference size ", ref.size()));
    return;
  }
  const double error = relative_l2_error(out, ref);
  record(error <= *tolerance, file, case_name, tensor,
         absl::StrFormat("rel_err=%.3e tol=%.2e", error, *tolerance));
}

void GoldenReport::record(bool passed, absl::string_view file, absl::string_view case_name,
                          absl::string_view tensor, absl::string_view detail) {
  std::printf("%s %s %s %s %s\n", passed ? "PASS" : "FAIL", std::string(file).c_str(),
              std::string(case_name).c_str(), std::string(tensor).c_str(),
              std::string(detail).c_str());
  std::fflush(stdout);
  (passed ? passed_ : failed_)++;
}

void for_each_case(const SafetensorsFile& vectors, absl::string_view file,
                   absl::string_view first_tensor, GoldenReport& report,
                   const std::function<absl::Status(const std::string& name)>& run_case) {
  for (int k = 0;; ++k) {
    const std::string name = absl::StrCat("case", k);
    if (vectors.find(absl::StrCat(name, ".", first_tensor)) == nullptr) {
      if (k == 0)
        report.fail(file, "-", absl::StrCat("no cases (case0.", first_tensor, " missing)"));
      return;
    }
    if (absl::Status status = run_case(name); !status.ok())
      report.fail(file, name, status.message());
  }
}

absl::StatusOr<std::vector<float>> download_values(Backend& backend, const Tensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.numel()));
  FLUX_RETURN_IF_ERROR(backend.download(tensor, values.data()));
  return values;
}

absl::StatusOr<Tensor> upload_values(Backend& backend, const std::vector<float>& values,
                                     Shape shape) {
  FLUX_ASSIGN_OR_RETURN(Tensor tensor, backend.empty(backend.activation_dtype(), std::move(shape)));
  FLUX_RETURN_IF_ERROR(backend.upload(values.data(), DType::kF32, tensor));
  return tensor;
}

std::vector<float> chw_to_hwc(const std::vector<float>& chw, int64_t c, int64_t h, int64_t w) {
  std::vector<float> hwc(chw.size());
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t p = 0; p < h * w; ++p) hwc[p * c + ch] = chw[ch * h * w + p];
  return hwc;
}

std::vector<float> hwc_to_chw(const std::vector<float>& hwc, int64_t c, int64_t h, int64_t w) {
  std::vector<float> chw(hwc.size());
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t p = 0; p < h * w; ++p) chw[ch * h * w + p] = hwc[p * c + ch];
  return chw;
}

void GoldenReport::skip(absl::string_view file, absl::string_view reason) {
  std::printf("SKIP %s %s\n", std::string(file).c_str(), std::string(reason).c_str());
  std::fflush(stdout);
}

absl::StatusOr<double> GoldenContext::tolerance(const std::string& key, double fp8_error) const {
  if (backend == nullptr || backend->activation_dtype() == DType::kF32) return 1e-4;
  auto it = bf16_errors.find(key);
  if (it == bf16_errors.end()) {
    return absl::NotFoundError(absl::StrCat("no bf16 error for ", key, " in ", dir,
                                            "/bf16_reference*.json: the bound cannot be derived"));
  }
  const double bf16 = std::max(2.0 * it->second, 1e-2);
  return quality == Quality::kHigh ? bf16 + 2.0 * fp8_error : bf16;
}

namespace {

// check-golden's flags into `context` (dir, backend_name, quality), `backend_options` and `only`
// (the --only parts); 0, or the exit status after saying why on stderr.
int parse_golden_flags(int argc, char** argv, int first, GoldenContext& context,
                       BackendOptions& backend_options, std::vector<std::string>& only) {
  CommandLine app("flux2 check-golden");
  context.backend_name = "cpu";
  std::string quality = "lossless", only_parts;
  app.add_option("--golden", context.dir);
  app.add_option("--backend", context.backend_name);
  app.add_option("--only", only_parts);
  app.add_option("--quality", quality);
  add_backend_flags(app, backend_options);
  if (absl::Status parsed = app.parse_flags(argc, argv, first); !parsed.ok()) {
    std::fprintf(stderr, "check-golden: %s\n", std::string(parsed.message()).c_str());
    print_usage();
    return 2;
  }
  if (quality != "lossless" && quality != "high") {
    std::fprintf(stderr, "check-golden: --quality must be lossless or high\n");
    return 2;
  }
  context.quality = quality == "high" ? Quality::kHigh : Quality::kLossless;
  if (context.dir.empty() || !std::filesystem::is_directory(context.dir)) {
    std::fprintf(stderr, "check-golden: --golden must name a directory (got \"%s\")\n",
                 context.dir.c_str());
    print_usage();
    return 2;
  }
  only = absl::StrSplit(only_parts, ',', absl::SkipEmpty());
  for (const std::string& name : only) {
    bool known = false;
    for (const GoldenPart& part : kParts) known |= (name == part.name);
    if (!known) {
      std::fprintf(stderr, "check-golden: --only: unknown part \"%s\"\n", name.c_str());
      print_usage();
      return 2;
    }
  }
  return 0;
}

}  // namespace

int run_check_golden(int argc, char** argv, int first) {
  GoldenContext context;
  BackendOptions backend_options;
  std::vector<std::string> only;
  if (int status = parse_golden_flags(argc, argv, first, context, backend_options, only)) {
    return status;
  }
  auto backend = create_backend(context.backend_name, backend_options);
  if (!backend.ok()) {
    std::fprintf(stderr, "check-golden: --backend %s: %s\n", context.backend_name.c_str(),
                 std::string(backend.status().message()).c_str());
    // 77: no CUDA device here (or a build without CUDA): the one case tests skip on. Any other
    // error starting the backend (a library that does not load) is a failure.
    return absl::IsNotFound(backend.status()) ? kExitNoDevice : 2;
  }
  context.backend = backend->get();
  std::unique_ptr<Backend> fp8_backend;
  if (context.quality == Quality::kHigh) {
    if (context.backend->activation_dtype() == DType::kF32) {
      std::fprintf(stderr,
                   "check-golden: --quality high is checked on a bf16 backend (--backend cuda), "
                   "against the cpu backend's FP8 emulation\n");
      return 2;
    }
    absl::StatusOr<std::unique_ptr<Backend>> cpu = create_backend("cpu", backend_options);
    if (!cpu.ok()) {
      std::fprintf(stderr, "check-golden: %s\n", std::string(cpu.status().message()).c_str());
      return 2;
    }
    fp8_backend = std::move(*cpu);
    context.fp8_backend = fp8_backend.get();
  }
  // diffusers' bf16 errors: the golden's file, and ours for what it lacks (the VAE encoder's and
  // the step-cache velocities', made by tests/gpu/make_editing_references.py and
  // make_cache_references.py; tests/data/README.md).
  for (const char* name :
       {"/bf16_reference.json", "/bf16_reference_vae_encode.json", "/bf16_reference_lora.json",
        "/bf16_reference_fp8.json", "/bf16_reference_cache.json"}) {
    const std::string bf16_path = context.dir + name;
    if (!std::filesystem::exists(bf16_path)) continue;
    auto json = read_json_file(bf16_path);
    if (json.ok() && json->contains("errors") && (*json)["errors"].is_object()) {
      for (auto it = (*json)["errors"].begin(); it != (*json)["errors"].end(); ++it) {
        if (it.value().is_number()) context.bf16_errors[it.key()] = it.value().get<double>();
      }
    }
  }

  GoldenReport report;
  for (const GoldenPart& part : kParts) {
    const bool selected =
        only.empty() || std::find(only.begin(), only.end(), part.name) != only.end();
    if (!selected) continue;
    const bool present = std::filesystem::exists(context.dir + "/" + part.file);
    if (!present) {
      // Asked for by name but absent: a failure; otherwise the directory simply lacks the part.
      if (!only.empty()) report.fail(part.file, "-", absl::StrCat("not found in ", context.dir));
      continue;
    }
    part.run(context, report);
  }
  std::printf("%d passed, %d failed\n", report.passed(), report.failed());
  return report.failed() == 0 && report.passed() > 0 ? 0 : 1;
}

}  // namespace flux2
