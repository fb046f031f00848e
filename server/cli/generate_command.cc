// `flux2 generate`: offline text-to-image and editing (--reference, repeatable) without the server,
// at --quality lossless|high, optionally with the transformer and text encoder from single files
// and an FP8 checkpoint served as the server serves it (the checkpoint flags flux2_server shares,
// server/common/checkpoint_flags.h) and LoRA adapters (--lora, files or names under --lora-dir);
// writes a PNG and prints the stage timings. Tested by tests/host/generate_command_test.cc (tiny
// checkpoint, bad inputs, references, FP8 files, adapters).
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/backend_factory.h"
#include "kernels/base/read_file.h"
#include "kernels/base/status.h"
#include "model/image_encode.h"
#include "model/lora_adapter.h"
#include "model/pipeline.h"
#include "model/reference_image.h"
#include "server/cli/commands.h"
#include "server/common/backend_flags.h"
#include "server/common/checkpoint_flags.h"
#include "server/common/command_line.h"
#include "server/common/embedded_checkpoint.h"
#include "server/serving/lora_registry.h"

namespace flux2 {
namespace {

int fail(absl::string_view message) {
  std::fprintf(stderr, "flux2 generate: %s\n", std::string(message).c_str());
  return 1;
}

// The bytes of every --reference file, in order; errors name the flag ("--reference[1]: cannot
// read b.png").
absl::StatusOr<std::vector<std::string>> read_references(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (size_t i = 0; i < paths.size(); ++i) {
    FLUX_ASSIGN_OR_RETURN(std::string bytes,
                          read_file(paths[i], absl::StrCat("--reference[", i, "]")));
    files.push_back(std::move(bytes));
  }
  return files;
}

// "NAME:SCALE" -> (NAME, SCALE); "NAME" (or a suffix that is not a number) -> (NAME, 1).
std::pair<std::string, double> split_lora_scale(std::string spec) {
  double scale = 1.0;
  const size_t colon = spec.rfind(':');
  if (colon != std::string::npos && absl::SimpleAtod(spec.substr(colon + 1), &scale)) {
    spec.resize(colon);
  } else {
    scale = 1.0;
  }
  return {std::move(spec), scale};
}

// An adapter by name under --lora-dir, resolved, checked and parsed as the server resolves a
// request's (server/serving/lora_registry.h); errors as the server's, under `field`.
absl::StatusOr<LoraRequest> resolve_lora(server::LoraRegistry& registry, const std::string& name,
                                         double scale, const std::string& field) {
  absl::StatusOr<server::ResolvedLora> lora = registry.resolve(name);
  if (absl::IsNotFound(lora.status()) || absl::IsPermissionDenied(lora.status())) {
    return absl::Status(lora.status().code(), absl::StrCat(field, ": ", lora.status().message()));
  }
  if (!lora.ok()) {
    return absl::Status(lora.status().code(),
                        absl::StrCat(field, ": ", name, ": ", lora.status().message()));
  }
  return LoraRequest{lora->sha256, lora->adapter, scale, lora->image};
}

// --lora NAME[:SCALE] (repeatable, applied in order): with --lora-dir DIR an adapter's name under
// DIR (as a server request names it), else a file; each parsed for the loaded transformer. Errors
// name the flag ("--lora[1]: style.safetensors: unknown key ...").
absl::StatusOr<std::vector<LoraRequest>> read_loras(const std::vector<std::string>& specs,
                                                    const std::string& lora_dir,
                                                    const Flux2Config& config) {
  std::unique_ptr<server::LoraRegistry> registry;
  if (!lora_dir.empty()) {
    server::LoraRegistryOptions options;
    options.dir = lora_dir;
    FLUX_ASSIGN_OR_RETURN(registry, server::LoraRegistry::open(options, config, nullptr));
  }
  std::vector<LoraRequest> loras;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string field = absl::StrCat("--lora[", i, "]");
    const auto [path, scale] = split_lora_scale(specs[i]);
    if (registry != nullptr) {
      FLUX_ASSIGN_OR_RETURN(LoraRequest lora, resolve_lora(*registry, path, scale, field));
      loras.push_back(std::move(lora));
      continue;
    }
    FLUX_ASSIGN_OR_RETURN(std::string bytes, read_file(path, field));
    absl::StatusOr<LoraAdapter> adapter = parse_lora_adapter(
        std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), config);
    if (!adapter.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", path, ": ", adapter.status().message()));
    }
    loras.push_back({path, std::make_shared<const LoraAdapter>(std::move(*adapter)), scale});
  }
  return loras;
}

// `flux2 generate`'s flags, bound by add_generate_flags (the values are the defaults).
struct GenerateFlags {
  GenerateParams params;  // --prompt, --negative-prompt, --height, --width, --steps, --guidance...
  std::string model_dir = embedded_checkpoint_dir();
  std::string out = "flux2.png";
  std::string backend = "cpu";
  int64_t seed = 0;                     // params.seed (a negative seed wraps around)
  std::vector<std::string> references;  // --reference, repeatable: the files in order
  std::vector<std::string> loras;       // --lora NAME[:SCALE], repeatable: applied in order
  std::string lora_dir;                 // --lora-dir DIR: --lora names adapters under DIR
  // --quality lossless|high: the request's quality (high: the FP8 weights are made at load, as
  // flux2_server's --enable-quality-high).
  std::string quality = "lossless";
  // --transformer-file, --text-encoder-file, --fp8-lossless, --fp8-input-scale: as flux2_server's.
  CheckpointFlags checkpoint;
  bool no_fast_paths = false;
  BackendOptions backend_options;
};

