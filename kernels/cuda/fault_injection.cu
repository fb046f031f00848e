// TEST ONLY fault kernels; see fault_injection.h. Tested by the fault tests of
// tests/cuda/server_gpu_test.cc.
#include <cstdint>

#include "kernels/cuda/fault_injection.h"

namespace flux2::cuda {
namespace {

__global__ void write_to_unmapped_address(int* address) {
  *address = 1;
}

__device__ uint64_t global_timer_ns() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

__global__ void spin_for(uint64_t ns) {
  const uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < ns) {
  }
}

}  // namespace

void launch_illegal_address_write(cudaStream_t stream) {
  // The lowest pages of the address space are never mapped.
  write_to_unmapped_address<<<1, 1, 0, stream>>>(reinterpret_cast<int*>(uintptr_t{64}));
}

void launch_spin(cudaStream_t stream, double seconds) {
  spin_for<<<1, 1, 0, stream>>>(static_cast<uint64_t>(seconds * 1e9));
}

}  // namespace flux2::cuda
