// Fused attention through cuDNN's SDPA operation (the backend API's
// CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, cuDNN >= 9.13, no cudnn-frontend): bf16 Q/K/V/O
// read and written in place in token-major buffers (row strides), one execution plan per shape
// built on first use. Serves non-causal, unmasked attention with head_dim a multiple of 8
// and <= 256; anything else is Unimplemented and the caller falls back.
// Tested against the CPU reference and the fallback kernel by tests/cuda/op_cases.cc (gpu_op_test).
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <tuple>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

class CudnnSdpa {
 public:
  static absl::StatusOr<std::unique_ptr<CudnnSdpa>> create(cudaStream_t stream);
  ~CudnnSdpa();
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;

  // True when the shape is one cuDNN's SDPA engines can serve (checked before building a plan).
  static bool supports(const Mat& q, const Mat& k, const Mat& v, const AttentionParams& params,
                       const Mat& out);
  // out = SDPA(q, k, v); Unimplemented when no engine finalizes for the shape.
  absl::Status run(const Mat& q, const Mat& k, const Mat& v, const AttentionParams& params,
                   const Mat& out);

 private:
  struct Plan;
  // (s_q, s_kv, heads, kv heads, head_dim, q/k/v/o row strides)
  using Key =
      std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

  CudnnSdpa() = default;
  absl::StatusOr<Plan*> plan(const Key& key);

  void* handle_ = nullptr;  // cudnnHandle_t
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace flux2::cuda
