// Normalisation kernels; see norms.h. The eager and fused variants share the statistics code
// (same thread-to-element mapping, same reduction tree), so their bits can only differ where the
// rounding sequences differ — and those are written out identically.
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fp8_convert.cuh"
#include "kernels/cuda/head_norm.cuh"
#include "kernels/cuda/norms.h"

namespace flux2::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kRowThreads = 256;   // LayerNorm: one block per row
constexpr int kWarpsPerBlock = 8;  // per-head kernels: one warp per (row, head), or per 4 heads
constexpr int kMaxHeadDim = 512;

__device__ __forceinline__ const bf16* row_ptr(const Mat& m, int64_t r) {
  return static_cast<const bf16*>(m.data) + r * m.stride;
}
__device__ __forceinline__ bf16* row_ptr_mut(const Mat& m, int64_t r) {
  return static_cast<bf16*>(m.data) + r * m.stride;
}

// Mean and rstd of one row, computed by the whole block (two passes, fp32, fixed order).
__device__ __forceinline__ void row_stats(const bf16* x, int64_t cols, float eps, float* mean,
                                          float* rstd) {
  __shared__ float scratch[32];
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum = __fadd_rn(sum, to_f32(x[c]));
  const float m = __fdiv_rn(block_sum(sum, scratch), static_cast<float>(cols));
  float squares = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = __fsub_rn(to_f32(x[c]), m);
    squares = __fadd_rn(squares, __fmul_rn(d, d));
  }
  const float var = __fdiv_rn(block_sum(squares, scratch), static_cast<float>(cols));
  *mean = m;
  *rstd = rsqrtf(__fadd_rn(var, eps));
}

// The rounded LayerNorm value of one element, shared by the eager and fused kernels.
__device__ __forceinline__ float ln_value(float x, float mean, float rstd) {
  return round_bf16(__fmul_rn(__fsub_rn(x, mean), rstd));
}

// ---- vectorized LayerNorm: a row held in registers as 16-byte packs, one global read ----
// Used by both the eager LN kernel and the fused LN + modulation kernel whenever
// ln_vectorized(x) holds, so the two always share one reduction order.
constexpr int kVecThreads = 128;
constexpr int kMaxPacksPerThread = 8;  // rows up to 128 x 8 x 8 = 8192 columns

bool ln_vectorized(const Mat& x) {
  return x.cols % 8 == 0 && x.cols / 8 <= kVecThreads * kMaxPacksPerThread && rows_aligned16(x, 2);
}

// The eager LN output: the rounded normalised values themselves. Epilogues take a row's state
// once (row(r), before the pack loop), then each pack of 8 values.
struct PlainLn {
  struct Row {};
  __device__ Row row(int64_t) const { return {}; }
  __device__ void operator()(const Row&, int64_t, float[8]) const {}
};

// bf16(bf16(bf16(1 + scale) · n) + shift), the three eager modulation ops, on pack p (8 values).
struct ModulateLn {
  Mat shift, scale;
  int64_t rows_per_mod;
  struct Row {
    const bf16* shift;
    const bf16* scale;
    bool vectorized;  // both rows 16-byte aligned (the packs then are too)
  };
  __device__ Row row(int64_t r) const {
    const int64_t m = row_div(r, rows_per_mod);
    const bf16* sh = static_cast<const bf16*>(shift.data) + m * shift.stride;
    const bf16* sc = static_cast<const bf16*>(scale.data) + m * scale.stride;
    return {sh, sc, aligned16(sh) && aligned16(sc)};
  }
  __device__ void operator()(const Row& row, int64_t p, float v[8]) const {
    const bf16* sh = row.shift + p * 8;
    const bf16* sc = row.scale + p * 8;
    float shift8[8], scale8[8];
    if (row.vectorized) {
      load8(sh, shift8);
      load8(sc, scale8);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) shift8[i] = to_f32(sh[i]), scale8[i] = to_f32(sc[i]);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float one_plus = round_bf16(__fadd_rn(1.0f, scale8[i]));
      const float scaled = round_bf16(__fmul_rn(one_plus, v[i]));
      v[i] = __fadd_rn(scaled, shift8[i]);
    }
  }
};

