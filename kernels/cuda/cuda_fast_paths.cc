// The CUDA backend's policy table and preconditions; see cuda_fast_paths.h.
#include "kernels/cuda/cuda_fast_paths.h"

#include <array>
#include <deque>

#include "kernels/cuda/cudnn_sdpa.h"
#include "kernels/cuda/flash_attention_fp8.h"
#include "kernels/cuda/group_norm_one_pass.h"
#include "kernels/cuda/norms.h"
#include "kernels/cuda/swiglu_fp8.h"

namespace flux2::cuda {
namespace {

using Kind = FastPathKind;
constexpr Kind kFused = FastPathKind::kFused;
constexpr Kind kImplementation = FastPathKind::kImplementation;

// Lossless fused kernels are proven bit-identical to their eager chains by
// tests/cuda/op_cases.cc (gpu_op_test); the quality=high paths carry measured bounds
// (kernels/README.md).
constexpr std::array<FastPathSpec, static_cast<size_t>(CudaPath::kCount)> kTable = {{
    {"gate_residual", kFused, Quality::kLossless, "x += gate * update in one pass; any bf16 shape"},
    {"swiglu", kFused, Quality::kLossless, "silu(gate) * up in one pass; any bf16 shape"},
    {"layer_norm_modulate", kFused, Quality::kLossless,
     "LayerNorm + (1 + scale), + shift in one pass; any bf16 shape"},
    {"qk_norm_rope", kFused, Quality::kLossless,
     "per-head RMSNorm + RoPE in place; any bf16 shape"},
    {"token_concat", kFused, Quality::kLossless,
     "attention and SwiGLU outputs written straight into a column range of a wider buffer"},
    {"cudnn_attention", kImplementation, Quality::kLossless,
     "cuDNN SDPA: non-causal, no key mask (else not applicable); head_dim % 8 == 0, <= 256, "
     "16-byte aligned rows"},
    {"flash_attention_fp8", kImplementation, Quality::kHigh,
     "our FP8 attention: sm_90a, non-causal, no key mask (else not applicable); head_dim 128, "
     "as many kv heads as heads, any number of keys (klein-KV's cached ones as a second "
     "segment), 16-byte aligned rows; --fp8-attention on"},
    {"fp8_linear", kImplementation, Quality::kHigh,
     "FP8 GEMM (NVFP4 on Blackwell) of a registered weight: no bias, K % 16 == 0 (NVFP4: 32)"},
    {"swiglu_fp8", kFused, Quality::kHigh,
     "SwiGLU writing its GEMM's E4M3 rows (rowwise FP8; a scale per row, or the weight's static "
     "input scale): K % 16 == 0, 16-byte aligned rows"},
    {"layer_norm_fp8", kFused, Quality::kHigh,
     "LayerNorm + modulation writing only its GEMM's E4M3 rows (rowwise FP8; a scale per row, or "
     "the weight's static input scale): K % 16 == 0"},
    {"conv_fused_bias", kImplementation, Quality::kHigh,
     "bias (and the resnet shortcut) in cuDNN's epilogue: when the algorithm can fuse it"},
    {"conv_bias_residual", kFused, Quality::kLossless,
     "a convolution's bias add and the resnet's shortcut add in one pass; any bf16 shape"},
    {"lora_up_swiglu", kFused, Quality::kLossless,
     "LoRA's B products added to a SwiGLU's input and the SwiGLU in one pass; any bf16 shape"},
    {"lora_up_gate_residual", kFused, Quality::kLossless,
     "LoRA's B products added to a block's output and its gated residual in one pass; any bf16 "
     "shape"},
    {"lora_up_qk_norm_rope", kFused, Quality::kLossless,
     "LoRA's B products added to q or k and their per-head RMSNorm + RoPE in one pass: head_dim "
     "128, 8-byte aligned rows, 16-byte aligned RoPE table rows"},
    {"group_norm_one_pass", kFused, Quality::kHigh,
     "GroupNorm's statistics in one pass over x (Welford, fixed merge tree): C % 8 == 0, C <= "
     "2048, 16-byte aligned rows"},
}};

constexpr absl::string_view kUnsupportedShape = "unsupported_shape";

}  // namespace

const FastPathSpec& fast_path_spec(CudaPath path) {
  return kTable[static_cast<size_t>(path)];
}

FastPath& fast_path(CudaPath path) {
  static std::deque<FastPath>* paths = [] {
    auto* all = new std::deque<FastPath>();  // lives for the process, like the registry
    for (const FastPathSpec& spec : kTable) all->emplace_back(spec);
    return all;
  }();
  return (*paths)[static_cast<size_t>(path)];
}

bool cudnn_attention_applies(const AttentionParams& params) {
  return !params.causal && params.num_valid_keys < 0;
}

absl::string_view cudnn_attention_unsupported(const Mat& q, const Mat& k, const Mat& v,
                                              const AttentionParams& params, const Mat& out) {
  return CudnnSdpa::supports(q, k, v, params, out) ? "" : kUnsupportedShape;
}

absl::string_view flash_attention_fp8_unsupported(const AttentionParams& params, const Mat& q,
                                                  const Mat& k, const Mat& v) {
  if (!flash_attention_fp8_available()) return "unsupported_device";
  return flash_attention_fp8_supports(params, q, k, v) ? "" : kUnsupportedShape;
}

absl::string_view fp8_linear_unsupported(int64_t k, bool has_bias, bool nvfp4) {
  return !has_bias && k % (nvfp4 ? 32 : 16) == 0 ? "" : kUnsupportedShape;
}

absl::string_view swiglu_fp8_unsupported(int64_t k, const Mat& prefix, const Mat& gate,
                                         const Mat& up) {
  return k % 16 == 0 && swiglu_fp8_rows_supported(prefix, gate, up) ? "" : kUnsupportedShape;
}

absl::string_view layer_norm_fp8_unsupported(const Mat& x) {
  return x.cols % 16 == 0 && layer_norm_writes_fp8(x) ? "" : kUnsupportedShape;
}

absl::string_view conv_fused_bias_unsupported(bool algorithm_fuses) {
  return algorithm_fuses ? "" : "algorithm_cannot_fuse";
}

absl::string_view group_norm_one_pass_unsupported(const Mat& x) {
  return group_norm_one_pass_supported(x) ? "" : kUnsupportedShape;
}

}  // namespace flux2::cuda
