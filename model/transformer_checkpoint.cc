// Transformer checkpoint sources and their formats; see transformer_checkpoint.h.
// Tested by tests/host/fp8_checkpoint_test.cc and tests/host/bfl_checkpoint_test.cc.
#include "model/transformer_checkpoint.h"

#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/base/status.h"
#include "model/bfl_checkpoint.h"

namespace flux2 {
namespace {

// Fills the byte and FP8 counts of `checkpoint` from its weights.
void count_weights(TransformerCheckpoint& checkpoint) {
  for (const auto& [name, ref] : checkpoint.weights.tensors()) {
    checkpoint.checkpoint_bytes += ref.entry->bytes();
    if (ref.fp8 != nullptr) ++checkpoint.fp8_tensors;
  }
}

}  // namespace

std::string TransformerCheckpoint::describe() const {
  std::string text = describe_stored(format, fp8_layout, fp8_tensors, checkpoint_bytes);
  if (ignored_scales > 0)
    absl::StrAppend(&text, ", ", ignored_scales, " scales of bf16 layers ignored");
  return text + ")";
}

absl::StatusOr<TransformerCheckpoint> open_transformer_folder(const std::string& dir) {
  FLUX_ASSIGN_OR_RETURN(ComponentWeights folder, ComponentWeights::open(dir));
  FLUX_ASSIGN_OR_RETURN(const bool modelopt,
                        modelopt_quantization(folder.config(), folder.config_path()));
  const std::map<std::string, std::string> no_metadata;
  FLUX_ASSIGN_OR_RETURN(
      const Fp8Layers layers,
      collect_fp8_layers(Fp8Source{&folder.tensors(), &no_metadata, "", dir, modelopt}));
  TransformerCheckpoint checkpoint{folder, "diffusers", layers.layout};
  if (layers.layout != Fp8Layout::kNone) {
    checkpoint.weights = apply_fp8_layers(folder, layers);
    checkpoint.format = std::string(fp8_layout_name(layers.layout));
    checkpoint.ignored_scales = layers.ignored_scales;
  }
  count_weights(checkpoint);
  return checkpoint;
}

absl::StatusOr<TransformerCheckpoint> open_transformer_file(const std::string& path,
                                                            nlohmann::json config,
                                                            const std::string& config_path) {
  if (std::filesystem::is_directory(path)) return open_transformer_folder(path);
  FLUX_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::open(path));
  if (!is_bfl_transformer(*file)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        ": not a Black Forest Labs FLUX.2 transformer (no double_blocks.0.img_attn.qkv.weight); "
        "diffusers-named weights belong in a transformer/ folder (a ModelOpt FP8 folder too)"));
  }
  FLUX_ASSIGN_OR_RETURN(const Fp8Layers layers, bfl_fp8_layers(*file));
  FLUX_ASSIGN_OR_RETURN(
      ComponentWeights weights,
      open_bfl_transformer(std::move(file), std::move(config), config_path, layers));
  TransformerCheckpoint checkpoint{std::move(weights), "bfl", layers.layout};
  if (layers.layout != Fp8Layout::kNone)
    checkpoint.format = std::string(fp8_layout_name(layers.layout));
  checkpoint.ignored_scales = layers.ignored_scales;
  count_weights(checkpoint);
  return checkpoint;
}

}  // namespace flux2
