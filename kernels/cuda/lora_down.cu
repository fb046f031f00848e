// lora_down_bf16; see lora_down.h. A CTA owns 64 rows of x and one K slice: 3-stage cp.async
// pipeline of 64-wide chunks of x's rows and of every stack's rows (the stacks read as one
// [R, K] operand), mma.sync m16n8k16 (bf16 in, fp32 out; 4 warps of 16 rows x R columns). One
// slice: the sums rounded to bf16 into t. Several: each CTA writes its fp32 sums, and a second
// kernel adds the slices in slice order and rounds once, so the bits do not depend on timing.
#include <cuda_bf16.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/lora_down.h"
#include "kernels/cuda/mma_bf16.cuh"

namespace flux2::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kTileM = 64;                 // rows of x per CTA
constexpr int kChunk = 64;                 // K per stage
constexpr int kStages = 3;                 // chunks in flight
constexpr int kThreads = 128;              // 4 warps, 16 rows each
constexpr int kStride = kChunk + 8;        // bf16 per shared row: conflict-free fragment loads
constexpr int kGroupsPerRow = kChunk / 8;  // 16-byte groups per chunk row
constexpr int kMinSlice = 256;             // K per split at least (partial sums cost a pass)

struct Stacks {
  const bf16* data[kLoraDownMaxStacks];
  int64_t stride[kLoraDownMaxStacks];
  int first[kLoraDownMaxStacks + 1];  // stack i holds operand rows [first[i], first[i + 1])
  int count;
};

struct Args {
  Mat x, t;
  Stacks a;
  int64_t slice;    // K per split (a multiple of kChunk)
  float* partials;  // [splits, x.rows, kR] when gridDim.y > 1
};

