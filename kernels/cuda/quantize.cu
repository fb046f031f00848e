// FP8 / NVFP4 quantizer kernels; see quantize.h. The recipes and software conversions are the ones
// of kernels/base/fp8_nvfp4.h (shared with the CPU references); the kernels only add the cvt
// instructions where compiled, vectorized loads and the 128x4 scale stores. Tested bit for bit
// against the CPU references by tests/cuda/quantize_test.cc.
#include "kernels/cuda/quantize.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fp8_convert.cuh"
#include "kernels/cuda/launch.cuh"

namespace flux2::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kAmaxMaxBlocks =
    static_cast<int>(kQuantizeWorkspaceBytes / sizeof(uint32_t));  // 1024

// The column concatenation [a | b] of two bf16 matrices (b may have no columns), as raw bits.
struct CatSource {
  const uint16_t* a = nullptr;
  const uint16_t* b = nullptr;
  int64_t a_stride = 0, b_stride = 0;
  int64_t d = 0;  // columns of a
  int64_t rows = 0;
  int64_t cols = 0;  // d + columns of b
  bool vec = false;  // 16-byte loads: all row starts 16-byte aligned and d % 8 == 0
};

// Widens the two bf16 halves of a 32-bit word (element order = memory order).
__device__ __forceinline__ void widen2(uint32_t w, float* out) {
  out[0] = __uint_as_float(w << 16);
  out[1] = __uint_as_float(w & 0xffff0000u);
}

// Elements [c, c + 8) of row r (c % 8 == 0) as floats.
__device__ __forceinline__ void load8(const CatSource& s, int64_t r, int64_t c, float out[8]) {
  if (s.vec) {
    const uint16_t* p = c < s.d ? s.a + r * s.a_stride + c : s.b + r * s.b_stride + (c - s.d);
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    widen2(v.x, out);
    widen2(v.y, out + 2);
    widen2(v.z, out + 4);
    widen2(v.w, out + 6);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t cc = c + i;
      const uint16_t bits = cc < s.d ? s.a[r * s.a_stride + cc] : s.b[r * s.b_stride + (cc - s.d)];
      out[i] = __uint_as_float(static_cast<uint32_t>(bits) << 16);
    }
  }
}

// Pass 1 of the dynamic quantizers: partials[blockIdx.x] = max |x| (f32 magnitude bits) over the
// 8-element segments this block's threads visit.
__global__ void amax_partials_kernel(CatSource s, uint32_t* partials) {
  __shared__ uint32_t scratch[32];
  const int64_t segments = s.rows * (s.cols / 8);
  uint32_t m = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < segments;
       i += int64_t{gridDim.x} * blockDim.x) {
    float x[8];
    load8(s, i / (s.cols / 8), (i % (s.cols / 8)) * 8, x);
#pragma unroll
    for (int j = 0; j < 8; ++j) m = max(m, abs_bits(x[j]));
  }
  m = block_max_bits(m, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = m;
}

enum class ScaleKind : uint8_t {
  kFp8Dequant,   // fp8_dequant_scale(amax)
  kNvfp4Global,  // nvfp4_global_scale(amax)
};

// Pass 2: one block reduces the partials and writes amax (optional) and the scale.
__global__ void amax_finalize_kernel(const uint32_t* partials, int64_t count, ScaleKind kind,
                                     float* amax_out, float* scale_out) {
  __shared__ uint32_t scratch[32];
  uint32_t m = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) m = max(m, partials[i]);
  m = block_max_bits(m, scratch);
  if (threadIdx.x == 0) {
    const float amax = __uint_as_float(m);
    if (amax_out != nullptr) *amax_out = amax;
    *scale_out =
        kind == ScaleKind::kFp8Dequant ? fp8_dequant_scale(amax) : nvfp4_global_scale(amax);
  }
}

