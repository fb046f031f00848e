// lora_up_*_bf16; see lora_up.h. A CTA owns a 64 x 128 tile of y (two for the SwiGLU: its gate
// and up columns), which it loads into registers before anything else. Per term, t's and b's rows
// of the tile go through shared memory in 32-wide chunks of r into mma.sync m16n8k16 (bf16 in,
// fp32 out; 8 warps as 2 x 4, each 32 x 32), the rounded scaled product is staged in shared
// memory and added to the held tile; the epilogue then stores y, or the SwiGLU, or the gated
// residual, in 16-byte rows (tests/cuda/op_cases.cc; --perf times it).
#include <cuda_bf16.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/lora_up.h"

namespace flux2::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kTileM = 64;      // rows of y (and of t) per CTA
constexpr int kTileN = 128;     // columns of y (rows of b) per CTA and view
constexpr int kChunk = 32;      // r per shared-memory chunk
constexpr int kThreads = 256;   // 8 warps: 2 along the rows x 4 along the columns, 32 x 32 each
constexpr int kOperandPad = 8;  // bf16 of padding per operand row: conflict-free fragment loads
constexpr int kOutPad = 8;      // and per staged output row
constexpr int kOperandStride = kChunk + kOperandPad;
constexpr int kOutStride = kTileN + kOutPad;
constexpr int kGroups = kTileN / 8;                            // 16-byte groups per tile row
constexpr int kGroupsPerThread = kTileM * kGroups / kThreads;  // y's groups each thread adds
constexpr int kMaxTerms = 8;                                   // per launch (more: several)

// One term on one view (a column range) of y: view column c takes b's row c + b_row0, and has no
// term where that row is outside [0, b.rows).
struct ViewTerm {
  Mat t, b;
  float scale;
  int64_t b_row0;
  unsigned vectors;  // bit 1: t, bit 2: b have 16-byte aligned rows
};
struct View {
  Mat y;
  bool y_vectors;
  int count;
  ViewTerm term[kMaxTerms];
};
struct Views {
  View v[2];  // [0] only, or the SwiGLU's gate and up columns
};

enum class Epilogue { kStore, kSwiglu, kGateResidual };
struct EpilogueArgs {
  Mat out;   // kSwiglu: [M, F]; kGateResidual: the stream x [M, N]
  Mat gate;  // kGateResidual: [1, N]
  SiluMath silu = SiluMath::kExact;
  bool out_vectors = false, gate_vectors = false;
};

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
__device__ __forceinline__ bf16* mut_at(const Mat& m, int64_t r, int64_t c) {
  return static_cast<bf16*>(m.data) + r * m.stride + c;
}

