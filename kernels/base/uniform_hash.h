// A counter-based uniform generator (splitmix64 of seed and index) usable on the host and in CUDA
// device code, so both backends fill "random" tensors with the same values. Tested by
// tests/host/tensor_test.cc (range and reproducibility).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FLUX_HOST_DEVICE __host__ __device__
#else
#define FLUX_HOST_DEVICE
#endif

namespace flux2 {

// A value in [0, 1) with 24 random bits, a pure function of (seed, index).
FLUX_HOST_DEVICE inline float uniform_hash(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

}  // namespace flux2
