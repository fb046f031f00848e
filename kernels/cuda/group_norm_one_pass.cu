// GroupNorm statistics in one pass over x (quality=high); see group_norm_one_pass.h. Tested by
// tests/cuda/backend_ops_test.cc (against double sums) and tests/cuda/quality_high_test.cc.
#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/group_norm_one_pass.h"

namespace flux2::cuda {
namespace {

using bf16 = __nv_bfloat16;
// The two-pass statistics' layout (image_ops.cu): a fixed number of blocks, each a contiguous
// range of pixels; thread t reads 8 channels of every (256 / P)-th pixel (P = C / 8 packs).
constexpr int kBlocks = 512;
constexpr int kThreads = 256;

// A running (count, mean, M2) and Chan et al.'s merge of two, in float; count 0 merges as empty.
struct Moments {
  float n = 0.0f, mean = 0.0f, m2 = 0.0f;
};

__device__ __forceinline__ Moments merge(const Moments& a, const Moments& b) {
  if (b.n == 0.0f) return a;
  if (a.n == 0.0f) return b;
  const float n = __fadd_rn(a.n, b.n), delta = __fsub_rn(b.mean, a.mean);
  const float weight = __fdiv_rn(b.n, n);  // b's share of the merged count
  Moments out;
  out.n = n;
  out.mean = __fmaf_rn(delta, weight, a.mean);
  out.m2 = __fadd_rn(__fadd_rn(a.m2, b.m2), __fmul_rn(__fmul_rn(delta, delta), a.n * weight));
  return out;
}

__device__ __forceinline__ Moments shuffle_xor(const Moments& m, int mask) {
  return {__shfl_xor_sync(0xffffffffu, m.n, mask), __shfl_xor_sync(0xffffffffu, m.mean, mask),
          __shfl_xor_sync(0xffffffffu, m.m2, mask)};
}

// Each thread: Welford's update over its pixels for its 8 channels; the block then merges, per
// group, each channel's thread rows in order and the group's channels in order into
// partial[b * groups + g] = (mean, M2) over the block's pixels.
__global__ void __launch_bounds__(kThreads)
    moments_kernel(Mat x, int per_group, int groups, float2* partial) {
  __shared__ float2 channel_moments[kThreads * 8];  // [thread row][channel]: (mean, M2)
  const int cols = static_cast<int>(x.cols), packs = cols / 8, rows_per_pass = kThreads / packs;
  const int pack = threadIdx.x % packs, thread_row = threadIdx.x / packs;
  const int64_t begin = x.rows * blockIdx.x / kBlocks, end = x.rows * (blockIdx.x + 1) / kBlocks;
  if (thread_row < rows_per_pass) {
    float mean[8] = {}, m2[8] = {};
    float n = 0.0f;
    const bf16* column = static_cast<const bf16*>(x.data) + pack * 8;
#pragma unroll 4
    for (int64_t p = begin + thread_row; p < end; p += rows_per_pass) {
      float v[8];
      load8(column + p * x.stride, v);
      n = __fadd_rn(n, 1.0f);
      const float inverse = __frcp_rn(n);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float delta = __fsub_rn(v[i], mean[i]);
        mean[i] = __fmaf_rn(delta, inverse, mean[i]);
        m2[i] = __fmaf_rn(delta, __fsub_rn(v[i], mean[i]), m2[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)
      channel_moments[thread_row * cols + pack * 8 + i] = make_float2(mean[i], m2[i]);
  }
  __syncthreads();
  const int64_t pixels = end - begin;
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    Moments group;
    for (int c = g * per_group; c < (g + 1) * per_group; ++c) {
      Moments channel;
      for (int r = 0; r < rows_per_pass && r < pixels; ++r) {
        // Thread row r read pixels begin + r, begin + r + rows_per_pass, ... below end.
        const float count = static_cast<float>((pixels - r + rows_per_pass - 1) / rows_per_pass);
        const float2 m = channel_moments[r * cols + c];
        channel = merge(channel, Moments{count, m.x, m.y});
      }
      group = merge(group, channel);
    }
    partial[blockIdx.x * groups + g] = make_float2(group.mean, group.m2);
  }
}

// One warp per group: lane l merges blocks l, l + 32, ... in order, then a fixed butterfly.
__global__ void moments_finish_kernel(const float2* partial, int64_t rows, int per_group,
                                      int groups, float eps, float* mean, float* rstd) {
  const int g = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (g >= groups) return;
  Moments total;
  for (int b = lane; b < kBlocks; b += 32) {
    const int64_t pixels = rows * (b + 1) / kBlocks - rows * b / kBlocks;
    const float2 m = partial[b * groups + g];
    total = merge(total, Moments{static_cast<float>(pixels * per_group), m.x, m.y});
  }
  for (int mask = 16; mask > 0; mask >>= 1) {
    const Moments other = shuffle_xor(total, mask);
    // Both lanes of a pair merge (lower lane first), so every lane holds the same value.
    total = (lane & mask) ? merge(other, total) : merge(total, other);
  }
  if (lane != 0) return;
  mean[g] = total.mean;
  rstd[g] = rsqrtf(__fadd_rn(__fdiv_rn(total.m2, total.n), eps));
}

}  // namespace

bool group_norm_one_pass_supported(const Mat& x) {
  return x.cols % 8 == 0 && x.cols / 8 <= kThreads && rows_aligned16(x, 2);
}

absl::Status group_norm_statistics_one_pass_bf16(const Mat& x, int64_t groups, float eps,
                                                 float* mean, float* rstd, cudaStream_t stream) {
  if (groups <= 0 || x.cols <= 0 || x.cols % groups != 0 || !group_norm_one_pass_supported(x)) {
    return absl::InvalidArgumentError(
        absl::StrCat("group_norm (one pass): ", x.cols, " channels, ", groups, " groups"));
  }
  if (x.rows == 0) return absl::OkStatus();
  void* partial = nullptr;  // per-block (mean, M2) per group (stream-ordered allocation)
  FLUX_RETURN_IF_ERROR(cuda_status(
      cudaMallocAsync(&partial, sizeof(float2) * groups * kBlocks, stream), "group_norm scratch"));
  const int per_group = static_cast<int>(x.cols / groups);
  moments_kernel<<<kBlocks, kThreads, 0, stream>>>(x, per_group, static_cast<int>(groups),
                                                   static_cast<float2*>(partial));
  moments_finish_kernel<<<static_cast<unsigned>((groups + 7) / 8), 256, 0, stream>>>(
      static_cast<float2*>(partial), x.rows, per_group, static_cast<int>(groups), eps, mean, rstd);
  const cudaError_t launched = cudaGetLastError();
  FLUX_RETURN_IF_ERROR(cuda_status(cudaFreeAsync(partial, stream), "group_norm scratch free"));
  return cuda_status(launched, "group_norm one-pass statistics launch");
}

}  // namespace flux2::cuda