// out[r, c] = fp8_quantize_value(x[r, c], scale) (kStatic: fp8_quantize_static_value) for the
// 16-element items first, first + step, ... Index: 32-bit where the item count allows (64-bit
// division costs dozens of instructions).
template <bool kHw, typename Index, bool kStatic = false>
__device__ __forceinline__ void quantize_items(const CatSource& s, Index first, Index step,
                                               float scale, uint8_t* out) {
  const Index per_row = static_cast<Index>(s.cols / 16),
              items = static_cast<Index>(s.rows) * per_row;
  const float encode = fp8_encode_factor(scale);
  for (Index i = first; i < items; i += step) {
    const Index r = i / per_row, c = (i - r * per_row) * 16;
    float x[16];
    load8(s, r, c, x);
    load8(s, r, c + 8, x + 8);
    *reinterpret_cast<uint4*>(out + static_cast<int64_t>(r) * s.cols + c) =
        kStatic ? fp8_pack16_static<kHw>(x, scale) : fp8_pack16<kHw>(x, encode);
  }
}

// The static quantizer: every item under the given scale (x / scale); row_scales (optional)
// receives the scale once per row, the activation scales of a rowwise GEMM.
template <bool kHw, typename Index>
__global__ void fp8_quantize_static_kernel(CatSource s, const float* scale_ptr, float* row_scales,
                                           uint8_t* out) {
  const float scale = *scale_ptr;
  const Index first = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
  if (row_scales != nullptr) {
    for (Index r = first; r < static_cast<Index>(s.rows); r += step) row_scales[r] = scale;
  }
  quantize_items<kHw, Index, true>(s, first, step, scale, out);
}

// The whole dynamic FP8 quantizer in one cooperative launch (every block resident): each block
// takes the max over the 16-element items it will quantize, the blocks meet at a grid barrier,
// every block reduces the partials in the same order (the same scale everywhere), then quantizes
// its items while they are likely still in L2. Bit-identical to amax pass + finalize + quantize.
// barrier[0] counts arrivals; the launcher zeroes it.
template <bool kHw, typename Index>
__global__ void fp8_quantize_dynamic_kernel(CatSource s, uint32_t* partials, unsigned int* barrier,
                                            float* amax_out, float* scale_out, uint8_t* out) {
  __shared__ uint32_t scratch[32];
  // Index: 32-bit where the item count allows (64-bit division costs dozens of instructions).
  const Index per_row = static_cast<Index>(s.cols / 16),
              items = static_cast<Index>(s.rows) * per_row;
  const Index first = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
  uint32_t m = 0;
  for (Index i = first; i < items; i += step) {
    const Index r = i / per_row, c = (i - r * per_row) * 16;
    float x[16];
    load8(s, r, c, x);
    load8(s, r, c + 8, x + 8);
#pragma unroll
    for (int j = 0; j < 16; ++j) m = max(m, abs_bits(x[j]));
  }
  m = block_max_bits(m, scratch);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = m;
    __threadfence();
    atomicAdd(barrier, 1u);
    while (atomicAdd(barrier, 0u) < gridDim.x) __nanosleep(64);
  }
  __syncthreads();
  uint32_t t = 0;
  for (unsigned int i = threadIdx.x; i < gridDim.x; i += blockDim.x)
    t = max(t, __ldcg(partials + i));
  t = block_max_bits(t, scratch);
  const float amax = __uint_as_float(t), scale = fp8_dequant_scale(amax);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (amax_out != nullptr) *amax_out = amax;
    *scale_out = scale;
  }
  quantize_items<kHw, Index>(s, first, step, scale, out);
}

