// `flux2 generate`: offline text-to-image without the server; writes a PNG and prints the stage
// timings. Tested by tests/host/generate_command_test.cc (tiny checkpoint, bad inputs).
#include <cstdio>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/backend_factory.h"
#include "model/image_encode.h"
#include "model/pipeline.h"
#include "server/cli/args.h"
#include "server/cli/backend_flags.h"
#include "server/cli/commands.h"

namespace flux2 {
namespace {

int fail(absl::string_view message) {
  std::fprintf(stderr, "flux2 generate: %s\n", std::string(message).c_str());
  return 1;
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
                                 "--no-fast-paths"};
  known.insert(backend_flag_names().begin(), backend_flag_names().end());
  if (auto checked = args->check_known(known); !checked.ok()) return fail(checked.message());
  auto backend_options = parse_backend_flags(*args);
  if (!backend_options.ok()) return fail(backend_options.status().message());
  if (!args->has("--prompt")) return fail("--prompt is required");
  const std::string model_dir = args->get("--model-dir", FLUX2_TINY_CHECKPOINT_DIR);
  GenerateParams params;
  params.prompt = args->get("--prompt");
  params.negative_prompt = args->get("--negative-prompt");
  params.fast_paths = !args->has("--no-fast-paths");
  auto height = args->get_int("--height", 1024), width = args->get_int("--width", 1024);
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

  auto backend = create_backend(args->get("--backend", "cpu"), *backend_options);
  if (!backend.ok()) return fail(backend.status().message());
  auto pipeline = Pipeline::load(**backend, model_dir);
  if (!pipeline.ok()) return fail(pipeline.status().message());
  std::fprintf(stderr, "flux2 generate: %s\n", (*pipeline)->info().load_summary().c_str());
  auto image = (*pipeline)->generate(params);
  if (!image.ok()) return fail(image.status().message());
  auto png = encode_png(image->rgb, image->width, image->height);
  if (!png.ok()) return fail(png.status().message());
  std::ofstream file(out, std::ios::binary);
  file.write(reinterpret_cast<const char*>(png->data()), static_cast<std::streamsize>(png->size()));
  if (!file) return fail(absl::StrCat("cannot write ", out));
  const StageTimings& t = image->timings;
  std::printf(
      "wrote %s (%lldx%lld, seed %llu): tokenize %.1f ms, text encode %.1f ms, denoise %.1f ms "
      "(%zu steps), "
      "decode %.1f ms\n",
      out.c_str(), static_cast<long long>(image->width), static_cast<long long>(image->height),
      static_cast<unsigned long long>(image->seed), 1e3 * t.tokenize, 1e3 * t.text_encode,
      1e3 * t.denoise, t.steps.size(), 1e3 * t.decode);
  return 0;
}

}  // namespace flux2
