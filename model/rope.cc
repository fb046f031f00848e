// Rotary-embedding tables; see rope.h. Tested by tests/host/small_units_test.cc.
#include "model/rope.h"

#include <cmath>

#include "kernels/base/status.h"

namespace flux2 {

RopeTables flux2_rope_tables(std::span<const int64_t> ids, const std::vector<int64_t>& axes_dims,
                             double theta) {
  const int64_t axes = static_cast<int64_t>(axes_dims.size());
  FLUX_CHECK(axes > 0 && ids.size() % axes == 0);
  const int64_t seq = static_cast<int64_t>(ids.size()) / axes;
  int64_t head_dim = 0;
  for (int64_t dim : axes_dims) head_dim += dim;
  RopeTables tables;
  tables.cos.resize(static_cast<size_t>(seq * head_dim));
  tables.sin.resize(static_cast<size_t>(seq * head_dim));
  for (int64_t s = 0; s < seq; ++s) {
    int64_t offset = 0;
    for (int64_t a = 0; a < axes; ++a) {
      const int64_t dim = axes_dims[a];
      // diffusers casts the ids to float32, then computes the angles in float64.
      const double position = static_cast<float>(ids[s * axes + a]);
      for (int64_t j = 0; j < dim / 2; ++j) {
        const double frequency = 1.0 / std::pow(theta, static_cast<double>(2 * j) / dim);
        const double angle = position * frequency;
        for (int64_t k = 0; k < 2; ++k) {
          const size_t index = static_cast<size_t>(s * head_dim + offset + 2 * j + k);
          tables.cos[index] = static_cast<float>(std::cos(angle));
          tables.sin[index] = static_cast<float>(std::sin(angle));
        }
      }
      offset += dim;
    }
  }
  return tables;
}

RopeTables qwen3_rope_tables(int64_t seq_len, int64_t head_dim, double base) {
  const int64_t half = head_dim / 2;
  RopeTables tables;
  tables.cos.resize(static_cast<size_t>(seq_len * head_dim));
  tables.sin.resize(static_cast<size_t>(seq_len * head_dim));
  for (int64_t j = 0; j < half; ++j) {
    // HF: inv_freq = 1 / base ** (arange(0, dim, 2).float() / dim), all float32.
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(head_dim);
    const float inv_freq = 1.0f / std::pow(static_cast<float>(base), exponent);
    for (int64_t s = 0; s < seq_len; ++s) {
      const float angle = static_cast<float>(s) * inv_freq;
      const float c = std::cos(angle), sn = std::sin(angle);
      for (int64_t k : {j, j + half}) {
        tables.cos[static_cast<size_t>(s * head_dim + k)] = c;
        tables.sin[static_cast<size_t>(s * head_dim + k)] = sn;
      }
    }
  }
  return tables;
}

std::vector<int64_t> flux2_text_ids(int64_t text_len) {
  std::vector<int64_t> ids(static_cast<size_t>(text_len * 4), 0);
  for (int64_t l = 0; l < text_len; ++l) ids[static_cast<size_t>(l * 4 + 3)] = l;
  return ids;
}

std::vector<int64_t> flux2_image_ids(int64_t height_tokens, int64_t width_tokens) {
  std::vector<int64_t> ids(static_cast<size_t>(height_tokens * width_tokens * 4), 0);
  for (int64_t r = 0; r < height_tokens; ++r) {
    for (int64_t c = 0; c < width_tokens; ++c) {
      const size_t base = static_cast<size_t>((r * width_tokens + c) * 4);
      ids[base + 1] = r;
      ids[base + 2] = c;
    }
  }
  return ids;
}

}  // namespace flux2
