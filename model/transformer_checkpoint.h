// Where a FLUX.2 transformer's weights come from and in what form: a diffusers transformer/ folder
// (bf16, or ModelOpt FP8), or a Black Forest Labs single file (bf16, or one of the FP8 layouts of
// model/fp8_checkpoint.h), detected from the keys, the header and config.json. Tested by
// tests/host/fp8_checkpoint_test.cc and tests/host/bfl_checkpoint_test.cc.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "model/checkpoint.h"
#include "model/fp8_checkpoint.h"
#include "nlohmann/json.hpp"

namespace flux2 {

// A transformer checkpoint opened under the names of Flux2Weights::table, and what it was.
struct TransformerCheckpoint {
  ComponentWeights weights;
  std::string format;  // "diffusers", "bfl" (bf16 single file), or fp8_layout_name's FP8 names
  Fp8Layout fp8_layout = Fp8Layout::kNone;
  int64_t checkpoint_bytes = 0;  // bytes of the weights as stored (FP8 bytes for FP8 tensors)
  int64_t fp8_tensors = 0;       // weights (diffusers names) stored as F8_E4M3
  int64_t ignored_scales = 0;    // scales of layers the file keeps in bf16 (Fp8Layers)

  // "bfl_fp8 (30 FP8 tensors, 1.3 MB as stored)" (GB from 1e9 bytes), for the start-up log.
  std::string describe() const;
};

// A diffusers transformer folder `dir` (config.json + safetensors): bf16, or ModelOpt FP8 when its
// config.json says so (modelopt_quantization).
absl::StatusOr<TransformerCheckpoint> open_transformer_folder(const std::string& dir);

// `path` given in place of transformer/ (--transformer-file): a folder as above, or a BFL-named
// single file whose config is `config` (read from `config_path`; BFL files have none). A
// diffusers-named single file is refused (its place is a transformer/ folder).
absl::StatusOr<TransformerCheckpoint> open_transformer_file(const std::string& path,
                                                            nlohmann::json config,
                                                            const std::string& config_path);

}  // namespace flux2