// fp8 (optional): also E4M3 [rows, cols] of the rounded outputs, each row under the scale of its
// own max |out|, or fp8.static_scale when set (written to fp8.row_scales[r]).
// kPacks: packs held per thread, at least ceil(cols / 8 / kVecThreads) (registers scale with it;
// the reduction order does not depend on it, so every instantiation gives the same bits).
template <int kPacks, typename Epilogue>
__global__ void __launch_bounds__(kVecThreads)
    layer_norm_vec_kernel(Mat x, float eps, Mat out, Epilogue epilogue, Fp8Rows fp8) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int packs = static_cast<int>(x.cols / 8);
  const bf16* in = row_ptr(x, r);
  Bf16x8 held[kPacks];
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int p = threadIdx.x + j * kVecThreads;
    if (p < packs) held[j] = reinterpret_cast<const Bf16x8*>(in)[p];
  }
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    if (threadIdx.x + j * kVecThreads < packs) {
#pragma unroll
      for (int i = 0; i < 8; ++i) sum = __fadd_rn(sum, to_f32(held[j].v[i]));
    }
  }
  const float mean = __fdiv_rn(block_sum(sum, scratch), static_cast<float>(x.cols));
  float squares = 0.0f;
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    if (threadIdx.x + j * kVecThreads < packs) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float d = __fsub_rn(to_f32(held[j].v[i]), mean);
        squares = __fadd_rn(squares, __fmul_rn(d, d));
      }
    }
  }
  const float rstd =
      rsqrtf(__fadd_rn(__fdiv_rn(block_sum(squares, scratch), static_cast<float>(x.cols)), eps));
  bf16* o = out.data != nullptr ? row_ptr_mut(out, r) : nullptr;  // null: E4M3 rows only
  const bool vector_store = aligned16(o) && (out.stride * 2) % 16 == 0;
  uint32_t magnitude = 0;
  const bool quantize = fp8.values != nullptr;  // quantized after the row's max is known
  const typename Epilogue::Row mod = epilogue.row(r);
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int p = threadIdx.x + j * kVecThreads;
    if (p >= packs) continue;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = ln_value(to_f32(held[j].v[i]), mean, rstd);
    epilogue(mod, p, v);
    Bf16x8 result;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      result.v[i] = to_bf16(v[i]);
      if (quantize) magnitude = max(magnitude, __float_as_uint(to_f32(result.v[i])) & 0x7fffffffu);
    }
    if (o != nullptr && vector_store) {
      reinterpret_cast<Bf16x8*>(o)[p] = result;
    } else if (o != nullptr) {
#pragma unroll
      for (int i = 0; i < 8; ++i) o[p * 8 + i] = result.v[i];
    }
    if (quantize) held[j] = result;  // the input is spent: keep what to quantize
  }
  if (!quantize) return;
  // A static scale is the same for the whole block (no reduction); else the row's own.
  __shared__ uint32_t max_scratch[32];
  const bool fixed = fp8.static_scale != nullptr;
  const float scale =
      fixed ? *fp8.static_scale
            : fp8_dequant_scale(__uint_as_float(block_max_bits(magnitude, max_scratch)));
  if (threadIdx.x == 0) fp8.row_scales[r] = scale;
  const float encode = fp8_encode_factor(scale);
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int p = threadIdx.x + j * kVecThreads;
    if (p >= packs) continue;
    float rounded[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) rounded[i] = to_f32(held[j].v[i]);
    *reinterpret_cast<uint2*>(fp8.values + r * x.cols + p * 8) =
        fixed ? fp8_pack8_static<true>(rounded, scale) : fp8_pack8<true>(rounded, encode);
  }
}

// Launches layer_norm_vec_kernel with the fewest packs per thread that hold x's rows.
template <typename Epilogue>
void launch_layer_norm_vec(const Mat& x, float eps, const Mat& out, Epilogue epilogue, Fp8Rows fp8,
                           cudaStream_t stream) {
  const int64_t per_thread = (x.cols / 8 + kVecThreads - 1) / kVecThreads;
  auto launch = [&](auto packs) {
    layer_norm_vec_kernel<decltype(packs)::value>
        <<<static_cast<unsigned>(x.rows), kVecThreads, 0, stream>>>(x, eps, out, epilogue, fp8);
  };
  if (per_thread <= 1) {
    launch(std::integral_constant<int, 1>{});
  } else if (per_thread <= 2) {
    launch(std::integral_constant<int, 2>{});
  } else if (per_thread <= 3) {
    launch(std::integral_constant<int, 3>{});
  } else if (per_thread <= 4) {
    launch(std::integral_constant<int, 4>{});
  } else if (per_thread <= 6) {
    launch(std::integral_constant<int, 6>{});
  } else {
    launch(std::integral_constant<int, kMaxPacksPerThread>{});
  }
}