void add_generate_flags(CLI::App& app, GenerateFlags& f) {
  GenerateParams& p = f.params;
  app.add_option("--model-dir", f.model_dir);
  app.add_option("--prompt", p.prompt)->required();  // "--prompt is required"
  app.add_option("--negative-prompt", p.negative_prompt);
  // 0: the first reference's prepared size, else 1024 (model/pipeline.h output_size).
  app.add_option("--height", p.height);
  app.add_option("--width", p.width);
  app.add_option("--steps", p.num_inference_steps);
  // --sigmas 1,0.65,0.29,0.05: custom sigmas, one per step (model/scheduler.h).
  app.add_option("--sigmas", p.sigmas)->delimiter(',')->allow_extra_args(false);
  app.add_option("--seed", f.seed);
  app.add_option("--guidance", p.guidance_scale);
  app.add_option("--max-sequence-length", p.max_sequence_length);
  app.add_option("--out", f.out);
  app.add_option("--backend", f.backend);
  app.add_option("--reference", f.references)->allow_extra_args(false);
  app.add_option("--lora", f.loras)->allow_extra_args(false);
  app.add_option("--lora-dir", f.lora_dir);
  app.add_option("--quality", f.quality);
  add_checkpoint_flags(app, f.checkpoint);
  app.add_flag("--no-fast-paths", f.no_fast_paths);
  add_backend_flags(app, f.backend_options);
}

}  // namespace

int run_generate(int argc, char** argv, int first) {
  CommandLine app("flux2 generate");
  GenerateFlags flags;
  add_generate_flags(app, flags);
  if (absl::Status parsed = app.parse_flags(argc, argv, first); !parsed.ok()) {
    return fail(parsed.message());
  }
  GenerateParams& params = flags.params;
  if (app.count("--steps") && params.num_inference_steps < 1) {
    return fail(absl::StrCat("--steps: ", params.num_inference_steps, " must be at least 1"));
  }
  if (flags.quality != "lossless" && flags.quality != "high") {
    return fail(absl::StrCat("--quality \"", flags.quality, "\": expected lossless or high"));
  }
  params.quality = flags.quality == "high" ? Quality::kHigh : Quality::kLossless;
  params.seed = static_cast<uint64_t>(flags.seed);
  params.fast_paths = !flags.no_fast_paths;
  PipelineOptions load_options;
  load_options.enable_quality_high = params.quality == Quality::kHigh;
  if (absl::Status applied = apply_checkpoint_flags(flags.checkpoint, load_options);
      !applied.ok()) {
    return fail(applied.message());
  }
  auto reference_files = read_references(flags.references);
  if (!reference_files.ok()) return fail(reference_files.status().message());

  auto backend = create_backend(flags.backend, flags.backend_options);
  if (!backend.ok()) return fail(backend.status().message());
  load_options.on_progress = [](const LoadProgress& progress) {
    std::fprintf(stderr, "flux2 generate: %s\n", describe(progress).c_str());
  };
  auto pipeline = Pipeline::load(**backend, flags.model_dir, load_options);
  if (!pipeline.ok()) return fail(pipeline.status().message());
  std::fprintf(stderr, "flux2 generate: %s\n", (*pipeline)->info().load_summary().c_str());
  for (size_t i = 0; i < reference_files->size(); ++i) {
    const std::string field = absl::StrCat("--reference[", i, "]");
    const std::string& bytes = (*reference_files)[i];
    auto reference = load_reference(bytes, (*pipeline)->info().pixel_multiple, field);
    if (!reference.ok()) return fail(reference.status().message());
    params.references.push_back(std::move(*reference));
  }
  auto loras = read_loras(flags.loras, flags.lora_dir, (*pipeline)->transformer_config());
  if (!loras.ok()) return fail(loras.status().message());
  params.loras = std::move(*loras);
  const ImageSize size = output_size(params);
  params.width = size.width;
  params.height = size.height;
  GenerateHooks hooks;
  hooks.on_step = [](int64_t step, int64_t steps, double seconds) {
    std::fprintf(stderr, "flux2 generate: step %lld/%lld %.1f ms\n",
                 static_cast<long long>(step + 1), static_cast<long long>(steps), 1e3 * seconds);
  };
  auto image = (*pipeline)->generate(params, hooks);
  if (!image.ok()) return fail(image.status().message());
  auto png = encode_png(image->rgb, image->width, image->height);
  if (!png.ok()) return fail(png.status().message());
  std::ofstream file(flags.out, std::ios::binary);
  file.write(reinterpret_cast<const char*>(png->data()), static_cast<std::streamsize>(png->size()));
  if (!file) return fail(absl::StrCat("cannot write ", flags.out));
  const StageTimings& t = image->timings;
  std::printf(
      "wrote %s (%lldx%lld, seed %llu, %zu references): tokenize %.1f ms, text encode %.1f ms, "
      "reference encode %.1f ms, denoise %.1f ms (%zu steps), decode %.1f ms\n",
      flags.out.c_str(), static_cast<long long>(image->width),
      static_cast<long long>(image->height), static_cast<unsigned long long>(image->seed),
      params.references.size(), 1e3 * t.tokenize, 1e3 * t.text_encode, 1e3 * t.reference_encode,
      1e3 * t.denoise, t.steps.size(), 1e3 * t.decode);
  return 0;
}

}  // namespace flux2
