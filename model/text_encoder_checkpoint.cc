// Text-encoder checkpoint sources and their formats; see text_encoder_checkpoint.h.
// Tested by tests/host/text_encoder_fp8_test.cc.
#include "model/text_encoder_checkpoint.h"

#include <filesystem>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/base/status.h"

namespace flux2 {
namespace {

// `weights` with its FP8 layers (if any) applied, counted and named.
absl::StatusOr<TextEncoderCheckpoint> with_fp8_layers(
    ComponentWeights weights, const std::map<std::string, std::string>& metadata,
    std::string plain_format) {
  FLUX_ASSIGN_OR_RETURN(
      const Fp8Layers layers,
      collect_fp8_layers(Fp8Source{&weights.tensors(), &metadata, "", weights.dir(), false}));
  TextEncoderCheckpoint checkpoint{weights, std::move(plain_format), layers.layout};
  if (layers.layout != Fp8Layout::kNone) {
    checkpoint.weights = apply_fp8_layers(weights, layers);
    checkpoint.format = std::string(fp8_layout_name(layers.layout));
  }
  for (const auto& [name, ref] : checkpoint.weights.tensors()) {
    checkpoint.checkpoint_bytes += ref.entry->bytes();
    if (ref.fp8 != nullptr) ++checkpoint.fp8_tensors;
  }
  return checkpoint;
}

}  // namespace

std::string TextEncoderCheckpoint::describe() const {
  std::string text = describe_stored(format, fp8_layout, fp8_tensors, checkpoint_bytes);
  return text + ")";
}

absl::StatusOr<TextEncoderCheckpoint> open_text_encoder_folder(const std::string& dir) {
  FLUX_ASSIGN_OR_RETURN(ComponentWeights folder, ComponentWeights::open(dir));
  return with_fp8_layers(std::move(folder), {}, "diffusers");
}

absl::StatusOr<TextEncoderCheckpoint> open_text_encoder_file(const std::string& path,
                                                             nlohmann::json config,
                                                             const std::string& config_path) {
  if (std::filesystem::is_directory(path)) return open_text_encoder_folder(path);
  FLUX_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> opened, SafetensorsFile::open(path));
  std::shared_ptr<const SafetensorsFile> file = std::move(opened);
  std::map<std::string, TensorRef, std::less<>> tensors;
  for (const SafetensorsEntry& entry : file->entries())
    tensors.emplace(entry.name, TensorRef{file.get(), &entry});
  const std::map<std::string, std::string> metadata = file->metadata();
  ComponentWeights weights =
      ComponentWeights::from_view(path, std::move(config), config_path, std::move(tensors), file);
  return with_fp8_layers(std::move(weights), metadata, "file");
}

}  // namespace flux2
