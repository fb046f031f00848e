// lora_up_add_bf16; see lora_up.h. A CTA owns a 128 x 128 tile of y: t's and b's rows of the tile
// go through shared memory in 32-wide chunks of r into mma.sync m16n8k16 (bf16 in, fp32 out; 8
// warps as 4 x 2, each 32 x 64), the rounded scaled product is staged in shared memory, then the
// tile of y is read, added to and written back in 16-byte rows (tests/cuda/op_cases.cc).
#include <cuda_bf16.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/lora_up.h"

namespace flux2::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kTile = 128;      // rows of y (and of t) and columns of y (rows of b) per CTA
constexpr int kChunk = 32;      // r per shared-memory chunk
constexpr int kThreads = 256;   // 8 warps: 4 along the rows x 2 along the columns
constexpr int kOperandPad = 8;  // bf16 of padding per operand row: conflict-free fragment loads
constexpr int kOutPad = 8;      // and per staged output row
constexpr int kOperandStride = kChunk + kOperandPad;
constexpr int kOutStride = kTile + kOutPad;

struct OperandTiles {
  bf16 t[kTile][kOperandStride];
  bf16 b[kTile][kOperandStride];
};
union SharedTiles {
  OperandTiles operands;
  bf16 out[kTile][kOutStride];  // bf16(bf16(t · bᵀ) · scale), staged for the coalesced add
};

__device__ __forceinline__ const bf16* at(const Mat& m, int64_t r, int64_t c) {
  return static_cast<const bf16*>(m.data) + r * m.stride + c;
}

// Rows [row0, row0 + kTile) x columns [k0, k0 + kChunk) of src into dst, zero outside src.
__device__ void load_chunk(const Mat& src, int64_t row0, int64_t k0, bf16 (*dst)[kOperandStride]) {
  const bf16 zero = __float2bfloat16_rn(0.0f);
  for (int i = threadIdx.x; i < kTile * kChunk; i += kThreads) {
    const int row = i / kChunk, k = i % kChunk;
    const int64_t r = row0 + row, c = k0 + k;
    dst[row][k] = (r < src.rows && c < src.cols) ? *at(src, r, c) : zero;
  }
}

__device__ __forceinline__ uint32_t pair_at(const bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// acc += t-rows [wm·32, +32) · b-rows [wn·64, +64)ᵀ over one chunk (fragment layouts: PTX ISA,
// mma.m16n8k16 with .bf16: g = lane / 4 picks the row, q = lane % 4 the column pair).
__device__ void mma_chunk(const OperandTiles& s, int wm, int wn, int lane, float acc[2][8][4]) {
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int kk = 0; kk < kChunk; kk += 16) {
    uint32_t a[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      const int row = wm * 32 + mi * 16 + g;
      a[mi][0] = pair_at(&s.t[row][kk + 2 * q]);
      a[mi][1] = pair_at(&s.t[row + 8][kk + 2 * q]);
      a[mi][2] = pair_at(&s.t[row][kk + 2 * q + 8]);
      a[mi][3] = pair_at(&s.t[row + 8][kk + 2 * q + 8]);
    }
#pragma unroll
    for (int nj = 0; nj < 8; ++nj) {
      const int col = wn * 64 + nj * 8 + g;
      const uint32_t b0 = pair_at(&s.b[col][kk + 2 * q]);
      const uint32_t b1 = pair_at(&s.b[col][kk + 2 * q + 8]);
      mma_bf16(acc[0][nj], a[0], b0, b1);
      mma_bf16(acc[1][nj], a[1], b0, b1);
    }
  }
}

// The warp's products, rounded (bf16(bf16(p) · scale): PEFT's lora_B output, then * scaling),
// into the staged output tile.
__device__ void stage_products(bf16 (*out)[kOutStride], int wm, int wn, int lane, float scale,
                               const float acc[2][8][4]) {
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int nj = 0; nj < 8; ++nj) {
      const int row = wm * 32 + mi * 16 + g, col = wn * 64 + nj * 8 + 2 * q;
      const float* c = acc[mi][nj];
      *reinterpret_cast<__nv_bfloat162*>(&out[row][col]) = __floats2bfloat162_rn(
          __fmul_rn(round_bf16(c[0]), scale), __fmul_rn(round_bf16(c[1]), scale));
      *reinterpret_cast<__nv_bfloat162*>(&out[row + 8][col]) = __floats2bfloat162_rn(
          __fmul_rn(round_bf16(c[2]), scale), __fmul_rn(round_bf16(c[3]), scale));
    }
  }
}

// y-tile += staged products: 16 bytes per thread and step when y's rows allow it.
__device__ void add_staged(const Mat& y, int64_t m0, int64_t n0, bool vectorized,
                           const bf16 (*out)[kOutStride]) {
  constexpr int kGroups = kTile / 8;  // 8-column groups per row
  for (int i = threadIdx.x; i < kTile * kGroups; i += kThreads) {
    const int row = i / kGroups, col = (i % kGroups) * 8;
    const int64_t r = m0 + row, c = n0 + col;
    if (r >= y.rows || c >= y.cols) continue;
    bf16* dst = static_cast<bf16*>(y.data) + r * y.stride + c;
    if (vectorized && c + 8 <= y.cols) {
      float h[8], v[8];
      load8(dst, h);
      load8(&out[row][col], v);
#pragma unroll
      for (int j = 0; j < 8; ++j) h[j] = __fadd_rn(h[j], v[j]);
      store8(dst, h);
      continue;
    }
    for (int j = 0; j < 8 && c + j < y.cols; ++j) {
      dst[j] = to_bf16(__fadd_rn(to_f32(dst[j]), to_f32(out[row][col + j])));
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    lora_up_add_kernel(Mat y, Mat t, Mat b, float scale, bool vectorized) {
  __shared__ __align__(16) SharedTiles shared;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / 2, wn = warp % 2;
  float acc[2][8][4] = {};
  for (int64_t k0 = 0; k0 < t.cols; k0 += kChunk) {
    load_chunk(t, m0, k0, shared.operands.t);
    load_chunk(b, n0, k0, shared.operands.b);
    __syncthreads();
    mma_chunk(shared.operands, wm, wn, lane, acc);
    __syncthreads();  // the next chunk, or the staged output, overwrites the operands
  }
  stage_products(shared.out, wm, wn, lane, scale, acc);
  __syncthreads();
  add_staged(y, m0, n0, vectorized, shared.out);
}

}  // namespace

absl::Status lora_up_add_bf16(const Mat& y, const Mat& t, const Mat& b, float scale,
                              cudaStream_t stream) {
  if (t.rows != y.rows || b.rows != y.cols || b.cols != t.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora_up_add: y [", y.rows, ", ", y.cols, "], t [", t.rows, ", ", t.cols,
                     "] and b [", b.rows, ", ", b.cols, "] do not make y += t · bᵀ"));
  }
  if (y.rows == 0 || y.cols == 0) return absl::OkStatus();
  const int64_t grid_y = (y.rows + kTile - 1) / kTile;
  if (grid_y > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora_up_add: ", y.rows, " rows exceed ", 65535 * kTile));
  }
  const dim3 grid(static_cast<unsigned>((y.cols + kTile - 1) / kTile),
                  static_cast<unsigned>(grid_y));
  lora_up_add_kernel<<<grid, kThreads, 0, stream>>>(y, t, b, scale, rows_aligned16(y, 2));
  FLUX_RETURN_IF_LAUNCH_FAILED("lora_up_add");
  return absl::OkStatus();
}

}  // namespace flux2::cuda