// Rows [row0, row0 + kRows) x columns [k0, k0 + kChunk) of src into dst, zero outside src (row0
// may be negative): 16 bytes per load where src's rows allow it.
template <int kRows>
__device__ void load_chunk(const Mat& src, bool vectorized, int64_t row0, int64_t k0,
                           bf16 (*dst)[kOperandStride]) {
  constexpr int kVectors = kRows * kChunk / 8;
  for (int i = threadIdx.x; i < kVectors; i += kThreads) {
    const int row = i / (kChunk / 8), k = (i % (kChunk / 8)) * 8;
    const int64_t r = row0 + row, c = k0 + k;
    const bool inside = r >= 0 && r < src.rows;
    if (vectorized && inside && c + 8 <= src.cols) {
      *reinterpret_cast<uint4*>(&dst[row][k]) = *reinterpret_cast<const uint4*>(at(src, r, c));
      continue;
    }
    for (int j = 0; j < 8; ++j) {
      dst[row][k + j] =
          (inside && c + j < src.cols) ? *at(src, r, c + j) : __float2bfloat16_rn(0.0f);
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

// The thread's i-th 16-byte group of a tile: its row and first column in the tile.
__device__ __forceinline__ void group_of(int i, int* row, int* col) {
  const int g = threadIdx.x + i * kThreads;
  *row = g / kGroups;
  *col = (g % kGroups) * 8;
}

// Group (r, c) of m as 8 packed bf16: one 16-byte load where it is whole, zeros outside m.
__device__ uint4 load_group(const Mat& m, bool vectorized, int64_t r, int64_t c) {
  if (r >= m.rows) return make_uint4(0, 0, 0, 0);
  if (vectorized && c + 8 <= m.cols) return *reinterpret_cast<const uint4*>(at(m, r, c));
  float v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = c + j < m.cols ? to_f32(*at(m, r, c + j)) : 0.0f;
  return pack_bf16x8(v);  // exact: the values are bf16
}

// The 8 values (bf16-exact or to be rounded) into group (r, c) of m, inside m only.
__device__ void store_group(const Mat& m, bool vectorized, int64_t r, int64_t c, const float v[8]) {
  if (r >= m.rows) return;
  if (vectorized && c + 8 <= m.cols) {
    *reinterpret_cast<uint4*>(mut_at(m, r, c)) = pack_bf16x8(v);
    return;
  }
  for (int j = 0; j < 8 && c + j < m.cols; ++j) *mut_at(m, r, c + j) = to_bf16(v[j]);
}

// The held tile of view `v` += the staged products, on the columns the term covers.
__device__ void add_staged(const View& v, const ViewTerm& term, int64_t n0,
                           uint4 held[kGroupsPerThread], const bf16 (*out)[kOutStride]) {
#pragma unroll
  for (int i = 0; i < kGroupsPerThread; ++i) {
    int row, col;
    group_of(i, &row, &col);
    const int64_t first = n0 + col + term.b_row0;  // b's row of the group's first column
    float h[8], p[8];
    unpack_bf16x8(held[i], h);
    load8(&out[row][col], p);
    if (first >= 0 && first + 8 <= term.b.rows) {
#pragma unroll
      for (int j = 0; j < 8; ++j) h[j] = __fadd_rn(h[j], p[j]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (first + j >= 0 && first + j < term.b.rows) h[j] = __fadd_rn(h[j], p[j]);
      }
    }
    held[i] = pack_bf16x8(h);
  }
}

// Whether the term has any of the tile's columns [n0, n0 + kTileN) inside y's.
__device__ __forceinline__ bool covers_tile(const View& v, const ViewTerm& term, int64_t n0) {
  const int64_t lo = max(n0, -term.b_row0);
  const int64_t hi = min(min(n0 + kTileN, v.y.cols), term.b.rows - term.b_row0);
  return lo < hi;
}

// Every term of view v added to its held tile, in order.
__device__ void add_terms(const View& v, int64_t m0, int64_t n0, SharedTiles& shared,
                          uint4 held[kGroupsPerThread]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / 4, wn = warp % 4;
  for (int i = 0; i < v.count; ++i) {
    const ViewTerm& term = v.term[i];
    if (!covers_tile(v, term, n0)) continue;  // the same for the whole CTA
    float acc[2][4][4] = {};
    for (int64_t k0 = 0; k0 < term.t.cols; k0 += kChunk) {
      load_chunk<kTileM>(term.t, term.vectors & 2u, m0, k0, shared.operands.t);
      load_chunk<kTileN>(term.b, term.vectors & 4u, n0 + term.b_row0, k0, shared.operands.b);
      __syncthreads();
      mma_chunk(shared.operands, wm, wn, lane, acc);
      __syncthreads();  // the next chunk, or the staged output, overwrites the operands
    }
    stage_products(shared.out, wm, wn, lane, term.scale, acc);
    __syncthreads();
    add_staged(v, term, n0, held, shared.out);
    __syncthreads();  // the next term's operands overwrite the staged output
  }
}

template <Epilogue kEpilogue>
__device__ void finish(const Views& views, const EpilogueArgs& e, int64_t m0, int64_t n0,
                       const uint4 (*held)[kGroupsPerThread]) {
#pragma unroll
  for (int i = 0; i < kGroupsPerThread; ++i) {
    int row, col;
    group_of(i, &row, &col);
    const int64_t r = m0 + row, c = n0 + col;
    float y[8];
    unpack_bf16x8(held[0][i], y);
    if constexpr (kEpilogue == Epilogue::kStore) {
      store_group(views.v[0].y, views.v[0].y_vectors, r, c, y);
    } else if constexpr (kEpilogue == Epilogue::kGateResidual) {
      float x[8], g[8];
      unpack_bf16x8(load_group(e.out, e.out_vectors, r, c), x);
      unpack_bf16x8(load_group(e.gate, e.gate_vectors, 0, c), g);
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = __fadd_rn(x[j], round_bf16(__fmul_rn(g[j], y[j])));
      store_group(e.out, e.out_vectors, r, c, x);
    } else {
      float u[8];
      unpack_bf16x8(held[1][i], u);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        y[j] = e.silu == SiluMath::kExact ? swiglu_value<SiluMath::kExact>(y[j], u[j])
                                          : swiglu_value<SiluMath::kFast>(y[j], u[j]);
      }
      store_group(e.out, e.out_vectors, r, c, y);
    }
  }
}

template <Epilogue kEpilogue, int kViews>
__global__ void __launch_bounds__(kThreads, kViews == 1 ? 3 : 2)
    lora_up_kernel(Views views, EpilogueArgs e) {
  __shared__ __align__(16) SharedTiles shared;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  uint4 held[kViews][kGroupsPerThread];
#pragma unroll
  for (int v = 0; v < kViews; ++v) {  // loaded first: their latency overlaps the products
#pragma unroll
    for (int i = 0; i < kGroupsPerThread; ++i) {
      int row, col;
      group_of(i, &row, &col);
      held[v][i] = load_group(views.v[v].y, views.v[v].y_vectors, m0 + row, n0 + col);
    }
  }
#pragma unroll
  for (int v = 0; v < kViews; ++v) add_terms(views.v[v], m0, n0, shared, held[v]);
  finish<kEpilogue>(views, e, m0, n0, held);
}

// View [begin, begin + cols) of y with the terms that reach it (at most kMaxTerms).
View view_of(const Mat& y, int64_t begin, int64_t cols, const LoraUp* terms, size_t count) {
  View v{};
  v.y = Mat{static_cast<bf16*>(y.data) + begin, y.rows, cols, y.stride};
  v.y_vectors = rows_aligned16(v.y, 2);
  for (const LoraUp* term = terms; term != terms + count; ++term) {
    if (term->out_offset >= begin + cols || term->out_offset + term->b.rows <= begin) continue;
    const unsigned vectors =
        (rows_aligned16(term->t, 2) ? 2u : 0u) | (rows_aligned16(term->b, 2) ? 4u : 0u);
    v.term[v.count++] = {term->t, term->b, term->scale, begin - term->out_offset, vectors};
  }
  return v;
}

absl::Status check_terms(const char* op, const Mat& y, const std::vector<LoraUp>& terms) {
  for (const LoraUp& term : terms) {
    if (term.t.rows != y.rows || term.b.cols != term.t.cols || term.out_offset < 0 ||
        term.out_offset + term.b.rows > y.cols) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": y [", y.rows, ", ", y.cols, "], t [",
                                                     term.t.rows, ", ", term.t.cols, "] and b [",
                                                     term.b.rows, ", ", term.b.cols, "] at column ",
                                                     term.out_offset, " do not make y += t · bᵀ"));
    }
  }
  return absl::OkStatus();
}

