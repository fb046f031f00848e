// A re-implementation of PyTorch's CPU torch.randn(n,
// generator=torch.Generator().manual_seed(seed)) (mt19937 + its Box-Muller layout), so a seed means
// the same initial noise as in diffusers. Tested by tests/host/torch_randn_test.cc and `flux2
// check-golden --only randn`.
#pragma once

#include <cstdint>
#include <vector>

namespace flux2 {

// torch.randn(numel, dtype=torch.float32) from a fresh generator seeded with `seed`.
std::vector<float> torch_randn_f32(uint64_t seed, int64_t numel);

// torch.randn(numel, dtype=torch.bfloat16): the bf16 values, widened to float.
std::vector<float> torch_randn_bf16(uint64_t seed, int64_t numel);

}  // namespace flux2
