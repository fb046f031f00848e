// The checkpoint flags flux2_server and `flux2 generate` share: where the transformer and the text
// encoder come from (--transformer-file, --text-encoder-file) and how an FP8 transformer
// checkpoint is served (--fp8-lossless resident|per_layer, --fp8-input-scale dynamic|static):
// CLI11 options bound to one struct, the check both tools run after parsing (errors name the
// flag), the PipelineOptions they set, and their help lines, documented once for both tools.
// Tested by tests/server/server_options_test.cc and tests/host/generate_command_test.cc.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/pipeline.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace flux2 {

struct CheckpointFlags {
  // --transformer-file F: a BFL single file (bf16 or FP8) or a transformer folder (ModelOpt FP8)
  // instead of <model-dir>/transformer/ (PipelineOptions::transformer_file); empty: that.
  std::string transformer_file;
  // --text-encoder-file F: one safetensors file (HF names, bf16 or FP8) instead of
  // <model-dir>/text_encoder/'s weights (PipelineOptions::text_encoder_file); empty: those.
  std::string text_encoder_file;
  // --fp8-lossless resident|per_layer (Fp8Lossless) and --fp8-input-scale dynamic|static
  // (Fp8InputScale), as given; check_checkpoint_flags checks the words.
  std::string fp8_lossless = "resident";
  std::string fp8_input_scale = "dynamic";
};

// Adds --transformer-file, --text-encoder-file, --fp8-lossless and --fp8-input-scale to `app`,
// bound to `flags` (its values are the defaults); returns the options in that order (flux2_server
// gives each its environment variable).
std::vector<CLI::Option*> add_checkpoint_flags(CLI::App& app, CheckpointFlags& flags);

// The words of --fp8-lossless and --fp8-input-scale: InvalidArgument naming the flag
// (`--fp8-lossless "lazy": expected resident or per_layer`). Whether static input scales fit the
// checkpoint is decided when it loads (Pipeline::load, check_fp8_input_scale).
absl::Status check_checkpoint_flags(const CheckpointFlags& flags);

// Sets `options`' transformer_file, text_encoder_file, fp8_lossless and fp8_input_scale from
// `flags` (check_checkpoint_flags' errors).
absl::Status apply_checkpoint_flags(const CheckpointFlags& flags, PipelineOptions& options);

// Help lines for the flags, indented as the help texts are.
std::string checkpoint_flags_help();

}  // namespace flux2
