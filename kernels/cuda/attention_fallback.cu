// The fallback attention kernel; see attention_fallback.h. One warp per query row, 8 rows (same
// head) per block sharing 32-key tiles of K and V staged in shared memory; lane t scores key t of
// the tile, then every lane accumulates its slice of the output dims.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "kernels/cuda/attention_fallback.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"

namespace flux2::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kWarps = 8;  // query rows per block
constexpr int kTile = 32;  // keys per shared-memory tile (one per lane)
constexpr int kMaxHeadDim = 512;

// Shared-memory row pitch in floats: +1 keeps lanes reading different keys on different banks.
__host__ __device__ constexpr int pitch(int head_dim) {
  return head_dim + 1;
}

template <int kDimsPerLane>
__global__ void attention_kernel(Mat q, Mat k, Mat v, Mat out, int head_dim, int group, float scale,
                                 bool causal, int64_t valid_keys) {
  extern __shared__ float smem[];
  const int p = pitch(head_dim);
  float* k_tile = smem;                // [kTile][p]
  float* v_tile = k_tile + kTile * p;  // [kTile][p]
  float* q_rows = v_tile + kTile * p;  // [kWarps][p]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int head = blockIdx.y, kv_head = head / group;
  const int64_t row = int64_t{blockIdx.x} * kWarps + warp;
  const bool active = row < q.rows;

  float* q_row = q_rows + warp * p;
  if (active) {
    const bf16* src = static_cast<const bf16*>(q.data) + row * q.stride + int64_t{head} * head_dim;
    for (int d = lane; d < head_dim; d += 32) q_row[d] = __fmul_rn(to_f32(src[d]), scale);
  }
  float acc[kDimsPerLane];
#pragma unroll
  for (int j = 0; j < kDimsPerLane; ++j) acc[j] = 0.0f;
  float running_max = -INFINITY, running_sum = 0.0f;

  // Keys this block can need: up to its last row when causal.
  const int64_t last_row = std::min<int64_t>(q.rows, int64_t{blockIdx.x + 1} * kWarps) - 1;
  const int64_t key_end = causal ? std::min<int64_t>(valid_keys, last_row + 1) : valid_keys;
  const int64_t row_key_end = causal ? std::min<int64_t>(valid_keys, row + 1) : valid_keys;

  for (int64_t base = 0; base < key_end; base += kTile) {
    __syncthreads();  // previous tile fully consumed
    for (int i = threadIdx.x; i < kTile * head_dim; i += blockDim.x) {
      const int t = i / head_dim, d = i % head_dim;
      const int64_t key = base + t;
      float kv = 0.0f, vv = 0.0f;
      if (key < key_end) {
        kv = to_f32(
            static_cast<const bf16*>(k.data)[key * k.stride + int64_t{kv_head} * head_dim + d]);
        vv = to_f32(
            static_cast<const bf16*>(v.data)[key * v.stride + int64_t{kv_head} * head_dim + d]);
      }
      k_tile[t * p + d] = kv;
      v_tile[t * p + d] = vv;
    }
    __syncthreads();
    if (!active) continue;
    // Lane t scores key base + t.
    const int64_t key = base + lane;
    float score = -INFINITY;
    if (key < row_key_end) {
      const float* kr = k_tile + lane * p;
      float dot = 0.0f;
      for (int d = 0; d < head_dim; ++d) dot = fmaf(q_row[d], kr[d], dot);
      score = dot;
    }
    const float tile_max = warp_max(score);
    const float new_max = fmaxf(running_max, tile_max);
    if (new_max == -INFINITY) continue;  // nothing visible yet
    const float correction = expf(running_max - new_max);
    const float prob = score == -INFINITY ? 0.0f : expf(score - new_max);
    running_sum = running_sum * correction + warp_sum(prob);
    running_max = new_max;
#pragma unroll
    for (int j = 0; j < kDimsPerLane; ++j) acc[j] *= correction;
    for (int t = 0; t < kTile; ++t) {
      const float pt = __shfl_sync(0xffffffffu, prob, t);
      if (pt == 0.0f) continue;
      const float* vr = v_tile + t * p;
#pragma unroll
      for (int j = 0; j < kDimsPerLane; ++j) {
        const int d = lane + 32 * j;
        if (d < head_dim) acc[j] = fmaf(pt, vr[d], acc[j]);
      }
    }
  }
  if (!active) return;
  bf16* dst = static_cast<bf16*>(out.data) + row * out.stride + int64_t{head} * head_dim;
  const float inv = running_sum > 0.0f ? 1.0f / running_sum : 0.0f;
#pragma unroll
  for (int j = 0; j < kDimsPerLane; ++j) {
    const int d = lane + 32 * j;
    if (d < head_dim) dst[d] = to_bf16(acc[j] * inv);
  }
}

template <int kDimsPerLane>
absl::Status launch(const Mat& q, const Mat& k, const Mat& v, const AttentionParams& params,
                    const Mat& out, cudaStream_t stream) {
  const int head_dim = static_cast<int>(params.head_dim);
  const size_t smem = sizeof(float) * (2 * kTile + kWarps) * pitch(head_dim);
  auto kernel = attention_kernel<kDimsPerLane>;
  FLUX_RETURN_IF_ERROR(
      cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)),
                  "attention_fallback: shared memory"));
  const dim3 grid(static_cast<unsigned>((q.rows + kWarps - 1) / kWarps),
                  static_cast<unsigned>(params.num_heads));
  const int64_t valid =
      params.num_valid_keys < 0 ? k.rows : std::min(k.rows, params.num_valid_keys);
  kernel<<<grid, kWarps * 32, smem, stream>>>(
      q, k, v, out, head_dim, static_cast<int>(params.num_heads / params.num_kv_heads),
      params.scale, params.causal, valid);
  FLUX_RETURN_IF_LAUNCH_FAILED("attention_fallback");
  return absl::OkStatus();
}

}  // namespace

absl::Status attention_fallback(const Mat& q, const Mat& k, const Mat& v,
                                const AttentionParams& params, const Mat& out,
                                cudaStream_t stream) {
  const int64_t h = params.num_heads, hk = params.num_kv_heads, d = params.head_dim;
  if (h <= 0 || hk <= 0 || h % hk != 0 || d <= 0 || d > kMaxHeadDim || q.cols != h * d ||
      out.cols != h * d || k.cols != hk * d || v.cols != hk * d || k.rows != v.rows ||
      out.rows != q.rows) {
    return absl::InvalidArgumentError(absl::StrCat("attention_fallback: unsupported layout: q [",
                                                   q.rows, ", ", q.cols, "], k [", k.rows, ", ",
                                                   k.cols, "], ", h, "/", hk, " heads of dim ", d));
  }
  if (q.rows == 0) return absl::OkStatus();
  if (d <= 32) return launch<1>(q, k, v, params, out, stream);
  if (d <= 64) return launch<2>(q, k, v, params, out, stream);
  if (d <= 128) return launch<4>(q, k, v, params, out, stream);
  if (d <= 256) return launch<8>(q, k, v, params, out, stream);
  return launch<16>(q, k, v, params, out, stream);
}

}  // namespace flux2::cuda
