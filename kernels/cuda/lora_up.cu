// lora_up_*_bf16; see lora_up.h. A CTA owns a 64 x 128 tile of y (two for the SwiGLU: its gate
// and up columns), which it starts copying into shared memory (cp.async) before anything else,
// with the stream's tile for the gated residual. Per term, t's and b's rows of the tile go through
// shared memory in 32-wide chunks of r into mma.sync m16n8k16 (bf16 in, fp32 out; 8 warps as
// 2 x 4, each 32 x 32), and each thread adds its rounded scaled products to its elements of the
// shared y tile (the same elements for every term, so terms need no barrier between them). The
// epilogue then stores y, or the SwiGLU, or the gated residual, in 16-byte rows, or (a tile being
// one head of q or k) the head's RMSNorm and RoPE as qk_norm_rope computes them. Holding the tiles
// in shared memory instead of registers keeps 4 CTAs on an SM (tests/cuda/op_cases.cc; --perf).
#include <cuda_bf16.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/head_norm.cuh"
#include "kernels/cuda/lora_up.h"
#include "kernels/cuda/mma_bf16.cuh"

namespace flux2::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kTileM = 64;      // rows of y (and of t) per CTA
constexpr int kTileN = 128;     // columns of y (rows of b) per CTA and tile
constexpr int kChunk = 32;      // r per shared-memory chunk
constexpr int kThreads = 256;   // 8 warps: 2 along the rows x 4 along the columns, 32 x 32 each
constexpr int kOperandPad = 8;  // bf16 of padding per operand row: conflict-free fragment loads
constexpr int kTilePad = 8;     // and per tile row: conflict-free fragment read-modify-writes
constexpr int kOperandStride = kChunk + kOperandPad;
constexpr int kTileStride = kTileN + kTilePad;
constexpr int kGroups = kTileN / 8;                            // 16-byte groups per tile row
constexpr int kGroupsPerThread = kTileM * kGroups / kThreads;  // groups each thread moves
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

enum class Epilogue { kStore, kSwiglu, kGateResidual, kQkNormRope };
struct EpilogueArgs {
  Mat out;   // kSwiglu: [M, F]; kGateResidual: the stream x [M, N]
  Mat gate;  // kGateResidual: [1, N]
  SiluMath silu = SiluMath::kExact;
  bool out_vectors = false, gate_vectors = false;
  const bf16* norm_weight = nullptr;  // kQkNormRope: [128]
  float eps = 0.0f;
  Mat cos, sin;  // kQkNormRope: f32 [M, 128]
  RopeStyle style = RopeStyle::kInterleaved;
};

using Tile = bf16[kTileM][kTileStride];
struct OperandTiles {
  bf16 t[kTileM][kOperandStride];
  bf16 b[kTileN][kOperandStride];
};
// Shared memory: kTiles tiles (y; y's up columns or the stream x), then the operands.
template <int kTiles>
struct SharedTiles {
  Tile tile[kTiles];
  OperandTiles operands;
};

__device__ __forceinline__ const bf16* at(const Mat& m, int64_t r, int64_t c) {
  return static_cast<const bf16*>(m.data) + r * m.stride + c;
}
__device__ __forceinline__ bf16* mut_at(const Mat& m, int64_t r, int64_t c) {
  return static_cast<bf16*>(m.data) + r * m.stride + c;
}

// Completes every cp.async copy this thread issued.
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

// Group (r, c) of m into dst (8 bf16): one asynchronous 16-byte copy where it is whole, zeros
// outside m.
__device__ void load_group(const Mat& m, bool vectorized, int64_t r, int64_t c, bf16* dst) {
  const bool inside = r >= 0 && r < m.rows;
  if (vectorized && inside && c + 8 <= m.cols) {
    cp_async16(dst, at(m, r, c));
    return;
  }
  for (int j = 0; j < 8; ++j) {
    dst[j] = inside && c + j < m.cols ? *at(m, r, c + j) : __float2bfloat16_rn(0.0f);
  }
}

// Rows [row0, row0 + kRows) x columns [k0, k0 + kChunk) of src into dst (row0 may be negative).
template <int kRows>
__device__ void load_chunk(const Mat& src, bool vectorized, int64_t row0, int64_t k0,
                           bf16 (*dst)[kOperandStride]) {
  constexpr int kVectors = kRows * kChunk / 8;
  for (int i = threadIdx.x; i < kVectors; i += kThreads) {
    const int row = i / (kChunk / 8), k = (i % (kChunk / 8)) * 8;
    load_group(src, vectorized, row0 + row, k0 + k, &dst[row][k]);
  }
}

// The thread's i-th 16-byte group of a tile: its row and first column in the tile.
__device__ __forceinline__ void group_of(int i, int* row, int* col) {
  const int g = threadIdx.x + i * kThreads;
  *row = g / kGroups;
  *col = (g % kGroups) * 8;
}

