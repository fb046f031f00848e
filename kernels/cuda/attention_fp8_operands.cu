// The E4M3 operands of our FP8 flash attention (attention_fp8_operands.h): one kernel quantizes Q
// and K block by block, one transposes and quantizes V block by block.
// Tested bit for bit against a CPU reference by tests/cuda/flash_attention_fp8_test.cc.
#include "kernels/cuda/attention_fp8_operands.h"

#include "absl/strings/str_cat.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/flash_attention_fp8.h"
#include "kernels/cuda/fp8_convert.cuh"

namespace flux2::cuda {
namespace {

constexpr int kTile = 128;  // tokens per block = kFlashFp8KeyBlock; 128 channels = one head
constexpr int kThreads = 256;

struct Bf16Matrix {
  const __nv_bfloat16* data;
  int64_t stride;  // elements
};

// Block (tile, head, which), which = 0 (Q) or 1 (K): the scale from the block's amax, E4M3 out.
__global__ void __launch_bounds__(kThreads)
    quantize_blocks_kernel(Bf16Matrix q, Bf16Matrix k, int tokens, int heads, uint8_t* q8,
                           uint8_t* k8, float* scales) {
  __shared__ uint32_t scratch[32];
  const int tile = blockIdx.x, head = blockIdx.y, which = blockIdx.z, tiles = gridDim.x;
  const Bf16Matrix in = which == 0 ? q : k;
  const int pack = threadIdx.x % 16, first_row = tile * kTile + threadIdx.x / 16;
  float x[8][8];
  uint32_t amax = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = first_row + 16 * i;
    if (row < tokens) {
      load8(in.data + row * in.stride + head * 128 + pack * 8, x[i]);
    } else {
#pragma unroll
      for (int c = 0; c < 8; ++c) x[i][c] = 0.0f;
    }
#pragma unroll
    for (int c = 0; c < 8; ++c) amax = max(amax, abs_bits(x[i][c]));
  }
  amax = block_max_bits(amax, scratch);
  const float scale = fp8_dequant_scale(__uint_as_float(amax));
  const float encode = fp8_encode_factor(scale);
  if (threadIdx.x == 0) scales[(which * heads + head) * tiles + tile] = scale;
  uint8_t* out = which == 0 ? q8 : k8;
  const int width = heads * 128;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = first_row + 16 * i;
    if (row < tokens) {
      *reinterpret_cast<uint2*>(out + static_cast<int64_t>(row) * width + head * 128 + pack * 8) =
          fp8_pack8<true>(x[i], encode);
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
  float x[8][8];
  uint32_t amax = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {  // 128 keys x 16 packs
    const int key = first_key + 16 * i;
    if (key0 + key < tokens) {
      load8(v.data + (key0 + key) * v.stride + channel0 + 8 * pack, x[i]);
    } else {
#pragma unroll
      for (int c = 0; c < 8; ++c) x[i][c] = 0.0f;
    }
#pragma unroll
    for (int c = 0; c < 8; ++c) amax = max(amax, abs_bits(x[i][c]));
  }
  const float scale = flash_fp8_value_scale(__uint_as_float(block_max_bits(amax, scratch)));
  if (threadIdx.x == 0) scales[head * gridDim.x + blockIdx.x] = scale;
  const float encode = fp8_encode_factor(scale);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int key = first_key + 16 * i;
    const uint2 packed = fp8_pack8<true>(x[i], encode);
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

absl::Status check_input(const Mat& m, int64_t tokens, int64_t width, const char* field) {
  if (m.rows != tokens || m.cols != width || !rows_aligned16(m, 2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantize_attention_operands_fp8: ", field, " must be bf16 [", tokens, ", ", width,
        "] with 16-byte aligned rows, got [", m.rows, ", ", m.cols, "] stride ", m.stride));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t flash_fp8_scale_count(int64_t heads, int64_t tokens) {
  return 3 * heads * flash_fp8_tiles(tokens);
}

FlashFp8Args flash_fp8_args(const FlashFp8Operands& operands, int64_t tokens, int64_t heads) {
  const int64_t width = heads * kFlashFp8HeadDim, tiles = flash_fp8_tiles(tokens);
  FlashFp8Args args;
  args.q = Mat{operands.q, tokens, width, width};
  args.k = Mat{operands.k, tokens, width, width};
  args.vt = operands.vt;
  args.heads = heads;
  args.scale_q = operands.scales;
  args.scale_k = operands.scales + heads * tiles;
  args.scale_v = operands.scales + 2 * heads * tiles;
  return args;
}

absl::Status quantize_attention_operands_fp8(const Mat& q, const Mat& k, const Mat& v,
                                             int64_t heads, const FlashFp8Operands& out,
                                             cudaStream_t stream) {
  const int64_t tokens = q.rows, width = heads * kFlashFp8HeadDim;
  if (heads <= 0 || heads > 65535 || tokens <= 0 || tokens > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        "quantize_attention_operands_fp8: heads or tokens out of range");
  }
  FLUX_RETURN_IF_ERROR(check_input(q, tokens, width, "q"));
  FLUX_RETURN_IF_ERROR(check_input(k, tokens, width, "k"));
  FLUX_RETURN_IF_ERROR(check_input(v, tokens, width, "v"));
  const void* buffers[] = {out.q, out.k, out.vt, out.scales};
  for (const void* p : buffers) {
    if (p == nullptr || !aligned16(p)) {
      return absl::InvalidArgumentError(
          "quantize_attention_operands_fp8: q, k, vt and scales must be 16-byte aligned buffers");
    }
  }
  auto matrix = [](const Mat& m) {
    return Bf16Matrix{static_cast<const __nv_bfloat16*>(m.data), m.stride};
  };
  const int64_t tiles = flash_fp8_tiles(tokens);
  const dim3 blocks(static_cast<unsigned>(tiles), static_cast<unsigned>(heads));
  quantize_blocks_kernel<<<dim3(blocks.x, blocks.y, 2), kThreads, 0, stream>>>(
      matrix(q), matrix(k), static_cast<int>(tokens), static_cast<int>(heads),
      static_cast<uint8_t*>(out.q), static_cast<uint8_t*>(out.k), out.scales);
  FLUX_RETURN_IF_LAUNCH_FAILED("quantize_attention_operands_fp8 (Q, K)");
  transpose_values_kernel<<<blocks, kThreads, 0, stream>>>(
      matrix(v), static_cast<int>(tokens), static_cast<uint8_t*>(out.vt),
      flash_fp8_padded_keys(tokens), out.scales + 2 * heads * tiles);
  FLUX_RETURN_IF_LAUNCH_FAILED("quantize_attention_operands_fp8 (V)");
  return absl::OkStatus();
}

}  // namespace flux2::cuda
