// cuDNN legacy convolution plans; see cudnn_conv.h.
#include "kernels/cuda/cudnn_conv.h"

#include <cudnn.h>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/cudnn_graph.h"
#include "kernels/cuda/elementwise.h"

namespace flux2::cuda {

using dnn::check;  // cuDNN status -> absl::Status, shared with the SDPA plans

struct CudnnConv::Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnActivationDescriptor_t identity = nullptr;  // for the fused bias
  cudnnConvolutionFwdAlgo_t algo{};
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int64_t out_pixels = 0;  // output height x width
  ~Plan() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (bias) cudnnDestroyTensorDescriptor(bias);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (identity) cudnnDestroyActivationDescriptor(identity);
    if (workspace) cudaFree(workspace);
  }
};

absl::StatusOr<std::unique_ptr<CudnnConv>> CudnnConv::create(cudaStream_t stream) {
  std::unique_ptr<CudnnConv> conv(new CudnnConv());
  conv->stream_ = stream;
  FLUX_ASSIGN_OR_RETURN(cudnnHandle_t handle, dnn::create_handle(stream));
  conv->handle_ = handle;
  return conv;
}

CudnnConv::~CudnnConv() {
  plans_.clear();
  if (handle_ != nullptr) cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

absl::StatusOr<CudnnConv::Plan*> CudnnConv::plan(const Key& key) {
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second.get();
  const auto [h, w, cin, cout, k, stride] = key;
  auto p = std::make_unique<Plan>();
  FLUX_RETURN_IF_ERROR(check(cudnnCreateTensorDescriptor(&p->x), "x desc"));
  FLUX_RETURN_IF_ERROR(check(cudnnCreateTensorDescriptor(&p->y), "y desc"));
  FLUX_RETURN_IF_ERROR(check(cudnnCreateTensorDescriptor(&p->bias), "bias desc"));
  FLUX_RETURN_IF_ERROR(check(cudnnCreateFilterDescriptor(&p->w), "w desc"));
  FLUX_RETURN_IF_ERROR(check(cudnnCreateConvolutionDescriptor(&p->conv), "conv desc"));
  const int ih = static_cast<int>(h), iw = static_cast<int>(w), ic = static_cast<int>(cin);
  const int oc = static_cast<int>(cout), ks = static_cast<int>(k);
  // Stride 1: "same" padding k / 2. Stride 2: no padding (the caller pads, as Downsample2D does).
  const int st = static_cast<int>(stride), pad = st == 1 ? ks / 2 : 0;
  const int oh = (ih + 2 * pad - ks) / st + 1, ow = (iw + 2 * pad - ks) / st + 1;
  p->out_pixels = int64_t{oh} * ow;
  FLUX_RETURN_IF_ERROR(
      check(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NHWC, CUDNN_DATA_BFLOAT16, 1, ic, ih, iw),
            "x"));
  FLUX_RETURN_IF_ERROR(
      check(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NHWC, CUDNN_DATA_BFLOAT16, 1, oc, oh, ow),
            "y"));
  FLUX_RETURN_IF_ERROR(check(
      cudnnSetTensor4dDescriptor(p->bias, CUDNN_TENSOR_NHWC, CUDNN_DATA_BFLOAT16, 1, oc, 1, 1),
      "bias"));
  FLUX_RETURN_IF_ERROR(check(
      cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_NHWC, oc, ic, ks, ks),
      "w"));
  FLUX_RETURN_IF_ERROR(
      check(cudnnSetConvolution2dDescriptor(p->conv, pad, pad, st, st, 1, 1,
                                            CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            "conv"));
  FLUX_RETURN_IF_ERROR(
      check(cudnnSetConvolutionMathType(p->conv, CUDNN_TENSOR_OP_MATH), "math type"));
  FLUX_RETURN_IF_ERROR(check(cudnnCreateActivationDescriptor(&p->identity), "activation desc"));
  FLUX_RETURN_IF_ERROR(check(cudnnSetActivationDescriptor(p->identity, CUDNN_ACTIVATION_IDENTITY,
                                                          CUDNN_PROPAGATE_NAN, 0.0),
                             "identity"));
  cudnnConvolutionFwdAlgoPerf_t perf[8];
  int returned = 0;
  FLUX_RETURN_IF_ERROR(
      check(cudnnGetConvolutionForwardAlgorithm_v7(static_cast<cudnnHandle_t>(handle_), p->x, p->w,
                                                   p->conv, p->y, 8, &returned, perf),
            "algorithm"));
  bool chosen = false;
  for (int i = 0; i < returned && !chosen; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    p->algo = perf[i].algo;
    chosen = true;
  }
  if (!chosen)
    return absl::UnimplementedError(
        absl::StrCat("cuDNN has no convolution for ", h, "x", w, "x", cin, " -> ", cout));
  FLUX_RETURN_IF_ERROR(
      check(cudnnGetConvolutionForwardWorkspaceSize(static_cast<cudnnHandle_t>(handle_), p->x, p->w,
                                                    p->conv, p->y, p->algo, &p->workspace_bytes),
            "workspace size"));
  if (p->workspace_bytes > 0) {
    FLUX_RETURN_IF_ERROR(
        cuda_status(cudaMalloc(&p->workspace, p->workspace_bytes), "conv workspace"));
  }
  Plan* raw = p.get();
  plans_.emplace(key, std::move(p));
  return raw;
}