// Per-row scales: one block per row (grid-stride over rows): row amax, scale[r], then the row.
template <bool kHw>
__global__ void fp8_quantize_rows_kernel(CatSource s, float* scales, uint8_t* out) {
  __shared__ uint32_t scratch[32];
  for (int64_t r = blockIdx.x; r < s.rows; r += gridDim.x) {
    uint32_t m = 0;
    for (int64_t c = threadIdx.x * int64_t{8}; c < s.cols; c += int64_t{blockDim.x} * 8) {
      float x[8];
      load8(s, r, c, x);
#pragma unroll
      for (int j = 0; j < 8; ++j) m = max(m, abs_bits(x[j]));
    }
    const float scale = fp8_dequant_scale(__uint_as_float(block_max_bits(m, scratch)));
    if (threadIdx.x == 0) scales[r] = scale;
    const float encode = fp8_encode_factor(scale);
    for (int64_t c = threadIdx.x * int64_t{16}; c < s.cols; c += int64_t{blockDim.x} * 16) {
      float x[16];
      load8(s, r, c, x);
      load8(s, r, c + 8, x + 8);
      *reinterpret_cast<uint4*>(out + r * s.cols + c) = fp8_pack16<kHw>(x, encode);
    }
  }
}

// NVFP4: one item per 16-element block of the *padded* scale grid (rows padded to 128, K-blocks
// to 4), so the kernel also writes the zero padding. Items 4j..4j+3 are K-blocks 4j'..4j'+3 of one
// row and sit in lanes 4l..4l+3 of a warp, which gather their 4 scale bytes into one 32-bit store
// (the 4 bytes are contiguous in the 128x4 layout).
template <bool kHw>
__global__ void nvfp4_quantize_kernel(CatSource s, const float* global_scale_ptr, uint8_t* out,
                                      uint8_t* scales) {
  const float gs = *global_scale_ptr;
  const int64_t k_blocks = s.cols / kNvfp4BlockSize;
  const int64_t padded_blocks = nvfp4_scale_padded_blocks(s.cols);
  const int64_t k_tiles = padded_blocks / kNvfp4ScaleTileBlocks;
  const int64_t items = nvfp4_scale_padded_rows(s.rows) * padded_blocks;  // a multiple of 512
  const int lane = threadIdx.x & 31;
  // The loop bound is warp-uniform (items and the stride are multiples of 32), as the shuffles
  // need.
  for (int64_t base = blockIdx.x * int64_t{blockDim.x} + (threadIdx.x - lane); base < items;
       base += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = base + lane;
    const int64_t m = i / padded_blocks, kb = i % padded_blocks;
    uint32_t sf = 0;
    if (m < s.rows && kb < k_blocks) {
      float x[16];
      load8(s, m, kb * 16, x);
      load8(s, m, kb * 16 + 8, x + 8);
      uint8_t packed[8];
      sf = nvfp4_quantize_block16<DeviceCvt<kHw>>(x, gs, packed);
      uint2 word;
      word.x = packed[0] | (packed[1] << 8) | (packed[2] << 16) |
               (static_cast<uint32_t>(packed[3]) << 24);
      word.y = packed[4] | (packed[5] << 8) | (packed[6] << 16) |
               (static_cast<uint32_t>(packed[7]) << 24);
      *reinterpret_cast<uint2*>(out + m * (s.cols / 2) + kb * 8) = word;
    }
    const int first = lane & ~3;
    const uint32_t s0 = __shfl_sync(0xffffffffu, sf, first),
                   s1 = __shfl_sync(0xffffffffu, sf, first + 1);
    const uint32_t s2 = __shfl_sync(0xffffffffu, sf, first + 2),
                   s3 = __shfl_sync(0xffffffffu, sf, first + 3);
    if ((lane & 3) == 0) {
      *reinterpret_cast<uint32_t*>(scales + nvfp4_scale_offset(m, kb, k_tiles)) =
          s0 | (s1 << 8) | (s2 << 16) | (s3 << 24);
    }
  }
}

// ---- launcher helpers ----

bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

absl::Status check_mat(const char* op, const char* name, const Mat& m) {
  if (m.rows < 0 || m.cols < 0 || m.stride < m.cols) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " [", m.rows, ", ", m.cols,
                                                   "] stride ", m.stride,
                                                   " is not a valid matrix"));
  }
  if (m.rows > 0 && m.cols > 0 && m.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is null"));
  }
  if (!aligned(m.data, 2))
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is not 2-byte aligned"));
  return absl::OkStatus();
}