// One launch on views of `width` columns (1 or 2 views) with terms [first, first + count).
template <Epilogue kEpilogue, int kViews>
absl::Status launch_once(const char* op, const Mat& y, int64_t width, const LoraUp* first,
                         size_t count, const EpilogueArgs& e, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((width + kTileN - 1) / kTileN),
                  static_cast<unsigned>((y.rows + kTileM - 1) / kTileM));
  Views views{};
  for (int v = 0; v < kViews; ++v) views.v[v] = view_of(y, v * width, width, first, count);
  lora_up_kernel<kEpilogue, kViews><<<grid, kThreads, 0, stream>>>(views, e);
  FLUX_RETURN_IF_LAUNCH_FAILED(op);
  return absl::OkStatus();
}

// The terms beyond the last kMaxTerms added and stored in y first (kMaxTerms per launch), then
// the last ones with the epilogue.
template <Epilogue kEpilogue, int kViews>
absl::Status launch(const char* op, const Mat& y, int64_t width, const std::vector<LoraUp>& terms,
                    const EpilogueArgs& e, cudaStream_t stream) {
  FLUX_RETURN_IF_ERROR(check_terms(op, y, terms));
  if (y.rows == 0 || width == 0) return absl::OkStatus();
  if ((y.rows + kTileM - 1) / kTileM > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", y.rows, " rows exceed ", 65535 * kTileM));
  }
  const size_t last = terms.size() > kMaxTerms ? terms.size() - kMaxTerms : 0;
  for (size_t first = 0; first < last; first += kMaxTerms) {
    FLUX_RETURN_IF_ERROR(
        (launch_once<Epilogue::kStore, 1>(op, y, y.cols, terms.data() + first,
                                          std::min<size_t>(kMaxTerms, last - first), {}, stream)));
  }
  return launch_once<kEpilogue, kViews>(op, y, width, terms.data() + last, terms.size() - last, e,
                                        stream);
}

}  // namespace

absl::Status lora_up_add_bf16(const Mat& y, const std::vector<LoraUp>& terms, cudaStream_t stream) {
  return launch<Epilogue::kStore, 1>("lora_up_add", y, y.cols, terms, {}, stream);
}

absl::Status lora_up_swiglu_bf16(const Mat& y, const std::vector<LoraUp>& terms, const Mat& out,
                                 SiluMath math, cudaStream_t stream) {
  if (y.cols != 2 * out.cols || y.rows != out.rows) {
    return absl::InvalidArgumentError(absl::StrCat("lora_up_swiglu: y [", y.rows, ", ", y.cols,
                                                   "] is not [gate | up] of out [", out.rows, ", ",
                                                   out.cols, "]"));
  }
  EpilogueArgs e;
  e.out = out;
  e.out_vectors = rows_aligned16(out, 2);
  e.silu = math;
  return launch<Epilogue::kSwiglu, 2>("lora_up_swiglu", y, out.cols, terms, e, stream);
}

absl::Status lora_up_gate_residual_bf16(const Mat& y, const std::vector<LoraUp>& terms,
                                        const Mat& x, const Mat& gate, cudaStream_t stream) {
  if (x.rows != y.rows || x.cols != y.cols || gate.rows != 1 || gate.cols != y.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora_up_gate_residual: x [", x.rows, ", ", x.cols, "] and gate [", gate.rows,
                     ", ", gate.cols, "] do not fit y [", y.rows, ", ", y.cols, "]"));
  }
  EpilogueArgs e;
  e.out = x;
  e.gate = gate;
  e.out_vectors = rows_aligned16(x, 2);
  e.gate_vectors = rows_aligned16(gate, 2);
  return launch<Epilogue::kGateResidual, 1>("lora_up_gate_residual", y, y.cols, terms, e, stream);
}

}  // namespace flux2::cuda
