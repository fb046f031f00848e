// The E4M3 operands of our FP8 flash attention (attention_fp8_operands.h): one kernel quantizes Q
// and K block by block, one transposes and quantizes V block by block; one dequantizes a cached key
// segment. Tested bit for bit against CPU references by tests/cuda/flash_attention_fp8_test.cc and
// flash_attention_fp8_keys_test.cc.
#include "kernels/cuda/attention_fp8_operands.h"

#include <algorithm>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/flash_attention_fp8.h"
#include "kernels/cuda/fp8_convert.cuh"
#include "kernels/cuda/head_norm.cuh"
#include "kernels/cuda/launch.cuh"

namespace flux2::cuda {
namespace {

constexpr int kTile = 128;  // tokens per block = kFlashFp8KeyBlock; 128 channels = one head
constexpr int kThreads = 256;

struct Bf16Matrix {
  const __nv_bfloat16* data;
  int64_t stride;  // elements
};

struct QkNormArgs {
  const __nv_bfloat16* weight[2][2];  // [Q or K][rows before / from split]
  int split;
  float eps;
  const float* cos;
  const float* sin;
  int64_t cos_stride, sin_stride;  // elements
};

// QK-norm + RoPE of the 8 elements x (head elements 8·pack ..) of one row, returned packed as bf16
// in memory order (x is overwritten), as qk_norm_rope's vectorized kernel computes them: there
// lane l holds elements 4l..4l+3, so this thread holds
// lanes 2·pack and 2·pack + 1, and the warp sum of squares runs the same butterfly (lane offsets
// 16, 8, 4, 2 are thread offsets 8, 4, 2, 1 among the row's 16 threads; offset 1 is local).
__device__ __forceinline__ uint4 norm_rope8(float x[8], const float w[8], const float c[8],
                                            const float s[8], float eps) {
  float squares[2] = {0.0f, 0.0f};
#pragma unroll
  for (int e = 0; e < 8; ++e) squares[e / 4] = __fadd_rn(squares[e / 4], __fmul_rn(x[e], x[e]));
#pragma unroll
  for (int offset = 8; offset > 0; offset /= 2) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
      squares[j] = __fadd_rn(squares[j], __shfl_xor_sync(0xffffffffu, squares[j], offset));
  }
  const float rstd = head_rstd_of<128>(__fadd_rn(squares[0], squares[1]), eps);
#pragma unroll
  for (int e = 0; e < 8; ++e) x[e] = head_norm_value(x[e], rstd, w[e], RopeStyle::kInterleaved);
  uint32_t words[4];
#pragma unroll
  for (int e = 0; e < 8;
       e += 2) {  // interleaved pairs: rot(x)[2m] = -x[2m+1], rot(x)[2m+1] = x[2m]
    const float even = x[e], odd = x[e + 1];
    // Both rounded to bf16 by one conversion (the round_bf16 of qk_norm_rope), low half first.
    const __nv_bfloat162 pair = __floats2bfloat162_rn(
        rope_value(even, odd, -1.0f, c[e], s[e], RopeStyle::kInterleaved),
        rope_value(odd, even, 1.0f, c[e + 1], s[e + 1], RopeStyle::kInterleaved));
    words[e / 2] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

__device__ __forceinline__ void load_f32x8(const float* p, float out[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z,
  out[7] = b.w;
}

// Q and K block by block: item (tile, which, head), which = 0 (Q) or 1 (K), ordered tile-major
// over the tiles both have, then the longer one's other tiles; each resident block takes a
// contiguous run of items. Per item: the scale from the block's amax,
// E4M3 out; kNorm: QK-norm + RoPE first (norm_rope8). A thread holds 4 rows x 8 channels. It keeps
// the rows' cos/sin in registers while the tile stays the same, and the next item's loads are in
// flight while it works on this one.
constexpr int kQkThreads = 512;
constexpr int kQkRowsPerThread = kTile / (kQkThreads / 16);  // 4

template <bool kNorm>
__global__ void __launch_bounds__(kQkThreads, 1)
    quantize_qk_kernel(Bf16Matrix q, Bf16Matrix k, int q_tokens, int kv_tokens, int heads,
                       uint8_t* q8, uint8_t* k8, float* scales, QkNormArgs norm) {
  __shared__ uint32_t scratch[32];
  __shared__ __align__(16) float weights[2][2][128];  // [Q or K][before / from split]
  const int q_tiles = (q_tokens + kTile - 1) / kTile, kv_tiles = (kv_tokens + kTile - 1) / kTile;
  const int common = min(q_tiles, kv_tiles), items = (q_tiles + kv_tiles) * heads;
  const int begin = static_cast<int>(int64_t{blockIdx.x} * items / gridDim.x);
  const int end = static_cast<int>(int64_t{blockIdx.x + 1} * items / gridDim.x);
  const int pack = threadIdx.x % 16, slot = threadIdx.x / 16;
  if constexpr (kNorm) {
    const int vec = threadIdx.x / 128, element = threadIdx.x % 128;  // 4 vectors of 128
    // Selected, not indexed: an indexed parameter array would be copied to local memory.
    const __nv_bfloat16* source = vec == 0   ? norm.weight[0][0]
                                  : vec == 1 ? norm.weight[0][1]
                                  : vec == 2 ? norm.weight[1][0]
                                             : norm.weight[1][1];
    weights[vec / 2][vec % 2][element] = __bfloat162float(source[element]);
    __syncthreads();
  }
  struct Item {
    int tile, which, head;
  };
  auto item_at = [&](int i) {
    if (i < common * 2 * heads) {
      const int tile = i / (2 * heads), rest = i % (2 * heads);
      return Item{tile, rest / heads, rest % heads};
    }
    const int j = i - common * 2 * heads;
    return Item{common + j / heads, q_tiles > kv_tiles ? 0 : 1, j % heads};
  };
  auto tokens_of = [&](int which) { return which == 0 ? q_tokens : kv_tokens; };
  auto row_of = [&](int tile, int i) { return tile * kTile + slot + (kQkThreads / 16) * i; };
  auto load_item = [&](const Item& it, uint4 raw[kQkRowsPerThread]) {
    const Bf16Matrix in = it.which == 0 ? q : k;
#pragma unroll
    for (int i = 0; i < kQkRowsPerThread; ++i) {
      const int row = row_of(it.tile, i);
      raw[i] = row < tokens_of(it.which) ? *reinterpret_cast<const uint4*>(
                                               in.data + row * in.stride + it.head * 128 + pack * 8)
                                         : make_uint4(0, 0, 0, 0);
    }
  };
  float c[kQkRowsPerThread][8], s[kQkRowsPerThread][8];
  int tile_of_rope = -1;
  uint4 next[kQkRowsPerThread];
  if (begin < end) load_item(item_at(begin), next);
  for (int i = begin; i < end; ++i) {
    const Item it = item_at(i);
    uint4 raw[kQkRowsPerThread];
#pragma unroll
    for (int r = 0; r < kQkRowsPerThread; ++r) raw[r] = next[r];
    if (i + 1 < end) load_item(item_at(i + 1), next);
    if constexpr (kNorm) {
      if (it.tile != tile_of_rope) {
        tile_of_rope = it.tile;
#pragma unroll
        for (int r = 0; r < kQkRowsPerThread; ++r) {
          const int row = row_of(it.tile, r);
#pragma unroll
          for (int e = 0; e < 8; ++e) c[r][e] = s[r][e] = 0.0f;
          if (row < q_tokens) {  // the fused norm has as many q as k rows
            load_f32x8(norm.cos + row * norm.cos_stride + 8 * pack, c[r]);
            load_f32x8(norm.sin + row * norm.sin_stride + 8 * pack, s[r]);
          }
        }
      }
    }
    uint32_t magnitudes = 0;  // bf16x2
#pragma unroll
    for (int r = 0; r < kQkRowsPerThread; ++r) {
      if constexpr (kNorm) {
        float x[8], weight[8];
        unpack_bf16x8(raw[r], x);
        load_f32x8(&weights[it.which][row_of(it.tile, r) < norm.split ? 0 : 1][8 * pack], weight);
        raw[r] = norm_rope8(x, weight, c[r], s[r], norm.eps);
      }
      magnitudes = max_magnitudes_bf16x8(magnitudes, raw[r]);
    }
    const uint32_t amax = block_max_bits(magnitude_bits_of(magnitudes), scratch);
    const float scale = fp8_dequant_scale(__uint_as_float(amax));
    const float encode = fp8_encode_factor(scale);
    if (threadIdx.x == 0) {
      scales[it.which == 0 ? it.head * q_tiles + it.tile
                           : heads * q_tiles + it.head * kv_tiles + it.tile] = scale;
    }
    uint8_t* out = it.which == 0 ? q8 : k8;
    const int width = heads * 128;
#pragma unroll
    for (int r = 0; r < kQkRowsPerThread; ++r) {
      const int row = row_of(it.tile, r);
      if (row < tokens_of(it.which)) {
        float x[8];
        unpack_bf16x8(raw[r], x);
        *reinterpret_cast<uint2*>(out + static_cast<int64_t>(row) * width + it.head * 128 +
                                  pack * 8) = fp8_pack8<true>(x, encode);
      }
    }
  }
}

// V [tokens, width] bf16 -> Vᵀ E4M3 [width, padded], keys permuted (flash_fp8_position_of), one
// power-of-two scale per block of 128 keys and head (flash_fp8_value_scale). One block per such
// block: 16-byte reads of key rows, the block's amax, a shared-memory transpose, 16-byte writes of
// channel rows; the padding keys are zeros.
__global__ void __launch_bounds__(kThreads)
    transpose_values_kernel(Bf16Matrix v, int tokens, uint8_t* vt, int64_t vt_stride,
                            float* scales) {
  // [channel][position], 16-byte chunks of a row XOR-swizzled by (channel / 8) % 8, so that the
  // byte stores of one warp (16 channel groups) spread over the banks.
  __shared__ __align__(16) uint8_t tile[128][kTile];
  __shared__ uint32_t scratch[32];
  const int key0 = blockIdx.x * kTile, head = blockIdx.y, channel0 = head * 128;
  const int pack = threadIdx.x % 16, first_key = threadIdx.x / 16;  // 8 channels per pack
  uint4 raw[8];             // bf16 as loaded: half the registers of floats, so more blocks per SM
  uint32_t magnitudes = 0;  // bf16x2
#pragma unroll
  for (int i = 0; i < 8; ++i) {  // 128 keys x 16 packs
    const int key = first_key + 16 * i;
    raw[i] = key0 + key < tokens ? *reinterpret_cast<const uint4*>(
                                       v.data + (key0 + key) * v.stride + channel0 + 8 * pack)
                                 : make_uint4(0, 0, 0, 0);
    magnitudes = max_magnitudes_bf16x8(magnitudes, raw[i]);
  }
  const float scale = flash_fp8_value_scale(
      __uint_as_float(block_max_bits(magnitude_bits_of(magnitudes), scratch)));
  if (threadIdx.x == 0) scales[head * gridDim.x + blockIdx.x] = scale;
  const float encode = fp8_encode_factor(scale);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int key = first_key + 16 * i;
    float x[8];
    unpack_bf16x8(raw[i], x);
    const uint2 packed = fp8_pack8<true>(x, encode);
    const int swizzled = static_cast<int>(flash_fp8_position_of(key)) ^ ((pack % 8) * 16);
    const auto* bytes = reinterpret_cast<const uint8_t*>(&packed);
#pragma unroll
    for (int c = 0; c < 8; ++c)
      tile[8 * pack + c][swizzled] = bytes[c];  // (channel / 8) % 8 == pack % 8
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 128 * (kTile / 16); i += kThreads) {  // 128 channels x 8 packs
    const int channel = i / (kTile / 16), chunk = i % (kTile / 16);
    *reinterpret_cast<uint4*>(vt + (channel0 + channel) * vt_stride + key0 + 16 * chunk) =
        *reinterpret_cast<const uint4*>(&tile[channel][16 * (chunk ^ ((channel / 8) % 8))]);
  }
}

// A cached key segment back to bf16 (dequantize_attention_keys_fp8): one block per (block of 128
// keys, head); K's rows read and written in key order, Vᵀ's channel rows read in position order
// and written to their keys (flash_fp8_key_at). A fallback: simple, not fast.
__global__ void __launch_bounds__(kThreads)
    dequantize_keys_kernel(const uint8_t* k8, int64_t k_stride, const uint8_t* vt,
                           int64_t vt_stride, const float* scale_k, const float* scale_v, int keys,
                           __nv_bfloat16* k_out, int64_t k_out_stride, __nv_bfloat16* v_out,
                           int64_t v_out_stride) {
  const int tile = blockIdx.x, head = blockIdx.y, tiles = gridDim.x;
  const float k_scale = scale_k[head * tiles + tile], v_scale = scale_v[head * tiles + tile];
  for (int i = threadIdx.x; i < kTile * 128; i += kThreads) {
    const int key = tile * kTile + i / 128, channel = head * 128 + i % 128;
    if (key < keys) {
      k_out[key * k_out_stride + channel] =
          __float2bfloat16_rn(e4m3_to_f32(k8[key * k_stride + channel]) * k_scale);
    }
    const int position = tile * kTile + i % kTile, v_channel = head * 128 + i / kTile;
    const int v_key = static_cast<int>(flash_fp8_key_at(position));
    if (v_key < keys) {
      v_out[v_key * v_out_stride + v_channel] =
          __float2bfloat16_rn(e4m3_to_f32(vt[v_channel * vt_stride + position]) * v_scale);
    }
  }
}

absl::Status check_input(const Mat& m, int64_t tokens, int64_t width, const char* field) {
  if (m.rows != tokens || m.cols != width || !rows_aligned16(m, 2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantize_attention_operands_fp8: ", field, " must be bf16 [", tokens, ", ", width,
        "] with 16-byte aligned rows, got [", m.rows, ", ", m.cols, "] stride ", m.stride));
  }
  return absl::OkStatus();
}

// The fused QK-norm's kernel arguments for `tokens` rows of q and of k, or why they do not fit.
absl::StatusOr<QkNormArgs> qk_norm_args(const FlashFp8QkNorm& norm, int64_t q_tokens,
                                        int64_t kv_tokens) {
  if (q_tokens != kv_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantize_attention_operands_fp8: the fused QK-norm needs as many q as k rows, got ",
        q_tokens, " and ", kv_tokens));
  }
  QkNormArgs args{};
  for (int i = 0; i < 2; ++i) {
    for (const void* weight : {norm.q_weight[i], norm.k_weight[i]}) {
      if (weight == nullptr || !aligned16(weight)) {
        return absl::InvalidArgumentError(
            "quantize_attention_operands_fp8: norm weights must be 16-byte aligned");
      }
    }
    args.weight[0][i] = static_cast<const __nv_bfloat16*>(norm.q_weight[i]);
    args.weight[1][i] = static_cast<const __nv_bfloat16*>(norm.k_weight[i]);
  }
  for (const Mat* table : {&norm.cos, &norm.sin}) {
    if (table->rows != q_tokens || table->cols != 128 || !rows_aligned16(*table, 4)) {
      return absl::InvalidArgumentError(
          "quantize_attention_operands_fp8: cos and sin must be f32 [S, 128], rows 16-byte "
          "aligned");
    }
  }
  if (norm.split < 0 || norm.split > q_tokens) {
    return absl::InvalidArgumentError("quantize_attention_operands_fp8: split outside [0, S]");
  }
  args.split = static_cast<int>(norm.split);
  args.eps = norm.eps;
  args.cos = static_cast<const float*>(norm.cos.data);
  args.sin = static_cast<const float*>(norm.sin.data);
  args.cos_stride = norm.cos.stride;
  args.sin_stride = norm.sin.stride;
  return args;
}

// Shapes and buffers of quantize_attention_operands_fp8, naming what does not fit.
absl::Status check_operands(const Mat& q, const Mat& k, const Mat& v, int64_t heads,
                            const FlashFp8Operands& out) {
  const int64_t q_tokens = q.rows, kv_tokens = k.rows, width = heads * kFlashFp8HeadDim;
  constexpr int64_t kMaxTokens = int64_t{1} << 30;
  if (heads <= 0 || heads > 65535 || q_tokens < 0 || q_tokens > kMaxTokens || kv_tokens <= 0 ||
      kv_tokens > kMaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantize_attention_operands_fp8: ", heads, " heads, ", q_tokens, " q and ", kv_tokens,
        " k rows out of range (1..65535 heads, 0..2^30 q and 1..2^30 k rows)"));
  }
  if (q_tokens > 0) FLUX_RETURN_IF_ERROR(check_input(q, q_tokens, width, "q"));
  FLUX_RETURN_IF_ERROR(check_input(k, kv_tokens, width, "k"));
  FLUX_RETURN_IF_ERROR(check_input(v, kv_tokens, width, "v"));
  const void* buffers[] = {q_tokens > 0 ? out.q : out.k, out.k, out.vt, out.scales};
  for (const void* p : buffers) {
    if (p == nullptr || !aligned16(p)) {
      return absl::InvalidArgumentError(
          "quantize_attention_operands_fp8: q, k, vt and scales must be 16-byte aligned buffers");
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t flash_fp8_scale_count(int64_t heads, int64_t q_tokens, int64_t kv_tokens) {
  return heads * (flash_fp8_tiles(q_tokens) + 2 * flash_fp8_tiles(kv_tokens));
}

FlashFp8KeySegment flash_fp8_key_segment(const FlashFp8Operands& operands, int64_t q_tokens,
                                         int64_t kv_tokens, int64_t heads) {
  const int64_t width = heads * kFlashFp8HeadDim;
  FlashFp8KeySegment keys;
  keys.k = Mat{operands.k, kv_tokens, width, width};
  keys.vt = operands.vt;
  keys.scale_k = operands.scales + heads * flash_fp8_tiles(q_tokens);
  keys.scale_v = keys.scale_k + heads * flash_fp8_tiles(kv_tokens);
  return keys;
}

FlashFp8Args flash_fp8_args(const FlashFp8Operands& operands, int64_t q_tokens, int64_t kv_tokens,
                            int64_t heads) {
  const int64_t width = heads * kFlashFp8HeadDim;
  FlashFp8Args args;
  args.q = Mat{operands.q, q_tokens, width, width};
  args.keys[0] = flash_fp8_key_segment(operands, q_tokens, kv_tokens, heads);
  args.heads = heads;
  args.scale_q = operands.scales;
  return args;
}

absl::Status quantize_attention_operands_fp8(const Mat& q, const Mat& k, const Mat& v,
                                             int64_t heads, const FlashFp8Operands& out,
                                             cudaStream_t stream, const FlashFp8QkNorm* norm) {
  FLUX_RETURN_IF_ERROR(check_operands(q, k, v, heads, out));
  const int64_t q_tokens = q.rows, kv_tokens = k.rows;
  QkNormArgs norm_args{};
  if (norm != nullptr) {
    FLUX_ASSIGN_OR_RETURN(norm_args, qk_norm_args(*norm, q_tokens, kv_tokens));
  }
  auto matrix = [](const Mat& m) {
    return Bf16Matrix{static_cast<const __nv_bfloat16*>(m.data), m.stride};
  };
  auto kernel = norm != nullptr ? quantize_qk_kernel<true> : quantize_qk_kernel<false>;
  // Per kernel: blocks resident on the whole device (its grid). Per thread: each thread launches
  // on one device (a --gpus N rank's thread on its own), so no two threads share the counts.
  static thread_local int resident[2] = {0, 0};
  int& capacity = resident[norm != nullptr];
  if (capacity == 0) {
    FLUX_ASSIGN_OR_RETURN(capacity, resident_blocks(reinterpret_cast<const void*>(kernel),
                                                    kQkThreads, "quantize_attention_operands_fp8"));
  }
  const int64_t q_tiles = flash_fp8_tiles(q_tokens), kv_tiles = flash_fp8_tiles(kv_tokens);
  const int grid = static_cast<int>(std::min<int64_t>(capacity, (q_tiles + kv_tiles) * heads));
  kernel<<<grid, kQkThreads, 0, stream>>>(matrix(q), matrix(k), static_cast<int>(q_tokens),
                                          static_cast<int>(kv_tokens), static_cast<int>(heads),
                                          static_cast<uint8_t*>(out.q),
                                          static_cast<uint8_t*>(out.k), out.scales, norm_args);
  FLUX_RETURN_IF_LAUNCH_FAILED("quantize_attention_operands_fp8 (Q, K)");
  const dim3 blocks(static_cast<unsigned>(kv_tiles), static_cast<unsigned>(heads));
  transpose_values_kernel<<<blocks, kThreads, 0, stream>>>(
      matrix(v), static_cast<int>(kv_tokens), static_cast<uint8_t*>(out.vt),
      flash_fp8_padded_keys(kv_tokens), out.scales + heads * (q_tiles + kv_tiles));
  FLUX_RETURN_IF_LAUNCH_FAILED("quantize_attention_operands_fp8 (V)");
  return absl::OkStatus();
}

absl::Status dequantize_attention_keys_fp8(const FlashFp8KeySegment& keys, int64_t heads,
                                           const Mat& k_out, const Mat& v_out,
                                           cudaStream_t stream) {
  const int64_t rows = keys.k.rows, width = heads * kFlashFp8HeadDim;
  if (heads <= 0 || heads > 65535 || rows <= 0 || rows > (int64_t{1} << 30) ||
      keys.k.cols != width || keys.vt == nullptr || keys.scale_k == nullptr ||
      keys.scale_v == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("dequantize_attention_keys_fp8: a key segment of ", rows, " x ", keys.k.cols,
                     " for ", heads, " heads of 128, with its Vᵀ and scales"));
  }
  for (const auto& [m, name] : {std::pair{&k_out, "k_out"}, {&v_out, "v_out"}}) {
    if (m->rows != rows || m->cols != width || !rows_aligned16(*m, 2)) {
      return absl::InvalidArgumentError(absl::StrCat("dequantize_attention_keys_fp8: ", name,
                                                     " must be bf16 [", rows, ", ", width,
                                                     "] with 16-byte aligned rows"));
    }
  }
  const dim3 blocks(static_cast<unsigned>(flash_fp8_tiles(rows)), static_cast<unsigned>(heads));
  dequantize_keys_kernel<<<blocks, kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(keys.k.data), keys.k.stride, static_cast<const uint8_t*>(keys.vt),
      flash_fp8_padded_keys(rows), keys.scale_k, keys.scale_v, static_cast<int>(rows),
      static_cast<__nv_bfloat16*>(k_out.data), k_out.stride,
      static_cast<__nv_bfloat16*>(v_out.data), v_out.stride);
  FLUX_RETURN_IF_LAUNCH_FAILED("dequantize_attention_keys_fp8");
  return absl::OkStatus();
}

}  // namespace flux2::cuda
