// Rotary-embedding tables computed on the host: FLUX.2's 4-axis interleaved table (model/README.md,
// "RoPE"; float64 angles like diffusers) and Qwen3's half-split table (HF, float32 angles).
// Tested by tests/host/small_units_test.cc.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace flux2 {

struct RopeTables {
  std::vector<float> cos;  // [S, Dh] row-major
  std::vector<float> sin;  // [S, Dh]
};

// FLUX.2 positions: ids [S, axes] integer coordinates (t, h, w, l); each axis a owns
// axes_dims[a] consecutive head dims, frequencies theta^(-2j/dim), repeat-interleaved pairs.
RopeTables flux2_rope_tables(std::span<const int64_t> ids, const std::vector<int64_t>& axes_dims,
                             double theta);

// Qwen3 positions 0..S-1: frequencies base^(-2j/Dh) (float32), the two halves duplicated.
RopeTables qwen3_rope_tables(int64_t seq_len, int64_t head_dim, double base);

// FLUX.2 position ids: text tokens (0, 0, 0, l) and noise-latent tokens (0, row, col, 0),
// row-major over an h x w grid. Each returns [count, 4] flattened.
std::vector<int64_t> flux2_text_ids(int64_t text_len);
std::vector<int64_t> flux2_image_ids(int64_t height_tokens, int64_t width_tokens);

}  // namespace flux2
