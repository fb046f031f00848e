// lora_up_add_bf16; see lora_up.h. A CTA owns a 64 x 128 tile of y, which it starts loading into
// registers (16 bytes per thread and group) before anything else; t's and b's rows of the tile go
// through shared memory in 32-wide chunks of r into mma.sync m16n8k16 (bf16 in, fp32 out; 8 warps
// as 2 x 4, each 32 x 32), the rounded scaled product is staged in shared memory, then added to
// the held y and written back in 16-byte rows (tests/cuda/op_cases.cc; --perf times it).
#include <cuda_bf16.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/lora_up.h"

namespace flux2::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kTileM = 64;      // rows of y (and of t) per CTA
constexpr int kTileN = 128;     // columns of y (rows of b) per CTA
constexpr int kChunk = 32;      // r per shared-memory chunk
constexpr int kThreads = 256;   // 8 warps: 2 along the rows x 4 along the columns, 32 x 32 each
constexpr int kOperandPad = 8;  // bf16 of padding per operand row: conflict-free fragment loads
constexpr int kOutPad = 8;      // and per staged output row
constexpr int kOperandStride = kChunk + kOperandPad;
constexpr int kOutStride = kTileN + kOutPad;
constexpr int kGroups = kTileN / 8;                            // 16-byte groups per tile row
constexpr int kGroupsPerThread = kTileM * kGroups / kThreads;  // y's groups each thread adds

struct OperandTiles {
  bf16 t[kTileM][kOperandStride];
  bf16 b[kTileN][kOperandStride];
};
union SharedTiles {
  OperandTiles operands;
  bf16 out[kTileM][kOutStride];  // bf16(bf16(t · bᵀ) · scale), staged for the coalesced add
};

__device__ __forceinline__ const bf16* at(const Mat& m, int64_t r, int64_t c) {
  return static_cast<const bf16*>(m.data) + r * m.stride + c;
}

