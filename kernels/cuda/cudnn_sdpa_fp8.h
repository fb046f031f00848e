// FP8 (E4M3) fused attention through cuDNN's backend API for quality=high (issue 8): the
// composite graph cuDNN's FP8 flash-attention engine recognises (Q·Kᵀ, descales, softmax, P
// scaled to E4M3, P·V, descales, O scaled to E4M3, amax outputs), one plan per shape.
// Opt-in (FLUX2_FP8_ATTENTION=1): with cuDNN 9.14 on the H200 the only engine offered (engine 2)
// gives different bits on repeated identical calls for most FLUX shapes (PERF_NOTES.md, run 12).
// Tested against bf16 cuDNN attention by tests/cuda/attention_fp8_test.cc.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <tuple>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

// Operands of one FP8 attention call. q/k/v/o are E4M3 token-major matrices [S, H·d] (rows may be
// strided, in elements = bytes). Scales are device fp32 scalars: a descale multiplies a stored
// value back to the real one (descale = amax / 448), a scale divides (scale = 1 / descale).
struct Fp8AttentionArgs {
  Mat q, k, v, o;
  const float* descale_q = nullptr;
  const float* descale_k = nullptr;
  const float* descale_v = nullptr;
  const float* descale_s = nullptr;  // softmax probabilities: 1 / 448
  const float* scale_s = nullptr;    // 448
  const float* scale_o = nullptr;    // O stored = O · scale_o
  float* amax_s = nullptr;           // outputs required by the engine (max |P|, max |O| before scale_o)
  float* amax_o = nullptr;
};

class CudnnSdpaFp8 {
 public:
  static absl::StatusOr<std::unique_ptr<CudnnSdpaFp8>> create(cudaStream_t stream);
  ~CudnnSdpaFp8();
  CudnnSdpaFp8(const CudnnSdpaFp8&) = delete;
  CudnnSdpaFp8& operator=(const CudnnSdpaFp8&) = delete;

  // Non-causal, unmasked multi-head attention (kv heads == heads), head_dim a multiple of 16 and
  // <= 256, on a device of compute capability >= 9.0 (checked when building a plan).
  static bool supports(const AttentionParams& params, int64_t s_q, int64_t s_kv);
  // Builds the plan for this shape (once) and reports whether it is usable: an engine finalized
  // and two runs on the same random inputs gave the same bits (cuDNN does not note every engine
  // that is nondeterministic for some shapes). Synchronizes the stream when it builds a plan.
  absl::StatusOr<bool> usable(const Fp8AttentionArgs& args, const AttentionParams& params);
  // o = E4M3(SDPA(q·descale_q, k·descale_k, v·descale_v) · scale_o); Unimplemented when no engine
  // finalizes for the shape.
  absl::Status run(const Fp8AttentionArgs& args, const AttentionParams& params);

 private:
  struct Plan;
  // (s_q, s_kv, heads, head_dim, q/k/v/o row strides)
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

  CudnnSdpaFp8() = default;
  static Key key_of(const Fp8AttentionArgs& args, const AttentionParams& params);
  absl::StatusOr<Plan*> plan(const Key& key);
  absl::Status execute(Plan& plan, const Fp8AttentionArgs& args, float attn_scale);
  // Runs the plan twice on random E4M3 inputs of its shape and compares the outputs.
  absl::StatusOr<bool> runs_deterministically(Plan& plan, const Key& key);

  cudaStream_t stream_ = nullptr;

  void* handle_ = nullptr;  // cudnnHandle_t
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace flux2::cuda