// The tile of m at (m0, n0) into `tile`, asynchronously where whole.
__device__ void load_tile(const Mat& m, bool vectorized, int64_t m0, int64_t n0, Tile& tile) {
#pragma unroll
  for (int i = 0; i < kGroupsPerThread; ++i) {
    int row, col;
    group_of(i, &row, &col);
    load_group(m, vectorized, m0 + row, n0 + col, &tile[row][col]);
  }
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

// The thread's products into its elements of the tile: y = bf16(y + bf16(bf16(p) · scale))
// (PEFT's lora_B output, then * scaling, then the add), on the columns the term covers.
__device__ void add_products(Tile& tile, const ViewTerm& term, int64_t n0, int wm, int wn, int lane,
                             const float acc[2][4][4]) {
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int nj = 0; nj < 4; ++nj) {
    const int col = wn * 32 + nj * 8 + 2 * q;
    const int64_t first = n0 + col + term.b_row0;  // b's row of the pair's first column
    const bool covers0 = first >= 0 && first < term.b.rows;
    const bool covers1 = first + 1 >= 0 && first + 1 < term.b.rows;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = wm * 32 + mi * 16 + g + 8 * half;
        auto* pair = reinterpret_cast<__nv_bfloat162*>(&tile[row][col]);
        float2 y = __bfloat1622float2(*pair);
        const float* c = &acc[mi][nj][2 * half];
        if (covers0) y.x = __fadd_rn(y.x, round_bf16(__fmul_rn(round_bf16(c[0]), term.scale)));
        if (covers1) y.y = __fadd_rn(y.y, round_bf16(__fmul_rn(round_bf16(c[1]), term.scale)));
        *pair = __floats2bfloat162_rn(y.x, y.y);
      }
    }
  }
}

// Whether the term has any of the tile's columns [n0, n0 + kTileN) inside y's.
__device__ __forceinline__ bool covers_tile(const View& v, const ViewTerm& term, int64_t n0) {
  const int64_t lo = max(n0, -term.b_row0);
  const int64_t hi = min(min(n0 + kTileN, v.y.cols), term.b.rows - term.b_row0);
  return lo < hi;
}

// Every term of view v added to its tile, in order. The first chunk's wait also completes the
// tiles' copies.
__device__ void add_terms(const View& v, int64_t m0, int64_t n0, OperandTiles& operands,
                          Tile& tile) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / 4, wn = warp % 4;
  for (int i = 0; i < v.count; ++i) {
    const ViewTerm& term = v.term[i];
    if (!covers_tile(v, term, n0)) continue;  // the same for the whole CTA
    float acc[2][4][4] = {};
    for (int64_t k0 = 0; k0 < term.t.cols; k0 += kChunk) {
      load_chunk<kTileM>(term.t, term.vectors & 2u, m0, k0, operands.t);
      load_chunk<kTileN>(term.b, term.vectors & 4u, n0 + term.b_row0, k0, operands.b);
      cp_async_wait();
      __syncthreads();
      mma_chunk(operands, wm, wn, lane, acc);
      __syncthreads();  // the next chunk overwrites the operands
    }
    add_products(tile, term, n0, wm, wn, lane, acc);
  }
}

// The 8 values into group (r, c) of m, rounded to bf16, inside m only.
__device__ void store_group(const Mat& m, bool vectorized, int64_t r, int64_t c, const float v[8]) {
  if (r >= m.rows) return;
  if (vectorized && c + 8 <= m.cols) {
    *reinterpret_cast<uint4*>(mut_at(m, r, c)) = pack_bf16x8(v);
    return;
  }
  for (int j = 0; j < 8 && c + j < m.cols; ++j) *mut_at(m, r, c + j) = to_bf16(v[j]);
}

template <Epilogue kEpilogue, int kTiles>
__device__ void finish(const Views& views, const EpilogueArgs& e, int64_t m0, int64_t n0,
                       const SharedTiles<kTiles>& shared) {
#pragma unroll
  for (int i = 0; i < kGroupsPerThread; ++i) {
    int row, col;
    group_of(i, &row, &col);
    const int64_t r = m0 + row, c = n0 + col;
    float y[8];
    load8(&shared.tile[0][row][col], y);
    if constexpr (kEpilogue == Epilogue::kStore) {
      store_group(views.v[0].y, views.v[0].y_vectors, r, c, y);
    } else if constexpr (kEpilogue == Epilogue::kGateResidual) {
      float x[8], g[8];
      load8(&shared.tile[1][row][col], x);
      if (e.gate_vectors && c + 8 <= e.gate.cols) {
        load8(at(e.gate, 0, c), g);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
          g[j] = c + j < e.gate.cols ? to_f32(*at(e.gate, 0, c + j)) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = __fadd_rn(x[j], round_bf16(__fmul_rn(g[j], y[j])));
      store_group(e.out, e.out_vectors, r, c, x);
    } else {
      float u[8];
      load8(&shared.tile[1][row][col], u);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        y[j] = e.silu == SiluMath::kExact ? swiglu_value<SiluMath::kExact>(y[j], u[j])
                                          : swiglu_value<SiluMath::kFast>(y[j], u[j]);
      }
      store_group(e.out, e.out_vectors, r, c, y);
    }
  }
}

