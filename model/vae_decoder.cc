// Placeholder until the VAE decoder lands (issue 3).
#include "model/vae_decoder.h"

namespace flux2 {

int64_t VaeConfig::scale_factor() const { return int64_t{1} << (block_out_channels.size() - 1); }

absl::StatusOr<VaeConfig> VaeConfig::from_json(const nlohmann::json& json, const std::string& source) {
  return absl::UnimplementedError("VAE decoder: not implemented yet");
}

absl::StatusOr<std::unique_ptr<VaeDecoder>> VaeDecoder::load(Backend& backend,
                                                            const ComponentWeights& checkpoint) {
  return absl::UnimplementedError("VAE decoder: not implemented yet");
}

std::vector<uint8_t> image_to_u8(std::span<const float> image) { return {}; }

}  // namespace flux2