absl::Status CudnnConv::forward(const Plan& p, const void* x, const void* w, void* out) {
  const float one = 1.0f, zero = 0.0f;
  return check(
      cudnnConvolutionForward(static_cast<cudnnHandle_t>(handle_), &one, p.x, x, p.w, w, p.conv,
                              p.algo, p.workspace, p.workspace_bytes, &zero, p.y, out),
      "convolution");
}

absl::Status CudnnConv::convolve(const void* x, int64_t height, int64_t width, int64_t cin,
                                 const void* w, int64_t cout, int64_t ksize, void* out,
                                 int64_t stride) {
  FLUX_ASSIGN_OR_RETURN(Plan * p, plan(Key{height, width, cin, cout, ksize, stride}));
  return forward(*p, x, w, out);
}

absl::Status CudnnConv::run(const void* x, int64_t height, int64_t width, int64_t cin,
                            const void* w, int64_t cout, int64_t ksize, const void* bias, void* out,
                            int64_t stride) {
  FLUX_ASSIGN_OR_RETURN(Plan * p, plan(Key{height, width, cin, cout, ksize, stride}));
  FLUX_RETURN_IF_ERROR(forward(*p, x, w, out));
  // PyTorch's bias add, bf16(f32(conv) + f32(bias)), by our kernel: cudnnAddTensor, which it
  // replaced, moved a third of the bytes per second (1024x1024x128: 0.43 ms, the convolution 0.42).
  const Mat y{out, p->out_pixels, cout, cout};
  return add_row_bf16(y, Mat{const_cast<void*>(bias), 1, cout, cout}, p->out_pixels, y, stream_);
}

absl::StatusOr<bool> CudnnConv::fuses_bias(int64_t height, int64_t width, int64_t cin, int64_t cout,
                                           int64_t ksize) {
  FLUX_ASSIGN_OR_RETURN(Plan * p, plan(Key{height, width, cin, cout, ksize, 1}));
  return p->algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
}

absl::Status CudnnConv::run_fused_bias(const void* x, int64_t height, int64_t width, int64_t cin,
                                       const void* w, int64_t cout, int64_t ksize, const void* bias,
                                       void* out, const void* residual) {
  FLUX_ASSIGN_OR_RETURN(Plan * p, plan(Key{height, width, cin, cout, ksize, 1}));
  if (p->algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) {
    return absl::FailedPreconditionError("cuDNN fuses the bias only into IMPLICIT_PRECOMP_GEMM");
  }
  const float one = 1.0f, zero = 0.0f;
  // y = identity(1 · conv(x) + alpha2 · z + bias): z = the residual (alpha2 = 1), or y itself
  // with alpha2 = 0 (not read for its value).
  const void* z = residual != nullptr ? residual : out;
  return check(cudnnConvolutionBiasActivationForward(
                   static_cast<cudnnHandle_t>(handle_), &one, p->x, x, p->w, w, p->conv, p->algo,
                   p->workspace, p->workspace_bytes, residual != nullptr ? &one : &zero, p->y, z,
                   p->bias, bias, p->identity, p->y, out),
               "convolution with bias");
}

}  // namespace flux2::cuda
