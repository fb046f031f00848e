// `flux2 generate`: offline text-to-image and editing (--reference, repeatable) without the server;
// writes a PNG and prints the stage timings. Tested by tests/host/generate_command_test.cc (tiny
// checkpoint, bad inputs, references).
#include <cstdio>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/backend_factory.h"
#include "kernels/base/read_file.h"
#include "kernels/base/status.h"
#include "model/image_encode.h"
#include "model/pipeline.h"
#include "model/reference_image.h"
#include "server/cli/commands.h"
#include "server/common/args.h"
#include "server/common/backend_flags.h"
#include "server/common/embedded_checkpoint.h"

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

}  // namespace

int run_generate(int argc, char** argv, int first) {
  auto args = Args::parse(argc, argv, first, {"--no-fast-paths"});
  if (!args.ok()) return fail(args.status().message());
  std::set<std::string> known = {"--model-dir",
                                 "--prompt",
                                 "--negative-prompt",
                                 "--height",
                                 "--width",
                                 "--steps",
                                 "--seed",
                                 "--guidance",
                                 "--out",
                                 "--backend",
                                 "--max-sequence-length",
                                 "--reference",
                                 "--no-fast-paths"};
  known.insert(backend_flag_names().begin(), backend_flag_names().end());
  if (auto checked = args->check_known(known); !checked.ok()) return fail(checked.message());
  auto backend_options = parse_backend_flags(*args);
  if (!backend_options.ok()) return fail(backend_options.status().message());
  if (!args->has("--prompt")) return fail("--prompt is required");
  const std::string model_dir = args->get("--model-dir", embedded_checkpoint_dir());
  GenerateParams params;
  params.prompt = args->get("--prompt");
  params.negative_prompt = args->get("--negative-prompt");
  params.fast_paths = !args->has("--no-fast-paths");
  // 0: the first reference's prepared size, else 1024 (model/pipeline.h output_size).
  auto height = args->get_int("--height", 0), width = args->get_int("--width", 0);
  auto steps = args->get_int("--steps", 0), seed = args->get_int("--seed", 0);
  auto max_len = args->get_int("--max-sequence-length", 0);
  auto guidance = args->get_double("--guidance", -1.0);
  for (const absl::Status& s : {height.status(), width.status(), steps.status(), seed.status(),
                                max_len.status(), guidance.status()}) {
    if (!s.ok()) return fail(s.message());
  }
  if (args->has("--steps") && *steps < 1)
    return fail(absl::StrCat("--steps: ", *steps, " must be at least 1"));
  params.height = *height;
  params.width = *width;
  params.num_inference_steps = *steps;
  params.seed = static_cast<uint64_t>(*seed);
  params.max_sequence_length = *max_len;
  params.guidance_scale = *guidance;
  const std::string out = args->get("--out", "flux2.png");
  auto reference_files = read_references(args->get_all("--reference"));
  if (!reference_files.ok()) return fail(reference_files.status().message());

  auto backend = create_backend(args->get("--backend", "cpu"), *backend_options);
  if (!backend.ok()) return fail(backend.status().message());
  PipelineOptions load_options;
  load_options.on_progress = [](const LoadProgress& progress) {
    std::fprintf(stderr, "flux2 generate: %s\n", describe(progress).c_str());
  };
  auto pipeline = Pipeline::load(**backend, model_dir, load_options);
  if (!pipeline.ok()) return fail(pipeline.status().message());
  std::fprintf(stderr, "flux2 generate: %s\n", (*pipeline)->info().load_summary().c_str());
  for (size_t i = 0; i < reference_files->size(); ++i) {
    const std::string field = absl::StrCat("--reference[", i, "]");
    const std::string& bytes = (*reference_files)[i];
    auto reference = load_reference(bytes, (*pipeline)->info().pixel_multiple, field);
    if (!reference.ok()) return fail(reference.status().message());
    params.references.push_back(std::move(*reference));
  }
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
  std::ofstream file(out, std::ios::binary);
  file.write(reinterpret_cast<const char*>(png->data()), static_cast<std::streamsize>(png->size()));
  if (!file) return fail(absl::StrCat("cannot write ", out));
  const StageTimings& t = image->timings;
  std::printf(
      "wrote %s (%lldx%lld, seed %llu, %zu references): tokenize %.1f ms, text encode %.1f ms, "
      "reference encode %.1f ms, denoise %.1f ms (%zu steps), decode %.1f ms\n",
      out.c_str(), static_cast<long long>(image->width), static_cast<long long>(image->height),
      static_cast<unsigned long long>(image->seed), params.references.size(), 1e3 * t.tokenize,
      1e3 * t.text_encode, 1e3 * t.reference_encode, 1e3 * t.denoise, t.steps.size(),
      1e3 * t.decode);
  return 0;
}

}  // namespace flux2