// kQkNormRope: the tile is one head of kTileM rows; each warp normalises, rotates and stores its
// rows as qk_norm_rope's vectorised kernel does (lane l: elements 4l..4l+3, the same reduction).
__device__ void finish_heads(const View& v, const EpilogueArgs& e, int64_t m0, int64_t n0,
                             const Tile& tile) {
  static_assert(kTileN == kVecHeadDim, "a tile's columns are one head");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float w[4];
  load4(e.norm_weight + 4 * lane, w);
  for (int row = warp; row < kTileM && m0 + row < v.y.rows; row += kThreads / 32) {
    const int64_t r = m0 + row;
    float x[4];
    load4(&tile[row][4 * lane], x);
    const Rope4 table = load_rope4(static_cast<const float*>(e.cos.data) + r * e.cos.stride,
                                   static_cast<const float*>(e.sin.data) + r * e.sin.stride);
    norm4(x, w, e.eps, e.style);
    rope4(x, table, e.style);
    store4(mut_at(v.y, r, n0 + 4 * lane), x);
  }
}

template <Epilogue kEpilogue>
constexpr int kTilesOf = kEpilogue == Epilogue::kStore ? 1 : 2;

template <Epilogue kEpilogue>
__global__ void __launch_bounds__(kThreads, 4) lora_up_kernel(Views views, EpilogueArgs e) {
  constexpr int kTiles = kTilesOf<kEpilogue>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  auto& shared = *reinterpret_cast<SharedTiles<kTiles>*>(shared_bytes);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  // The tiles first: their copies overlap the products.
  load_tile(views.v[0].y, views.v[0].y_vectors, m0, n0, shared.tile[0]);
  if constexpr (kEpilogue == Epilogue::kSwiglu) {
    load_tile(views.v[1].y, views.v[1].y_vectors, m0, n0, shared.tile[1]);
  } else if constexpr (kEpilogue == Epilogue::kGateResidual) {
    load_tile(e.out, e.out_vectors, m0, n0, shared.tile[1]);
  }
  add_terms(views.v[0], m0, n0, shared.operands, shared.tile[0]);
  if constexpr (kEpilogue == Epilogue::kSwiglu) {
    add_terms(views.v[1], m0, n0, shared.operands, shared.tile[1]);
  }
  cp_async_wait();  // where no term covered the tile
  __syncthreads();  // every thread's products are in the tiles
  if constexpr (kEpilogue == Epilogue::kQkNormRope) {
    finish_heads(views.v[0], e, m0, n0, shared.tile[0]);
  } else {
    finish<kEpilogue, kTiles>(views, e, m0, n0, shared);
  }
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
  constexpr int kBytes = sizeof(SharedTiles<kTilesOf<kEpilogue>>);
  // At every launch, not once per process: the opt-in belongs to the current device's context,
  // and a multi-GPU engine launches on several devices, one thread each (parallel_engine.h).
  const cudaError_t opted_in = cudaFuncSetAttribute(
      lora_up_kernel<kEpilogue>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
  if (opted_in != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat(op, ": ", kBytes, " bytes of shared memory: ", cudaGetErrorString(opted_in)));
  }
  lora_up_kernel<kEpilogue><<<grid, kThreads, kBytes, stream>>>(views, e);
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

absl::string_view lora_up_qk_norm_rope_unsupported(const Mat& y, int64_t head_dim, const Mat& cos,
                                                   const Mat& sin) {
  const bool heads = head_dim == kVecHeadDim && y.cols % kVecHeadDim == 0 &&
                     reinterpret_cast<uintptr_t>(y.data) % 8 == 0 && (y.stride * 2) % 8 == 0;
  const bool tables = rows_aligned16(cos, 4) && rows_aligned16(sin, 4);
  return heads && tables ? "" : "unsupported_shape";
}

absl::Status lora_up_qk_norm_rope_bf16(const Mat& y, const std::vector<LoraUp>& terms,
                                       const void* norm_weight, float eps, const Mat& cos,
                                       const Mat& sin, RopeStyle style, cudaStream_t stream) {
  if (!lora_up_qk_norm_rope_unsupported(y, kVecHeadDim, cos, sin).empty() || cos.rows != y.rows ||
      sin.rows != y.rows || cos.cols != kVecHeadDim || sin.cols != kVecHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lora_up_qk_norm_rope: y [", y.rows, ", ", y.cols, "] is not whole 128-wide heads on ",
        "8-byte aligned rows, or the RoPE tables [", cos.rows, ", ", cos.cols,
        "] are not 16-byte aligned rows of 128"));
  }
  EpilogueArgs e;
  e.norm_weight = static_cast<const bf16*>(norm_weight);
  e.eps = eps;
  e.cos = cos;
  e.sin = sin;
  e.style = style;
  return launch<Epilogue::kQkNormRope, 1>("lora_up_qk_norm_rope", y, y.cols, terms, e, stream);
}

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
