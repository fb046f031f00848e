// The CUDA backend's policy table (kernels/README.md, "The fast-path policy"): every fast path with
// its kind (fused kernel or implementation: which switch it honours), the quality it serves at and
// its preconditions, each checked before launch (CUTLASS's can_implement) by the *_unsupported
// functions below. Ops run a path only through CudaBackend::run_path (cuda_backend_impl.h), the
// registry's one rule. Tested by tests/cuda/fast_path_fallback_test.cc and the op tests.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "kernels/base/fast_path_registry.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

enum class CudaPath : uint8_t {
  kGateResidual,
  kSwiglu,
  kLayerNormModulate,
  kQkNormRope,
  kTokenConcat,
  kCudnnAttention,
  kFlashAttentionFp8,
  kFp8Linear,
  kSwigluFp8,
  kLayerNormFp8,
  kConvFusedBias,
  kConvBiasResidual,
  kLoraUpSwiglu,
  kLoraUpGateResidual,
  kLoraUpQkNormRope,
  kGroupNormOnePass,
  kCount,
};

// The registered path (all of them are registered together, at the first call).
FastPath& fast_path(CudaPath path);
// The table itself, in CudaPath order (for documentation and GetModelInfo).
const FastPathSpec& fast_path_spec(CudaPath path);

// Preconditions: "" when the path serves the call, else the fallback reason it is counted under.
// A call a path never serves by design (cuDNN's SDPA and causal attention) is not a fallback: the
// op does not consult the path at all (see cudnn_attention_applies).

// cuDNN SDPA serves the transformer's attention (non-causal, no key mask); the text encoder's
// causal, padded attention is not applicable and runs the plain kernel uncounted.
bool cudnn_attention_applies(const AttentionParams& params);
absl::string_view cudnn_attention_unsupported(const Mat& q, const Mat& k, const Mat& v,
                                              const AttentionParams& params, const Mat& out);
// Our FP8 flash attention (quality=high, the transformer's attention; causal attention is not
// applicable): an sm_90a device, head_dim 128, as many kv heads as heads, k and v with the same
// rows (any number: klein-KV's queries over more keys too).
absl::string_view flash_attention_fp8_unsupported(const AttentionParams& params, const Mat& q,
                                                  const Mat& k, const Mat& v);
// The FP8 GEMM (the NVFP4 one on Blackwell) of a registered weight: no bias, and K a multiple of
// 16 (NVFP4: 32, for 16-byte rows of packed values).
absl::string_view fp8_linear_unsupported(int64_t k, bool has_bias, bool nvfp4);
// SwiGLU writing its GEMM's E4M3 rows (rowwise FP8 only): K % 16 and the kernel's row layout.
absl::string_view swiglu_fp8_unsupported(int64_t k, const Mat& prefix, const Mat& gate,
                                         const Mat& up);
// LayerNorm + modulation writing only its GEMM's E4M3 rows (rowwise FP8 only).
absl::string_view layer_norm_fp8_unsupported(const Mat& x);
// The convolution's bias (and residual) in cuDNN's epilogue: only the algorithm that fuses it.
absl::string_view conv_fused_bias_unsupported(bool algorithm_fuses);
// GroupNorm's statistics in one pass (quality=high): the vectorized layout (C % 8, C <= 2048,
// 16-byte aligned rows).
absl::string_view group_norm_one_pass_unsupported(const Mat& x);

}  // namespace flux2::cuda