// 8 values at (row, k) of a row-major source into dst: one asynchronous copy where they are
// inside (rows and K are whole groups: K % 8 == 0), zeros where not.
__device__ __forceinline__ void load_group(const bf16* row_start, bool inside, int64_t k,
                                           int64_t k_end, bf16* dst) {
  if (inside && k < k_end) {
    cp_async16(dst, row_start + k);
  } else {
    *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
}

// Chunk [k0, k0 + kChunk) of x's tile rows and of the R operand rows into one stage.
template <int kR>
__device__ void load_stage(const Args& p, int64_t m0, int64_t k0, int64_t k_end, bf16* x_stage,
                           bf16* a_stage) {
  for (int i = threadIdx.x; i < kTileM * kGroupsPerRow; i += kThreads) {
    const int row = i / kGroupsPerRow, k = (i % kGroupsPerRow) * 8;
    const int64_t r = m0 + row;
    const bool inside = r < p.x.rows;
    const bf16* start = static_cast<const bf16*>(p.x.data) + (inside ? r : 0) * p.x.stride;
    load_group(start, inside, k0 + k, k_end, x_stage + row * kStride + k);
  }
  for (int i = threadIdx.x; i < kR * kGroupsPerRow; i += kThreads) {
    const int row = i / kGroupsPerRow, k = (i % kGroupsPerRow) * 8;
    int s = 0;
    while (s + 1 < p.a.count && row >= p.a.first[s + 1]) ++s;
    const bool inside = row < p.a.first[p.a.count];
    const bf16* start = p.a.data[s] + (inside ? row - p.a.first[s] : 0) * p.a.stride[s];
    load_group(start, inside, k0 + k, k_end, a_stage + row * kStride + k);
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// acc += the warp's 16 rows of the stage's x chunk · every operand row's chunkᵀ.
template <int kR>
__device__ void mma_stage(const bf16* x_stage, const bf16* a_stage, int lane,
                          float acc[kR / 8][4]) {
  const int g = lane / 4, q = lane % 4, row = (threadIdx.x / 32) * 16 + g;
#pragma unroll
  for (int kk = 0; kk < kChunk; kk += 16) {
    uint32_t a[4];
    a[0] = pair_at(x_stage + row * kStride + kk + 2 * q);
    a[1] = pair_at(x_stage + (row + 8) * kStride + kk + 2 * q);
    a[2] = pair_at(x_stage + row * kStride + kk + 2 * q + 8);
    a[3] = pair_at(x_stage + (row + 8) * kStride + kk + 2 * q + 8);
#pragma unroll
    for (int n = 0; n < kR / 8; ++n) {
      const bf16* b = a_stage + (n * 8 + g) * kStride + kk + 2 * q;
      mma_bf16(acc[n], a, pair_at(b), pair_at(b + 8));
    }
  }
}

// The thread's sums: rounded into t (one slice), or as they are into the slice's partials.
template <int kR>
__device__ void store_sums(const Args& p, int64_t m0, int lane, const float acc[kR / 8][4]) {
  const int g = lane / 4, q = lane % 4, rank = p.a.first[p.a.count];
#pragma unroll
  for (int n = 0; n < kR / 8; ++n) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t r = m0 + (threadIdx.x / 32) * 16 + g + 8 * half;
      const int c = n * 8 + 2 * q;
      if (r >= p.x.rows) continue;
      if (gridDim.y > 1) {
        float* out = p.partials + (blockIdx.y * p.x.rows + r) * kR + c;
        *reinterpret_cast<float2*>(out) = make_float2(acc[n][2 * half], acc[n][2 * half + 1]);
        continue;
      }
      bf16* out = static_cast<bf16*>(p.t.data) + r * p.t.stride + c;
      if (c < rank) out[0] = to_bf16(acc[n][2 * half]);
      if (c + 1 < rank) out[1] = to_bf16(acc[n][2 * half + 1]);
    }
  }
}

template <int kR>
__global__ void __launch_bounds__(kThreads) lora_down_kernel(Args p) {
  extern __shared__ __align__(16) unsigned char shared[];
  bf16* x_stages = reinterpret_cast<bf16*>(shared);
  bf16* a_stages = x_stages + kStages * kTileM * kStride;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kTileM;
  const int64_t k_begin = blockIdx.y * p.slice, k_end = min(p.x.cols, k_begin + p.slice);
  const int chunks = static_cast<int>((k_end - k_begin + kChunk - 1) / kChunk);
  auto x_stage = [&](int c) { return x_stages + (c % kStages) * kTileM * kStride; };
  auto a_stage = [&](int c) { return a_stages + (c % kStages) * kR * kStride; };
  for (int c = 0; c < kStages - 1; ++c) {  // empty groups past the last chunk keep the count
    if (c < chunks)
      load_stage<kR>(p, m0, k_begin + c * kChunk, k_end, x_stage(c), a_stage(c));
    else
      asm volatile("cp.async.commit_group;" ::: "memory");
  }
  float acc[kR / 8][4] = {};
  const int lane = threadIdx.x % 32;
  for (int c = 0; c < chunks; ++c) {
    const int next = c + kStages - 1;
    if (next < chunks) {
      load_stage<kR>(p, m0, k_begin + next * kChunk, k_end, x_stage(next), a_stage(next));
    } else {
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 1) : "memory");  // chunk c is in
    __syncthreads();
    mma_stage<kR>(x_stage(c), a_stage(c), lane, acc);
    __syncthreads();  // the next iteration loads into this stage
  }
  store_sums<kR>(p, m0, lane, acc);
}

// t[r, c] = bf16(sum over slices s in order of partials[s, r, c]).
__global__ void lora_down_sum_kernel(const float* partials, int splits, int64_t rows, int cols,
                                     int rank, Mat t) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * rank) return;
  const int64_t r = i / rank, c = i % rank;
  float sum = partials[r * cols + c];
  for (int s = 1; s < splits; ++s) sum += partials[(s * rows + r) * cols + c];
  static_cast<bf16*>(t.data)[r * t.stride + c] = to_bf16(sum);
}