__global__ void layer_norm_kernel(Mat x, float eps, Mat out) {
  const int64_t r = blockIdx.x;
  const bf16* in = row_ptr(x, r);
  float mean, rstd;
  row_stats(in, x.cols, eps, &mean, &rstd);
  bf16* o = row_ptr_mut(out, r);
  for (int64_t c = threadIdx.x; c < x.cols; c += blockDim.x)
    o[c] = to_bf16(ln_value(to_f32(in[c]), mean, rstd));
}

__global__ void layer_norm_modulate_kernel(Mat x, Mat shift, Mat scale, int64_t rows_per_mod,
                                           float eps, Mat out) {
  const int64_t r = blockIdx.x;
  const bf16* in = row_ptr(x, r);
  const bf16* sh = row_ptr(shift, row_div(r, rows_per_mod));
  const bf16* sc = row_ptr(scale, row_div(r, rows_per_mod));
  float mean, rstd;
  row_stats(in, x.cols, eps, &mean, &rstd);
  bf16* o = row_ptr_mut(out, r);
  for (int64_t c = threadIdx.x; c < x.cols; c += blockDim.x) {
    const float n = ln_value(to_f32(in[c]), mean, rstd);
    const float one_plus = round_bf16(__fadd_rn(1.0f, to_f32(sc[c])));  // bf16(1 + scale)
    const float scaled = round_bf16(__fmul_rn(one_plus, n));            // bf16(· LN(x))
    o[c] = to_bf16(__fadd_rn(scaled, to_f32(sh[c])));                   // bf16(+ shift)
  }
}

__global__ void rms_norm_qwen_kernel(Mat x, const bf16* weight, float eps, Mat out) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const bf16* in = row_ptr(x, r);
  float squares = 0.0f;
  for (int64_t c = threadIdx.x; c < x.cols; c += blockDim.x) {
    const float v = to_f32(in[c]);
    squares = __fadd_rn(squares, __fmul_rn(v, v));
  }
  const float rstd =
      rsqrtf(__fadd_rn(__fdiv_rn(block_sum(squares, scratch), static_cast<float>(x.cols)), eps));
  bf16* o = row_ptr_mut(out, r);
  for (int64_t c = threadIdx.x; c < x.cols; c += blockDim.x) {
    o[c] = to_bf16(__fmul_rn(to_f32(weight[c]), round_bf16(__fmul_rn(to_f32(in[c]), rstd))));
  }
}

// ---- per-head kernels: one warp per (row, head); lane owns elements d = lane + 32k ----

__device__ __forceinline__ float head_rstd(const bf16* head, int64_t head_dim, float eps) {
  float squares = 0.0f;
  for (int64_t d = threadIdx.x & 31; d < head_dim; d += 32) {
    const float v = to_f32(head[d]);
    squares = __fadd_rn(squares, __fmul_rn(v, v));
  }
  return head_rstd_of(warp_sum(squares), static_cast<float>(head_dim), eps);
}

// Partner index and sign of rot(x)[d]: interleaved (-x[d+1] | x[d-1]), half-split (-x[d+h] |
// x[d-h]).
__device__ __forceinline__ int64_t rope_partner(int64_t d, int64_t head_dim, RopeStyle style,
                                                float* sign) {
  if (style == RopeStyle::kInterleaved) {
    *sign = (d & 1) ? 1.0f : -1.0f;
    return d ^ 1;
  }
  const int64_t half = head_dim / 2;
  *sign = d < half ? -1.0f : 1.0f;
  return d < half ? d + half : d - half;
}

struct HeadIndex {
  int64_t row, head;
  bool valid;
};

__device__ __forceinline__ HeadIndex warp_head(const Mat& x, int64_t head_dim) {
  const int64_t heads = x.cols / head_dim;
  const int64_t item = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5);
  return {item / heads, item % heads, item < x.rows * heads};
}

