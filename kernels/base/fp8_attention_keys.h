// The key layout of quality=high's FP8 attention, shared by the CUDA kernel
// (kernels/cuda/flash_attention_fp8.cu) and the CPU backend's emulation: keys come in one or two
// segments (a call's own keys, then cached ones: klein-KV's reference keys), each quantized per
// head and block of 128 keys counted from its own first key, so a block never straddles segments
// and a cached segment's bytes do not depend on the call. The kernel walks tiles of 128 keys: every
// tile of segment 0, then every tile of segment 1. Tested by
// tests/host/attention_cached_keys_test.cc.
#pragma once

#include "kernels/base/fp8_nvfp4.h"  // FLUX_HOST_DEVICE

namespace flux2 {

inline constexpr int kFp8AttentionKeyBlock = 128;  // keys per quantization block and kernel tile

// Blocks (tiles) of 128 that `keys` keys fill, the last one partial.
FLUX_HOST_DEVICE inline int fp8_attention_tiles(int keys) {
  return (keys + kFp8AttentionKeyBlock - 1) / kFp8AttentionKeyBlock;
}

// Tile `j` of the whole key sequence [segment 0 ; segment 1] (0 <= j < tiles(keys0) +
// tiles(keys1)): its segment, its index within the segment (the block its scales belong to, and
// its first key tile · 128 there) and how many of its 128 keys exist (1..128; the rest are masked).
struct Fp8KeyTile {
  int segment;
  int tile;
  int valid;
};
FLUX_HOST_DEVICE inline Fp8KeyTile fp8_attention_key_tile(int keys0, int keys1, int j) {
  const int tiles0 = fp8_attention_tiles(keys0);
  const int segment = j >= tiles0 ? 1 : 0;
  const int tile = j - segment * tiles0;
  const int valid = (segment == 0 ? keys0 : keys1) - tile * kFp8AttentionKeyBlock;
  return Fp8KeyTile{segment, tile, valid < kFp8AttentionKeyBlock ? valid : kFp8AttentionKeyBlock};
}

}  // namespace flux2