// Rows [row0, row0 + kRows) x columns [k0, k0 + kChunk) of src into dst, zero outside src: 16
// bytes per load where src's rows allow it.
template <int kRows>
__device__ void load_chunk(const Mat& src, bool vectorized, int64_t row0, int64_t k0,
                           bf16 (*dst)[kOperandStride]) {
  constexpr int kVectors = kRows * kChunk / 8;
  for (int i = threadIdx.x; i < kVectors; i += kThreads) {
    const int row = i / (kChunk / 8), k = (i % (kChunk / 8)) * 8;
    const int64_t r = row0 + row, c = k0 + k;
    if (vectorized && r < src.rows && c + 8 <= src.cols) {
      *reinterpret_cast<uint4*>(&dst[row][k]) = *reinterpret_cast<const uint4*>(at(src, r, c));
      continue;
    }
    for (int j = 0; j < 8; ++j) {
      dst[row][k + j] =
          (r < src.rows && c + j < src.cols) ? *at(src, r, c + j) : __float2bfloat16_rn(0.0f);
    }
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

// acc += t-rows [wm·32, +32) · b-rows [wn·32, +32)ᵀ over one chunk (fragment layouts: PTX ISA,
// mma.m16n8k16 with .bf16: g = lane / 4 picks the row, q = lane % 4 the column pair).
__device__ void mma_chunk(const OperandTiles& s, int wm, int wn, int lane, float acc[2][4][4]) {
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
    for (int nj = 0; nj < 4; ++nj) {
      const int col = wn * 32 + nj * 8 + g;
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
                               const float acc[2][4][4]) {
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int nj = 0; nj < 4; ++nj) {
      const int row = wm * 32 + mi * 16 + g, col = wn * 32 + nj * 8 + 2 * q;
      const float* c = acc[mi][nj];
      *reinterpret_cast<__nv_bfloat162*>(&out[row][col]) = __floats2bfloat162_rn(
          __fmul_rn(round_bf16(c[0]), scale), __fmul_rn(round_bf16(c[1]), scale));
      *reinterpret_cast<__nv_bfloat162*>(&out[row + 8][col]) = __floats2bfloat162_rn(
          __fmul_rn(round_bf16(c[2]), scale), __fmul_rn(round_bf16(c[3]), scale));
    }
  }
}

// The thread's i-th 16-byte group of the y tile: its row and first column in the tile.
__device__ __forceinline__ void group_of(int i, int* row, int* col) {
  const int g = threadIdx.x + i * kThreads;
  *row = g / kGroups;
  *col = (g % kGroups) * 8;
}

// Whether group (r, c) of y is read and written as one 16-byte vector.
__device__ __forceinline__ bool whole_group(const Mat& y, bool vectorized, int64_t r, int64_t c) {
  return vectorized && r < y.rows && c + 8 <= y.cols;
}

// y's groups of this thread, loaded before the products so their latency overlaps them.
__device__ void prefetch_y(const Mat& y, bool vectorized, int64_t m0, int64_t n0,
                           uint4 held[kGroupsPerThread]) {
#pragma unroll
  for (int i = 0; i < kGroupsPerThread; ++i) {
    int row, col;
    group_of(i, &row, &col);
    const int64_t r = m0 + row, c = n0 + col;
    if (whole_group(y, vectorized, r, c)) {
      held[i] = *reinterpret_cast<const uint4*>(at(y, r, c));
    }
  }
}

// y-tile += staged products: the prefetched groups, element by element at the edges.
__device__ void add_staged(const Mat& y, bool vectorized, int64_t m0, int64_t n0,
                           const uint4 held[kGroupsPerThread], const bf16 (*out)[kOutStride]) {
#pragma unroll
  for (int i = 0; i < kGroupsPerThread; ++i) {
    int row, col;
    group_of(i, &row, &col);
    const int64_t r = m0 + row, c = n0 + col;
    bf16* dst = static_cast<bf16*>(y.data) + r * y.stride + c;
    if (whole_group(y, vectorized, r, c)) {
      float h[8], v[8];
      unpack_bf16x8(held[i], h);
      load8(&out[row][col], v);
#pragma unroll
      for (int j = 0; j < 8; ++j) h[j] = __fadd_rn(h[j], v[j]);
      *reinterpret_cast<uint4*>(dst) = pack_bf16x8(h);
      continue;
    }
    if (r >= y.rows) continue;
    for (int j = 0; j < 8 && c + j < y.cols; ++j) {
      dst[j] = to_bf16(__fadd_rn(to_f32(dst[j]), to_f32(out[row][col + j])));
    }
  }
}

// vectors: bit 0 y, bit 1 t, bit 2 b have 16-byte aligned rows.
__global__ void __launch_bounds__(kThreads, 3)
    lora_up_add_kernel(Mat y, Mat t, Mat b, float scale, unsigned vectors) {
  __shared__ __align__(16) SharedTiles shared;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const bool y_vectors = vectors & 1u;
  uint4 held[kGroupsPerThread];
  prefetch_y(y, y_vectors, m0, n0, held);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / 4, wn = warp % 4;
  float acc[2][4][4] = {};
  for (int64_t k0 = 0; k0 < t.cols; k0 += kChunk) {
    load_chunk<kTileM>(t, vectors & 2u, m0, k0, shared.operands.t);
    load_chunk<kTileN>(b, vectors & 4u, n0, k0, shared.operands.b);
    __syncthreads();
    mma_chunk(shared.operands, wm, wn, lane, acc);
    __syncthreads();  // the next chunk, or the staged output, overwrites the operands
  }
  stage_products(shared.out, wm, wn, lane, scale, acc);
  __syncthreads();
  add_staged(y, y_vectors, m0, n0, held, shared.out);
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
  const int64_t grid_y = (y.rows + kTileM - 1) / kTileM;
  if (grid_y > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora_up_add: ", y.rows, " rows exceed ", 65535 * kTileM));
  }
  const dim3 grid(static_cast<unsigned>((y.cols + kTileN - 1) / kTileN),
                  static_cast<unsigned>(grid_y));
  const unsigned vectors = (rows_aligned16(y, 2) ? 1u : 0u) | (rows_aligned16(t, 2) ? 2u : 0u) |
                           (rows_aligned16(b, 2) ? 4u : 0u);
  lora_up_add_kernel<<<grid, kThreads, 0, stream>>>(y, t, b, scale, vectors);
  FLUX_RETURN_IF_LAUNCH_FAILED("lora_up_add");
  return absl::OkStatus();
}

}  // namespace flux2::cuda