// Validates the input and builds its CatSource: K = D + F a positive multiple of 16.
absl::Status make_source(const char* op, const QuantizeInput& in, CatSource* s) {
  if (auto st = check_mat(op, "first", in.first); !st.ok()) return st;
  const bool has_second = in.second.cols != 0;  // negative columns fail check_mat
  if (has_second) {
    if (auto st = check_mat(op, "second", in.second); !st.ok()) return st;
    if (in.second.rows != in.first.rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": the concatenated inputs have ", in.first.rows, " and ", in.second.rows, " rows"));
    }
  }
  const int64_t cols = in.first.cols + (has_second ? in.second.cols : 0);
  if (cols <= 0 || cols % kNvfp4BlockSize != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": K = ", cols, " is not a positive multiple of 16"));
  }
  s->a = static_cast<const uint16_t*>(in.first.data);
  s->a_stride = in.first.stride;
  s->d = in.first.cols;
  s->b = has_second ? static_cast<const uint16_t*>(in.second.data) : nullptr;
  s->b_stride = has_second ? in.second.stride : 0;
  s->rows = in.first.rows;
  s->cols = cols;
  s->vec = in.first.cols % 8 == 0 && (in.first.cols == 0 || rows_aligned16(in.first, 2)) &&
           (!has_second || rows_aligned16(in.second, 2));
  return absl::OkStatus();
}

absl::Status check_output(const char* op, const char* name, const void* p, int64_t capacity,
                          int64_t needed) {
  if (needed > 0 && p == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is null"));
  if (!aligned(p, 16))
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is not 16-byte aligned"));
  if (capacity < needed) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " holds ", capacity, " bytes, ", needed, " needed"));
  }
  return absl::OkStatus();
}

absl::Status check_scalar(const char* op, const char* name, const float* p, bool optional) {
  if (p == nullptr && !optional)
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is null"));
  if (!aligned(p, 4))
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is not 4-byte aligned"));
  return absl::OkStatus();
}

absl::Status check_workspace(const char* op, const void* workspace, int64_t bytes) {
  if (workspace == nullptr || !aligned(workspace, 4) || bytes < kQuantizeWorkspaceBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": the workspace must be 4-byte aligned and hold ", kQuantizeWorkspaceBytes, " bytes"));
  }
  return absl::OkStatus();
}

// What a dynamic quantizer needs beyond its operands: an optional aligned amax output and the
// workspace of its amax passes.
absl::Status check_dynamic(const char* op, const float* amax, const void* workspace,
                           int64_t workspace_bytes) {
  if (auto st = check_scalar(op, "amax", amax, true); !st.ok()) return st;
  return check_workspace(op, workspace, workspace_bytes);
}

// Passes 1 and 2 of a dynamic quantizer.
absl::Status launch_amax(const char* op, const CatSource& s, void* workspace, ScaleKind kind,
                         float* amax, float* scale, cudaStream_t stream) {
  const int64_t segments = s.rows * (s.cols / 8);
  const int blocks = static_cast<int>(
      std::clamp<int64_t>((segments + kThreads - 1) / kThreads, 1, kAmaxMaxBlocks));
  uint32_t* partials = static_cast<uint32_t*>(workspace);
  amax_partials_kernel<<<blocks, kThreads, 0, stream>>>(s, partials);
  amax_finalize_kernel<<<1, kThreads, 0, stream>>>(partials, blocks, kind, amax, scale);
  FLUX_RETURN_IF_LAUNCH_FAILED(op);
  return absl::OkStatus();
}

absl::Status validate_fp8(const char* op, const Fp8QuantizeArgs& args, CatSource* s) {
  if (auto st = make_source(op, args.in, s); !st.ok()) return st;
  if (auto st = check_output(op, "out", args.out, args.out_bytes, s->rows * s->cols); !st.ok())
    return st;
  if (args.row_scales != nullptr && !aligned(args.row_scales, 4)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": row_scales is not 4-byte aligned"));
  }
  return check_scalar(op, "scale", args.scale, false);
}