__global__ void qk_rms_norm_kernel(Mat x, int64_t head_dim, const bf16* weight, float eps,
                                   RopeStyle style) {
  const HeadIndex at = warp_head(x, head_dim);
  if (!at.valid) return;
  bf16* head = row_ptr_mut(x, at.row) + at.head * head_dim;
  const float rstd = head_rstd(head, head_dim, eps);
  for (int64_t d = threadIdx.x & 31; d < head_dim; d += 32) {
    head[d] = to_bf16(head_norm_value(to_f32(head[d]), rstd, to_f32(weight[d]), style));
  }
}

// The rotary embedding of one staged head (fp32 values in shared memory, written by this warp)
// into `head` (bf16), with row `row` of the tables: the common tail of rope_kernel and
// qk_norm_rope_kernel.
__device__ __forceinline__ void rope_staged_head(const float* values, bf16* head, int64_t head_dim,
                                                 int64_t row, const Mat& cos, const Mat& sin,
                                                 RopeStyle style) {
  const float* c_row = static_cast<const float*>(cos.data) + row * cos.stride;
  const float* s_row = static_cast<const float*>(sin.data) + row * sin.stride;
  for (int64_t d = threadIdx.x & 31; d < head_dim; d += 32) {
    float sign;
    const int64_t p = rope_partner(d, head_dim, style, &sign);
    head[d] = to_bf16(rope_value(values[d], values[p], sign, c_row[d], s_row[d], style));
  }
}

__global__ void rope_kernel(Mat x, int64_t head_dim, Mat cos, Mat sin, RopeStyle style) {
  __shared__ float staged[kWarpsPerBlock][kMaxHeadDim];
  const HeadIndex at = warp_head(x, head_dim);
  if (!at.valid) return;
  float* values = staged[threadIdx.x >> 5];
  bf16* head = row_ptr_mut(x, at.row) + at.head * head_dim;
  for (int64_t d = threadIdx.x & 31; d < head_dim; d += 32) values[d] = to_f32(head[d]);
  __syncwarp();
  rope_staged_head(values, head, head_dim, at.row, cos, sin, style);
}

__global__ void qk_norm_rope_kernel(Mat x, int64_t head_dim, const bf16* weight, float eps, Mat cos,
                                    Mat sin, RopeStyle style) {
  __shared__ float staged[kWarpsPerBlock][kMaxHeadDim];
  const HeadIndex at = warp_head(x, head_dim);
  if (!at.valid) return;
  float* values = staged[threadIdx.x >> 5];
  bf16* head = row_ptr_mut(x, at.row) + at.head * head_dim;
  const float rstd = head_rstd(head, head_dim, eps);
  for (int64_t d = threadIdx.x & 31; d < head_dim; d += 32) {
    values[d] = head_norm_value(to_f32(head[d]), rstd, to_f32(weight[d]), style);
  }
  __syncwarp();
  rope_staged_head(values, head, head_dim, at.row, cos, sin, style);
}

// ---- head_dim 128: lane l holds elements 4l..4l+3 (8-byte loads); used by both the eager norm
// kernel and the fused kernel whenever heads_vectorized() holds (same reduction order) ----
bool heads_vectorized(const Mat& x, int64_t head_dim) {
  return head_dim == kVecHeadDim && reinterpret_cast<uintptr_t>(x.data) % 8 == 0 &&
         (x.stride * 2) % 8 == 0;
}

__global__ void qk_rms_norm_vec_kernel(Mat x, const bf16* weight, float eps, RopeStyle style) {
  const HeadIndex at = warp_head(x, kVecHeadDim);
  if (!at.valid) return;
  bf16* head = row_ptr_mut(x, at.row) + at.head * kVecHeadDim;
  float v[4];
  head_norm4(head, weight, eps, style, v);
  store4(head + 4 * (threadIdx.x & 31), v);
}

// The fused kernel: one warp per kHeadsPerWarp heads of a row, so the loads of all of them are in
// flight together and the weights and the row's cos/sin are read once. Per head, the same
// arithmetic as qk_rms_norm_vec_kernel followed by rope_kernel.
constexpr int kHeadsPerWarp = 4;

__host__ __device__ inline int64_t head_groups(const Mat& x) {
  return (x.cols / kVecHeadDim + kHeadsPerWarp - 1) / kHeadsPerWarp;
}

