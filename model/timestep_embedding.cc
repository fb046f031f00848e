// Sinusoidal embeddings; see timestep_embedding.h.
#include "model/timestep_embedding.h"

#include <cmath>

namespace flux2 {

std::vector<float> timestep_sinusoids(std::span<const float> values, int64_t channels) {
  const int64_t half = channels / 2;
  // diffusers: exponent = (−ln(10000) · arange(half)) / half, float32 ops on a float64 constant.
  const float neg_log_period = static_cast<float>(-std::log(10000.0));
  std::vector<float> frequencies(static_cast<size_t>(half));
  for (int64_t k = 0; k < half; ++k) {
    const float exponent = (neg_log_period * static_cast<float>(k)) / static_cast<float>(half);
    frequencies[k] = std::exp(exponent);
  }
  std::vector<float> out(values.size() * static_cast<size_t>(channels));
  for (size_t i = 0; i < values.size(); ++i) {
    float* row = out.data() + i * channels;
    for (int64_t k = 0; k < half; ++k) {
      const float angle = values[i] * frequencies[k];
      row[k] = std::cos(angle);
      row[half + k] = std::sin(angle);
    }
  }
  return out;
}

float round_to_activation(float value, DType activation_dtype) {
  return activation_dtype == DType::kBF16 ? round_to_bf16(value) : value;
}

float scale_conditioning(float value, DType activation_dtype) {
  return round_to_activation(round_to_activation(value, activation_dtype) * 1000.0f,
                             activation_dtype);
}

}  // namespace flux2
