// make_bench_transformer; see bench_transformer.h.
// Tested by ctest flux2_bench_transformer_file (tests/server/CMakeLists.txt).
#include "server/cli/bench/bench_transformer.h"

#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "model/bfl_checkpoint.h"
#include "model/transformer_checkpoint.h"

namespace flux2 {

absl::StatusOr<BenchTransformer> make_bench_transformer(Backend& backend, const Flux2Config& config,
                                                        const std::string& file, bool stored_fp8) {
  BenchTransformer made;
  if (file.empty()) {
    FLUX_ASSIGN_OR_RETURN(made.model,
                          Flux2Transformer::create_random(backend, config, 1, stored_fp8));
    made.stored_fp8 = stored_fp8;
    made.source = stored_fp8 ? "random fp8" : "random bf16";
    return made;
  }
  const auto start = std::chrono::steady_clock::now();
  FLUX_ASSIGN_OR_RETURN(TransformerCheckpoint checkpoint,
                        std::filesystem::is_directory(file)
                            ? open_transformer_folder(file)
                            : open_transformer_file(file, flux2_config_json(config),
                                                    "--model's published shapes (flux2_preset)"));
  made.stored_fp8 = checkpoint.fp8_layout != Fp8Layout::kNone;
  FLUX_ASSIGN_OR_RETURN(
      made.model,
      Flux2Transformer::load(backend, checkpoint.weights,
                             made.stored_fp8 ? Fp8Placement::kStored : Fp8Placement::kDequantized));
  FLUX_RETURN_IF_ERROR(backend.synchronize());
  made.load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  made.file_bytes = checkpoint.checkpoint_bytes;
  made.source = checkpoint.describe();
  return made;
}

}  // namespace flux2