absl::Status launch_fp8_quantize_static(const char* op, const Fp8QuantizeArgs& args,
                                        const CatSource& s, cudaStream_t stream) {
  const int grid = grid_for(s.rows * (s.cols / 16), kThreads);
  uint8_t* out = static_cast<uint8_t*>(args.out);
  const bool hw = args.conversion != QuantizeConversion::kSoftware;
  // Both loops' indices (items, and rows for row_scales) fit: rows <= items.
  const bool narrow = fits_32bit(s.rows * (s.cols / 16) + int64_t{grid} * kThreads);
  const float* scale = args.scale;
  float* rows = args.row_scales;
  if (hw && narrow) {
    fp8_quantize_static_kernel<true, uint32_t><<<grid, kThreads, 0, stream>>>(s, scale, rows, out);
  } else if (hw) {
    fp8_quantize_static_kernel<true, int64_t><<<grid, kThreads, 0, stream>>>(s, scale, rows, out);
  } else if (narrow) {
    fp8_quantize_static_kernel<false, uint32_t><<<grid, kThreads, 0, stream>>>(s, scale, rows, out);
  } else {
    fp8_quantize_static_kernel<false, int64_t><<<grid, kThreads, 0, stream>>>(s, scale, rows, out);
  }
  FLUX_RETURN_IF_LAUNCH_FAILED(op);
  return absl::OkStatus();
}

absl::Status validate_nvfp4(const char* op, const Nvfp4QuantizeArgs& args, CatSource* s) {
  if (auto st = make_source(op, args.in, s); !st.ok()) return st;
  if (auto st = check_output(op, "out", args.out, args.out_bytes, s->rows * s->cols / 2); !st.ok())
    return st;
  if (auto st = check_output(op, "scales", args.scales, args.scales_bytes,
                             nvfp4_scale_bytes(s->rows, s->cols));
      !st.ok()) {
    return st;
  }
  return check_scalar(op, "global_scale", args.global_scale, false);
}

absl::Status launch_nvfp4_quantize(const char* op, const Nvfp4QuantizeArgs& args,
                                   const CatSource& s, cudaStream_t stream) {
  const int grid = grid_for(nvfp4_scale_bytes(s.rows, s.cols), kThreads);
  uint8_t* out = static_cast<uint8_t*>(args.out);
  uint8_t* scales = static_cast<uint8_t*>(args.scales);
  if (args.conversion == QuantizeConversion::kSoftware) {
    nvfp4_quantize_kernel<false><<<grid, kThreads, 0, stream>>>(s, args.global_scale, out, scales);
  } else {
    nvfp4_quantize_kernel<true><<<grid, kThreads, 0, stream>>>(s, args.global_scale, out, scales);
  }
  FLUX_RETURN_IF_LAUNCH_FAILED(op);
  return absl::OkStatus();
}

// ---- conversion probes ----

__global__ void hardware_probe_kernel(int* flags) {
  flags[0] = FLUX_HAS_E4M3_CVT;
  flags[1] = FLUX_HAS_E2M1_CVT;
}

__global__ void mismatch_init_kernel(unsigned long long* counts, unsigned long long count) {
  counts[0] = counts[1] = 0;
  counts[2] = counts[3] = 1ull << 32;
  counts[4] = FLUX_HAS_E4M3_CVT ? count : 0;
  counts[5] = FLUX_HAS_E2M1_CVT ? count : 0;
}

