// NHWC bf16 convolution (stride 1 with "same" padding, or stride 2 unpadded) through cuDNN's legacy
// convolution API (cudnnConvolutionForward, [O, kh, kw, I] filters): tensor-op math, algorithm
// chosen once per shape, the bias added as a separate pass (PyTorch's two roundings; our kernel, as
// cudnnAddTensor reads and writes at a third of the bandwidth) or in cuDNN's epilogue (one
// rounding). Tested against the CPU backend by tests/cuda/op_cases.cc (gpu_op_test), the bias add
// by backend_ops_test.cc.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <tuple>

#include "absl/status/statusor.h"

namespace flux2::cuda {

class CudnnConv {
 public:
  static absl::StatusOr<std::unique_ptr<CudnnConv>> create(cudaStream_t stream);
  ~CudnnConv();
  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;

  // out [H, W, Cout] = bf16(bf16(conv(x [H, W, Cin], w [Cout, k, k, Cin])) + bias [Cout]), as
  // PyTorch computes it (the convolution, then a separate bias add); all contiguous bf16. With
  // stride 2 there is no padding: out is [(H - k) / 2 + 1, (W - k) / 2 + 1, Cout].
  absl::Status run(const void* x, int64_t height, int64_t width, int64_t cin, const void* w,
                   int64_t cout, int64_t ksize, const void* bias, void* out, int64_t stride = 1);
  // out = bf16(conv(x, w)): the convolution alone (run() before its bias add), for a caller that
  // adds the bias in its own pass (CudaBackend::conv2d_add: bias and shortcut together).
  absl::Status convolve(const void* x, int64_t height, int64_t width, int64_t cin, const void* w,
                        int64_t cout, int64_t ksize, void* out, int64_t stride = 1);
  // out = bf16(conv(x, w) + bias [+ residual]) with the bias (and the residual [H, W, Cout], when
  // not null) added in the convolution's epilogue: one rounding and no second pass over the output
  // (which costs as much as the convolution at 128 channels). Only where fuses_bias() (cuDNN fuses
  // an identity activation only into IMPLICIT_PRECOMP_GEMM).
  absl::Status run_fused_bias(const void* x, int64_t height, int64_t width, int64_t cin,
                              const void* w, int64_t cout, int64_t ksize, const void* bias,
                              void* out, const void* residual = nullptr);
  // Whether the shape's algorithm (chosen once, as for run()) can take the bias in its epilogue.
  absl::StatusOr<bool> fuses_bias(int64_t height, int64_t width, int64_t cin, int64_t cout,
                                  int64_t ksize);

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;  // H W Cin Cout k s
  CudnnConv() = default;
  absl::StatusOr<Plan*> plan(const Key& key);
  // out = bf16(conv(x, w)) with plan p (run() and convolve()).
  absl::Status forward(const Plan& p, const void* x, const void* w, void* out);

  cudaStream_t stream_ = nullptr;
  void* handle_ = nullptr;  // cudnnHandle_t
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace flux2::cuda
