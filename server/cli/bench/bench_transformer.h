// The transformer a `flux2 bench` step run times: random weights at --model's shapes (bf16, or
// stored FP8 with --weights fp8), or loaded from --transformer-file with the load timed. Tested by
// ctest flux2_bench_transformer_file{,_refused} (tests/server/CMakeLists.txt, the CPU backend).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/flux2_config.h"
#include "model/flux2_transformer.h"

namespace flux2 {

struct BenchTransformer {
  std::unique_ptr<Flux2Transformer> model;
  bool stored_fp8 = false;  // block projections stored FP8 (--weights fp8, or an FP8 file)
  std::string source;       // "random bf16", "random fp8", or the file's format (describe())
  double load_seconds = 0;  // the file: open, read and upload (0 for random weights)
  int64_t file_bytes = 0;   // the file's weights as stored
};

// `file` empty: random weights at `config`'s shapes (`stored_fp8` as --weights fp8 says); else
// opened as the server's --transformer-file opens it: a BFL single file at `config`'s shapes, or a
// transformer folder with its own config.json; FP8 projections kept as stored.
absl::StatusOr<BenchTransformer> make_bench_transformer(Backend& backend, const Flux2Config& config,
                                                        const std::string& file, bool stored_fp8);

}  // namespace flux2
