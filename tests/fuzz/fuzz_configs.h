// The tiny transformer configs the fuzz targets check files against, shared with the host tests
// that open the targets' seed corpora (tests/host/fp8_checkpoint_test.cc), so a seed and its test
// cannot drift apart. Header-only; changing one invalidates that target's corpus.
#pragma once

#include "model/flux2_config.h"

namespace flux2::fuzzing {

// fuzz_fp8_checkpoint: one head of 8, one double and one single block, no guidance embedding.
inline Flux2Config fp8_fuzz_config() {
  Flux2Config c;
  c.num_attention_heads = 1;
  c.attention_head_dim = 8;
  c.axes_dims_rope = {2, 2, 2, 2};
  c.num_layers = 1;
  c.num_single_layers = 1;
  c.joint_attention_dim = 8;
  c.in_channels = 8;
  c.out_channels = 8;
  c.timestep_guidance_channels = 16;
  c.guidance_embeds = false;
  return c;
}

// fuzz_lora_adapter: two heads of 4, one double and one single block, with the guidance embedding
// (dev's modules too).
inline Flux2Config lora_fuzz_config() {
  Flux2Config c;
  c.num_attention_heads = 2;
  c.attention_head_dim = 4;
  c.num_layers = 1;
  c.num_single_layers = 1;
  c.joint_attention_dim = 8;
  c.in_channels = 8;
  c.out_channels = 8;
  c.guidance_embeds = true;
  return c;
}

}  // namespace flux2::fuzzing
