// Placeholder until the Qwen3 text encoder lands (issue 3).
#include "model/qwen3_encoder.h"

namespace flux2 {

absl::StatusOr<Qwen3Config> Qwen3Config::from_json(const nlohmann::json& json, const std::string& source) {
  return absl::UnimplementedError("Qwen3 text encoder: not implemented yet");
}

absl::StatusOr<std::unique_ptr<Qwen3Encoder>> Qwen3Encoder::load(Backend& backend,
                                                                const ComponentWeights& checkpoint,
                                                                std::vector<int64_t> taps) {
  return absl::UnimplementedError("Qwen3 text encoder: not implemented yet");
}

}  // namespace flux2