__global__ void qk_norm_rope_vec_kernel(Mat x, const bf16* weight, float eps, Mat cos, Mat sin,
                                        RopeStyle style) {
  const int64_t heads = x.cols / kVecHeadDim, groups = head_groups(x);
  const int64_t item = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5);
  if (item >= x.rows * groups) return;
  const int64_t row = row_div(item, groups), first = (item - row * groups) * kHeadsPerWarp;
  const int lane = threadIdx.x & 31;
  bf16* lane_base = row_ptr_mut(x, row) + first * kVecHeadDim + 4 * lane;
  float v[kHeadsPerWarp][4];
#pragma unroll
  for (int h = 0; h < kHeadsPerWarp; ++h) {
    if (first + h < heads) load4(lane_base + h * kVecHeadDim, v[h]);
  }
  float w[4];
  load4(weight + 4 * lane, w);
  const Rope4 table = load_rope4(static_cast<const float*>(cos.data) + row * cos.stride,
                                 static_cast<const float*>(sin.data) + row * sin.stride);
#pragma unroll
  for (int h = 0; h < kHeadsPerWarp; ++h) {
    if (first + h >= heads) break;
    norm4(v[h], w, eps, style);
    rope4(v[h], table, style);
    store4(lane_base + h * kVecHeadDim, v[h]);
  }
}

bool tables_vectorized(const Mat& cos, const Mat& sin) {
  return reinterpret_cast<uintptr_t>(cos.data) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(sin.data) % 16 == 0 && (cos.stride * 4) % 16 == 0 &&
         (sin.stride * 4) % 16 == 0;
}

absl::Status check_heads(const char* op, const Mat& x, int64_t head_dim) {
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > kMaxHeadDim || x.cols % head_dim != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", x.cols,
                                                   " columns are not whole heads of even dim ",
                                                   head_dim, " (<= ", kMaxHeadDim, ")"));
  }
  return absl::OkStatus();
}

absl::Status check_tables(const char* op, const Mat& x, int64_t head_dim, const Mat& cos,
                          const Mat& sin) {
  if (cos.rows != x.rows || sin.rows != x.rows || cos.cols != head_dim || sin.cols != head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": rope tables must be [", x.rows, ", ", head_dim, "]"));
  }
  return absl::OkStatus();
}

