// Where the text encoder's weights come from and in what form: the checkpoint's text_encoder/
// folder, or one safetensors file given by --text-encoder-file (HF tensor names, as ComfyUI's
// text-encoder files keep them), bf16 or in one of the FP8 layouts of model/fp8_checkpoint.h
// (ComfyUI's mistral_3_small_flux2_fp8.safetensors: comfy_quant or scaled_fp8). Tested by
// tests/host/text_encoder_fp8_test.cc.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "model/checkpoint.h"
#include "model/fp8_checkpoint.h"
#include "nlohmann/json.hpp"

namespace flux2 {

// A text-encoder checkpoint under HF names, and what it was.
struct TextEncoderCheckpoint {
  ComponentWeights weights;
  std::string format;  // "diffusers" (a folder), "file" (a bf16 single file), or an FP8 layout
  Fp8Layout fp8_layout = Fp8Layout::kNone;
  int64_t checkpoint_bytes = 0;  // bytes of every tensor as stored
  int64_t fp8_tensors = 0;       // weights stored as F8_E4M3 (with their scales)

  // "bfl_fp8 (210 FP8 tensors, 18.030 GB as stored)", for the start-up log.
  std::string describe() const;
};

// The checkpoint's text_encoder/ folder (config.json + safetensors; FP8 layers detected as in a
// single file).
absl::StatusOr<TextEncoderCheckpoint> open_text_encoder_folder(const std::string& dir);

// `path`, one safetensors file holding the text encoder under HF names, with `config` (the
// checkpoint's text_encoder/config.json, read from `config_path`). Its FP8 layout is detected from
// its keys and header and checked (collect_fp8_layers: mixed layouts, E5M2, scales of the wrong
// shape, ... are refused naming the tensor); a folder is opened as a text_encoder/ folder.
absl::StatusOr<TextEncoderCheckpoint> open_text_encoder_file(const std::string& path,
                                                             nlohmann::json config,
                                                             const std::string& config_path);

}  // namespace flux2