template <int kR>
absl::Status launch(const Args& p, int splits, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.x.rows + kTileM - 1) / kTileM),
                  static_cast<unsigned>(splits));
  constexpr int kBytes = kStages * (kTileM + kR) * kStride * static_cast<int>(sizeof(bf16));
  // At every launch: the opt-in belongs to the current device's context (parallel_engine.h).
  const cudaError_t opted_in = cudaFuncSetAttribute(
      lora_down_kernel<kR>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
  if (opted_in != cudaSuccess) {
    return absl::InternalError(absl::StrCat(
        "lora_down: ", kBytes, " bytes of shared memory: ", cudaGetErrorString(opted_in)));
  }
  lora_down_kernel<kR><<<grid, kThreads, kBytes, stream>>>(p);
  FLUX_RETURN_IF_LAUNCH_FAILED("lora_down");
  if (splits == 1) return absl::OkStatus();
  const int rank = p.a.first[p.a.count];
  const int64_t n = p.x.rows * rank;
  lora_down_sum_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      p.partials, splits, p.x.rows, kR, rank, p.t);
  FLUX_RETURN_IF_LAUNCH_FAILED("lora_down sum");
  return absl::OkStatus();
}

}  // namespace

absl::string_view lora_down_unsupported(const Mat& x, const std::vector<Mat>& stacks,
                                        const Mat& t) {
  if (stacks.empty() || stacks.size() > kLoraDownMaxStacks) return "stacks";
  int64_t rank = 0;
  for (const Mat& a : stacks) {
    if (a.cols != x.cols || !rows_aligned16(a, 2)) return "stack_layout";
    rank += a.rows;
  }
  if (rank == 0 || rank > kLoraDownMaxRank || t.rows != x.rows || t.cols != rank) return "rank";
  if (x.cols == 0 || x.cols % 8 != 0 || !rows_aligned16(x, 2)) return "x_layout";
  if ((x.rows + kTileM - 1) / kTileM > 2147483647) return "rows";
  return "";
}

int lora_down_splits(int64_t rows, int64_t k, int sms) {
  if (rows <= 0 || k <= 0) return 1;  // nothing to split (an empty shard of sequence parallelism)
  // About two CTAs per SM, each slice at least kMinSlice of K.
  const int64_t tiles = (rows + kTileM - 1) / kTileM;
  const int64_t wanted = (2 * static_cast<int64_t>(sms) + tiles - 1) / tiles;
  const int64_t most = std::max<int64_t>(1, k / kMinSlice);
  return static_cast<int>(std::clamp<int64_t>(std::min(wanted, most), 1, 65535));
}

int lora_down_partial_cols(int64_t rank) {
  return static_cast<int>((rank + 31) / 32 * 32);
}

absl::Status lora_down_bf16(const Mat& x, const std::vector<Mat>& stacks, const Mat& t, int splits,
                            float* partials, cudaStream_t stream) {
  const absl::string_view why = lora_down_unsupported(x, stacks, t);
  if (!why.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("lora_down: x [", x.rows, ", ", x.cols,
                                                   "] with ", stacks.size(), " stacks into t [",
                                                   t.rows, ", ", t.cols, "]: ", why));
  }
  if (x.rows == 0) return absl::OkStatus();
  Args p{x, t, {}, 0, partials};
  p.a.count = static_cast<int>(stacks.size());
  for (size_t i = 0; i < stacks.size(); ++i) {
    p.a.data[i] = static_cast<const bf16*>(stacks[i].data);
    p.a.stride[i] = stacks[i].stride;
    p.a.first[i + 1] = p.a.first[i] + static_cast<int>(stacks[i].rows);
  }
  // Whole chunks per slice, so every slice but the last is full.
  const int64_t chunks = (x.cols + kChunk - 1) / kChunk;
  p.slice = (chunks + splits - 1) / splits * kChunk;
  splits = static_cast<int>((x.cols + p.slice - 1) / p.slice);
  if (splits > 1 && partials == nullptr) {
    return absl::InvalidArgumentError("lora_down: split K needs the partial sums' buffer");
  }
  switch (lora_down_partial_cols(t.cols)) {
    case 32:
      return launch<32>(p, splits, stream);
    case 64:
      return launch<64>(p, splits, stream);
    case 96:
      return launch<96>(p, splits, stream);
    case 128:
      return launch<128>(p, splits, stream);
    default:  // unreachable: lora_down_unsupported bounds the rank
      return absl::InternalError(absl::StrCat("lora_down: rank ", t.cols, " has no kernel"));
  }
}

}  // namespace flux2::cuda