int head_blocks(const Mat& x, int64_t head_dim) {
  const int64_t items = x.rows * (x.cols / head_dim);
  return static_cast<int>((items + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

absl::Status layer_norm_bf16(const Mat& x, float eps, const Mat& out, cudaStream_t stream) {
  if (x.rows != out.rows || x.cols != out.cols)
    return absl::InvalidArgumentError("layer_norm: shape mismatch");
  if (x.rows == 0) return absl::OkStatus();
  if (ln_vectorized(x)) {
    launch_layer_norm_vec(x, eps, out, PlainLn{}, Fp8Rows{}, stream);
  } else {
    layer_norm_kernel<<<static_cast<unsigned>(x.rows), kRowThreads, 0, stream>>>(x, eps, out);
  }
  FLUX_RETURN_IF_LAUNCH_FAILED("layer_norm");
  return absl::OkStatus();
}

absl::Status layer_norm_modulate_fused(const Mat& x, const Mat& shift, const Mat& scale,
                                       int64_t rows_per_mod, float eps, const Mat& out,
                                       cudaStream_t stream, Fp8Rows fp8) {
  if (x.rows != out.rows || x.cols != out.cols || shift.cols != x.cols || scale.cols != x.cols ||
      rows_per_mod <= 0 || shift.rows * rows_per_mod != x.rows || scale.rows != shift.rows) {
    return absl::InvalidArgumentError("layer_norm_modulate: shape mismatch");
  }
  if (fp8.values != nullptr && (!ln_vectorized(x) || fp8.row_scales == nullptr)) {
    return absl::InvalidArgumentError(
        "layer_norm_modulate: an E4M3 output needs the vectorized layout and row scales");
  }
  if (out.data == nullptr && fp8.values == nullptr) {
    return absl::InvalidArgumentError(
        "layer_norm_modulate: out may be left out only for E4M3 rows");
  }
  if (x.rows == 0) return absl::OkStatus();
  if (ln_vectorized(x)) {
    launch_layer_norm_vec(x, eps, out, ModulateLn{shift, scale, rows_per_mod}, fp8, stream);
  } else {
    layer_norm_modulate_kernel<<<static_cast<unsigned>(x.rows), kRowThreads, 0, stream>>>(
        x, shift, scale, rows_per_mod, eps, out);
  }
  FLUX_RETURN_IF_LAUNCH_FAILED("layer_norm_modulate");
  return absl::OkStatus();
}

bool layer_norm_writes_fp8(const Mat& x) {
  return ln_vectorized(x);
}

absl::Status rms_norm_qwen_bf16(const Mat& x, const void* weight, float eps, const Mat& out,
                                cudaStream_t stream) {
  if (x.rows != out.rows || x.cols != out.cols)
    return absl::InvalidArgumentError("rms_norm: shape mismatch");
  if (x.rows == 0) return absl::OkStatus();
  rms_norm_qwen_kernel<<<static_cast<unsigned>(x.rows), kRowThreads, 0, stream>>>(
      x, static_cast<const bf16*>(weight), eps, out);
  FLUX_RETURN_IF_LAUNCH_FAILED("rms_norm");
  return absl::OkStatus();
}

absl::Status qk_rms_norm_bf16(const Mat& x, int64_t head_dim, const void* weight, float eps,
                              RopeStyle style, cudaStream_t stream) {
  if (auto s = check_heads("qk_rms_norm", x, head_dim); !s.ok()) return s;
  if (x.rows == 0) return absl::OkStatus();
  if (heads_vectorized(x, head_dim)) {
    qk_rms_norm_vec_kernel<<<head_blocks(x, head_dim), kWarpsPerBlock * 32, 0, stream>>>(
        x, static_cast<const bf16*>(weight), eps, style);
  } else {
    qk_rms_norm_kernel<<<head_blocks(x, head_dim), kWarpsPerBlock * 32, 0, stream>>>(
        x, head_dim, static_cast<const bf16*>(weight), eps, style);
  }
  FLUX_RETURN_IF_LAUNCH_FAILED("qk_rms_norm");
  return absl::OkStatus();
}

absl::Status rope_bf16(const Mat& x, int64_t head_dim, const Mat& cos, const Mat& sin,
                       RopeStyle style, cudaStream_t stream) {
  if (auto s = check_heads("rope", x, head_dim); !s.ok()) return s;
  if (auto s = check_tables("rope", x, head_dim, cos, sin); !s.ok()) return s;
  if (x.rows == 0) return absl::OkStatus();
  rope_kernel<<<head_blocks(x, head_dim), kWarpsPerBlock * 32, 0, stream>>>(x, head_dim, cos, sin,
                                                                            style);
  FLUX_RETURN_IF_LAUNCH_FAILED("rope");
  return absl::OkStatus();
}

absl::Status qk_norm_rope_fused(const Mat& x, int64_t head_dim, const void* weight, float eps,
                                const Mat& cos, const Mat& sin, RopeStyle style,
                                cudaStream_t stream) {
  if (auto s = check_heads("qk_norm_rope", x, head_dim); !s.ok()) return s;
  if (auto s = check_tables("qk_norm_rope", x, head_dim, cos, sin); !s.ok()) return s;
  if (x.rows == 0) return absl::OkStatus();
  // The fused kernel takes the vectorised layout exactly when the eager norm kernel does, so
  // both reduce in the same order (its table reads must also be 16-byte aligned).
  if (heads_vectorized(x, head_dim) && tables_vectorized(cos, sin)) {
    const auto blocks =
        static_cast<unsigned>((x.rows * head_groups(x) + kWarpsPerBlock - 1) / kWarpsPerBlock);
    qk_norm_rope_vec_kernel<<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
        x, static_cast<const bf16*>(weight), eps, cos, sin, style);
  } else if (heads_vectorized(x, head_dim)) {
    // Unaligned tables: the eager pair keeps the shared reduction order.
    FLUX_RETURN_IF_ERROR(qk_rms_norm_bf16(x, head_dim, weight, eps, style, stream));
    return rope_bf16(x, head_dim, cos, sin, style, stream);
  } else {
    qk_norm_rope_kernel<<<head_blocks(x, head_dim), kWarpsPerBlock * 32, 0, stream>>>(
        x, head_dim, static_cast<const bf16*>(weight), eps, cos, sin, style);
  }
  FLUX_RETURN_IF_LAUNCH_FAILED("qk_norm_rope");
  return absl::OkStatus();
}

}  // namespace flux2::cuda