// Each input x is converted as the low element of a pair whose high element is -x, so both halves
// of the x2 instructions are compared.
__global__ void mismatch_kernel(uint64_t first, uint64_t count, unsigned long long* counts) {
  unsigned long long bad4 = 0, bad2 = 0, min4 = 1ull << 32, min2 = 1ull << 32;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < count;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint32_t bits = static_cast<uint32_t>(first + i);
    const float x = __uint_as_float(bits), y = __uint_as_float(bits ^ 0x80000000u);
#if FLUX_HAS_E4M3_CVT
    if (DeviceCvt<true>::e4m3x2(x, y) != DeviceCvt<false>::e4m3x2(x, y)) {
      ++bad4;
      min4 = min(min4, static_cast<unsigned long long>(bits));
    }
#endif
#if FLUX_HAS_E2M1_CVT
    if (DeviceCvt<true>::e2m1x2(x, y) != DeviceCvt<false>::e2m1x2(x, y)) {
      ++bad2;
      min2 = min(min2, static_cast<unsigned long long>(bits));
    }
#endif
  }
  // Integer atomics only: the totals do not depend on the order.
  if (bad4 != 0) {
    atomicAdd(&counts[0], bad4);
    atomicMin(&counts[2], min4);
  }
  if (bad2 != 0) {
    atomicAdd(&counts[1], bad2);
    atomicMin(&counts[3], min2);
  }
}

}  // namespace

absl::Status fp8_quantize_dynamic(const Fp8QuantizeArgs& args, cudaStream_t stream) {
  constexpr const char* kOp = "fp8_quantize_dynamic";
  CatSource s;
  if (auto st = validate_fp8(kOp, args, &s); !st.ok()) return st;
  if (auto st = check_dynamic(kOp, args.amax, args.workspace, args.workspace_bytes); !st.ok()) {
    return st;
  }
  // One cooperative kernel: as many blocks as are resident at once (the grid barrier needs every
  // block running), at most the workspace's partial slots; the last word is the barrier.
  const bool hw = args.conversion != QuantizeConversion::kSoftware;
  const int64_t items = s.rows * (s.cols / 16);
  const bool narrow = fits_32bit(items + int64_t{kAmaxMaxBlocks} * kThreads);  // 32-bit indices
  const void* kernels[2][2] = {
      {reinterpret_cast<const void*>(&fp8_quantize_dynamic_kernel<false, int64_t>),
       reinterpret_cast<const void*>(&fp8_quantize_dynamic_kernel<false, uint32_t>)},
      {reinterpret_cast<const void*>(&fp8_quantize_dynamic_kernel<true, int64_t>),
       reinterpret_cast<const void*>(&fp8_quantize_dynamic_kernel<true, uint32_t>)}};
  const void* kernel = kernels[hw][narrow];
  // Per kernel: blocks resident on the whole device; per thread, as each thread launches on one
  // device (a --gpus N rank's thread on its own), so no two threads share the counts.
  static thread_local int resident[2][2] = {{0, 0}, {0, 0}};
  int& capacity = resident[hw][narrow];
  if (capacity == 0) {
    const absl::StatusOr<int> blocks = resident_blocks(kernel, kThreads, kOp);
    if (!blocks.ok()) return blocks.status();
    capacity = *blocks;
  }
  const int grid = static_cast<int>(std::clamp<int64_t>((items + kThreads - 1) / kThreads, 1,
                                                        std::min(capacity, kAmaxMaxBlocks - 1)));
  uint32_t* partials = static_cast<uint32_t*>(args.workspace);
  unsigned int* barrier = reinterpret_cast<unsigned int*>(partials + kAmaxMaxBlocks - 1);
  if (auto st = cuda_status(cudaMemsetAsync(barrier, 0, sizeof(unsigned int), stream), kOp);
      !st.ok()) {
    return st;
  }
  uint8_t* out = static_cast<uint8_t*>(args.out);
  float* amax = args.amax;
  float* scale = args.scale;
  void* params[] = {&s, &partials, &barrier, &amax, &scale, &out};
  if (auto st = cuda_status(
          cudaLaunchCooperativeKernel(kernel, dim3(grid), dim3(kThreads), params, 0, stream), kOp);
      !st.ok()) {
    return st;
  }
  return absl::OkStatus();
}

absl::Status fp8_quantize_static(const Fp8QuantizeArgs& args, cudaStream_t stream) {
  constexpr const char* kOp = "fp8_quantize_static";
  CatSource s;
  if (auto st = validate_fp8(kOp, args, &s); !st.ok()) return st;
  if (s.rows == 0) return absl::OkStatus();
  return launch_fp8_quantize_static(kOp, args, s, stream);
}

