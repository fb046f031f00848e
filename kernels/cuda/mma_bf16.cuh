// The warp-level pieces the LoRA kernels (lora_up.cu, lora_down.cu) share: cp.async copies of 16
// bytes into shared memory and mma.sync m16n8k16 on bf16 with fp32 sums. Tested through
// tests/cuda/op_cases.cc (the lora_up_* and lora_down cases).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace flux2::cuda {

// 16 bytes from global to shared memory without registers (completed by a cp.async wait).
__device__ __forceinline__ void cp_async16(void* shared, const void* global) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(address), "l"(global));
}

// Two consecutive bf16 values as one 32-bit fragment register.
__device__ __forceinline__ uint32_t pair_at(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// c += a · b on one 16 x 8 x 16 tile (fragment layouts: PTX ISA, mma.m16n8k16 with .bf16).
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace flux2::cuda
