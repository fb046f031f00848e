// One LoRA term's B side, the operand of Backend::lora_up_add and its fused consumers. A plain
// struct; tested with those ops (tests/host/lora_apply_test.cc, tests/cuda/op_cases.cc).
#pragma once

#include <cstdint>

#include "kernels/base/tensor.h"

namespace flux2 {

// round(round(t · bᵀ) · scale) is added, and the sum rounded, to the output's columns
// [out_offset, out_offset + b.rows()).
struct LoraUpTerm {
  Tensor t;  // [M, r]: lora_A(x)
  Tensor b;  // [out, r]
  float scale = 1.0f;
  int64_t out_offset = 0;
};

}  // namespace flux2
