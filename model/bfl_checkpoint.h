// A FLUX.2 transformer from a Black Forest Labs single-file checkpoint (flux2-dev.safetensors, the
// naming ComfyUI users have), presented as the diffusers-named ComponentWeights that
// Flux2Weights::table asks for, so Flux2Transformer::load takes it as it takes transformer/.
// Tested by tests/host/bfl_checkpoint_test.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/checkpoint.h"
#include "model/flux2_config.h"
#include "model/fp8_checkpoint.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace flux2 {

// A prefix some BFL-named files put before every name (ComfyUI's whole-checkpoint layout).
inline constexpr char kBflModelPrefix[] = "model.diffusion_model.";

// One run of rows that a BFL tensor shares with a diffusers tensor (rows of the first dimension;
// a 1-D tensor's elements are its rows).
struct BflRows {
  std::string diffusers_name;  // e.g. "transformer_blocks.0.attn.to_k.weight"
  int64_t bfl_row = 0;         // first row in the BFL tensor
  int64_t diffusers_row = 0;   // first row in the diffusers tensor
  int64_t rows = 0;
};

// One tensor of a BFL FLUX.2 transformer and where its rows go under diffusers names.
struct BflTensor {
  std::string name;            // e.g. "double_blocks.0.img_attn.qkv.weight" (no prefix)
  Shape shape;                 // its shape in the BFL file
  std::vector<BflRows> parts;  // in BFL row order, covering each of its rows once
};

// Every tensor a BFL checkpoint of `config` holds, and how its rows map onto the tensors of
// Flux2Weights::table(config) (which they cover exactly once): the mapping of diffusers'
// scripts/convert_flux2_to_diffusers.py. Renames, plus: a double block's fused qkv [3D, D] is
// to_q | to_k | to_v (add_*_proj for text); the final adaLN [2D, D] is shift | scale where
// diffusers' norm_out is scale | shift. The guidance embedder is there only when
// config.guidance_embeds (dev; klein has none).
std::vector<BflTensor> bfl_transformer_tensors(const Flux2Config& config);

// Whether `file` names a FLUX.2 transformer the BFL way: it has
// double_blocks.0.img_attn.qkv.weight, bare or after kBflModelPrefix. Reads the header only.
bool is_bfl_transformer(const SafetensorsFile& file);
// The same for the safetensors file at `path`; an error when it cannot be opened as one.
absl::StatusOr<bool> is_bfl_transformer_file(const std::string& path);

// The name prefix of a BFL file: kBflModelPrefix when its tensors carry it, else "".
std::string bfl_prefix(const SafetensorsFile& file);

// The FP8 layers of a BFL-named file (model/fp8_checkpoint.h; Fp8Layout::kNone for a bf16 one).
absl::StatusOr<Fp8Layers> bfl_fp8_layers(const SafetensorsFile& file);

// Opens the BFL single file `path` as the transformer component: its tensors under the names of
// Flux2Weights::table(config), where `config` is the transformer's config.json (BFL files have
// none: pass <model>/transformer/config.json or a preset's) and `config_path` names it in errors.
// Row splits are views into the mapped file (no copy); only the final adaLN's scale/shift swap is
// copied into memory the result owns (2D x D elements: 151 MB of bf16 for dev), since the tensor
// table takes each diffusers tensor as one contiguous block. The file stays mapped while the
// result lives. One InvalidArgument names every missing BFL tensor (with the diffusers tensors it
// would give), every mis-shaped one and every tensor with no diffusers counterpart. dir() of the
// result is `path`. An FP8 file (any layout of model/fp8_checkpoint.h) gives its F8_E4M3 weights
// as they are stored, each TensorRef carrying its scales (split or joined with the rows: a fused
// qkv's per-row scales go with each projection's rows); its scale and marker tensors are consumed.
absl::StatusOr<ComponentWeights> open_bfl_transformer(const std::string& path,
                                                      nlohmann::json config,
                                                      const std::string& config_path);
// The same for a file already open, whose FP8 layers `fp8` are (bfl_fp8_layers).
absl::StatusOr<ComponentWeights> open_bfl_transformer(std::unique_ptr<SafetensorsFile> file,
                                                      nlohmann::json config,
                                                      const std::string& config_path,
                                                      const Fp8Layers& fp8);

// The transformer/config.json diffusers would write for `config`, for open_bfl_transformer with
// a preset (flux2_preset("dev")) when the model directory has no transformer/ folder.
nlohmann::json flux2_config_json(const Flux2Config& config);

}  // namespace flux2
