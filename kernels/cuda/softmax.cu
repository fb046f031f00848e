// Row softmax kernel; see softmax.h. One block per row: max, sum of exp, normalise (fp32).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/softmax.h"

namespace flux2::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < warps ? scratch[lane] : -INFINITY;
    t = warp_max(t);
    if (lane == 0) scratch[0] = t;
  }
  __syncthreads();
  return scratch[0];
}

__global__ void __launch_bounds__(kThreads) softmax_kernel(Mat scores, Mat probs) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const float* in = static_cast<const float*>(scores.data) + r * scores.stride;
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(probs.data) + r * probs.stride;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < scores.cols; c += kThreads) m = fmaxf(m, in[c]);
  m = block_max(m, scratch);
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < scores.cols; c += kThreads) sum += expf(in[c] - m);
  const float inv = 1.0f / block_sum(sum, scratch);
  for (int64_t c = threadIdx.x; c < scores.cols; c += kThreads)
    out[c] = to_bf16(expf(in[c] - m) * inv);
}

}  // namespace

absl::Status softmax_rows_f32_to_bf16(const Mat& scores, const Mat& probs, cudaStream_t stream) {
  if (scores.rows != probs.rows || scores.cols != probs.cols) {
    return absl::InvalidArgumentError("softmax: shape mismatch");
  }
  if (scores.rows == 0) return absl::OkStatus();
  softmax_kernel<<<static_cast<unsigned>(scores.rows), kThreads, 0, stream>>>(scores, probs);
  FLUX_RETURN_IF_LAUNCH_FAILED("softmax");
  return absl::OkStatus();
}

}  // namespace flux2::cuda