absl::Status fp8_quantize_rows(const Fp8QuantizeArgs& args, cudaStream_t stream) {
  constexpr const char* kOp = "fp8_quantize_rows";
  CatSource s;
  if (auto st = validate_fp8(kOp, args, &s); !st.ok()) return st;
  if (s.rows == 0) return absl::OkStatus();
  const int grid = static_cast<int>(std::min<int64_t>(s.rows, 132 * 16));  // grid-stride over rows
  uint8_t* out = static_cast<uint8_t*>(args.out);
  if (args.conversion == QuantizeConversion::kSoftware) {
    fp8_quantize_rows_kernel<false><<<grid, kThreads, 0, stream>>>(s, args.scale, out);
  } else {
    fp8_quantize_rows_kernel<true><<<grid, kThreads, 0, stream>>>(s, args.scale, out);
  }
  FLUX_RETURN_IF_LAUNCH_FAILED(kOp);
  return absl::OkStatus();
}

absl::Status nvfp4_quantize_dynamic(const Nvfp4QuantizeArgs& args, cudaStream_t stream) {
  constexpr const char* kOp = "nvfp4_quantize_dynamic";
  CatSource s;
  if (auto st = validate_nvfp4(kOp, args, &s); !st.ok()) return st;
  if (auto st = check_dynamic(kOp, args.amax, args.workspace, args.workspace_bytes); !st.ok()) {
    return st;
  }
  if (auto st = launch_amax(kOp, s, args.workspace, ScaleKind::kNvfp4Global, args.amax,
                            args.global_scale, stream);
      !st.ok()) {
    return st;
  }
  return launch_nvfp4_quantize(kOp, args, s, stream);
}

absl::Status nvfp4_quantize_static(const Nvfp4QuantizeArgs& args, cudaStream_t stream) {
  constexpr const char* kOp = "nvfp4_quantize_static";
  CatSource s;
  if (auto st = validate_nvfp4(kOp, args, &s); !st.ok()) return st;
  return launch_nvfp4_quantize(kOp, args, s, stream);
}

absl::StatusOr<QuantizeHardware> quantize_hardware_conversions() {
  int* flags = nullptr;
  if (auto st = cuda_status(cudaMalloc(&flags, 2 * sizeof(int)),
                            "quantize_hardware_conversions: cudaMalloc");
      !st.ok()) {
    return st;
  }
  hardware_probe_kernel<<<1, 1>>>(flags);
  int host[2] = {0, 0};
  cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) error = cudaMemcpy(host, flags, sizeof(host), cudaMemcpyDeviceToHost);
  FLUX_CUDA_CHECK(cudaFree(flags));
  if (auto st = cuda_status(error, "quantize_hardware_conversions"); !st.ok()) return st;
  QuantizeHardware hw;
  hw.e4m3_cvt = host[0] != 0;
  hw.e2m1_cvt = host[1] != 0;
  return hw;
}

absl::Status quantize_conversion_mismatches(uint64_t first, uint64_t count,
                                            unsigned long long* counts, cudaStream_t stream) {
  if (counts == nullptr || !aligned(counts, 8)) {
    return absl::InvalidArgumentError(
        "quantize_conversion_mismatches: counts must be 8-byte aligned device memory");
  }
  if (count == 0 || first + count > (uint64_t{1} << 32)) {
    return absl::InvalidArgumentError(
        "quantize_conversion_mismatches: [first, first + count) must lie in [0, 2^32)");
  }
  mismatch_init_kernel<<<1, 1, 0, stream>>>(counts, count);
  mismatch_kernel<<<132 * 16, kThreads, 0, stream>>>(first, count, counts);
  FLUX_RETURN_IF_LAUNCH_FAILED("quantize_conversion_mismatches");
  return absl::OkStatus();
}

}  // namespace flux2::cuda
