// Our FP8 flash attention for Hopper (flash_attention_fp8.h): a producer warpgroup streams K and
// Vᵀ tiles through TMA into a three-stage ring (segment 0's tiles, then segment 1's); two consumer
// warpgroups of 64 query rows each run Q·Kᵀ (wgmma, both operands in shared memory), the online
// softmax, and P·V (P from registers), taking turns on the tensor cores. Tested by
// tests/cuda/flash_attention_fp8_test.cc and flash_attention_fp8_keys_test.cc.
#include "kernels/cuda/flash_attention_fp8.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fp8_convert.cuh"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLUX2_FLASH_FP8_DEVICE 1
#endif

namespace flux2::cuda {
namespace {

constexpr int kBlockM = 128;  // query rows per CTA: two consumer warpgroups of 64
constexpr int kBlockN = static_cast<int>(kFlashFp8KeyBlock);  // keys per tile
constexpr int kStages = 3;
constexpr int kConsumers = 256;
constexpr int kThreads = kConsumers + 128;  // + the producer warpgroup (one thread loads)
constexpr int kTileBytes = 128 * 128;       // a [128 rows x 128 bytes] E4M3 tile, 128-byte swizzle
static_assert(kFlashFp8HeadDim == 128 && kBlockN == 128);

struct alignas(1024) SharedTiles {
  uint8_t q[kTileBytes];
  uint8_t k[kStages][kTileBytes];
  uint8_t v[kStages][kTileBytes];
  uint64_t q_full;
  uint64_t k_full[kStages], k_empty[kStages];
  uint64_t v_full[kStages], v_empty[kStages];
};
constexpr int kSharedBytes = sizeof(SharedTiles) + 1024;  // + alignment slack

#ifdef FLUX2_FLASH_FP8_DEVICE

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarriers and TMA ----
__device__ __forceinline__ void barrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count));
}
__device__ __forceinline__ void barrier_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
}
// A [128 x 128-byte] box at (c0 bytes, c1 rows) of a 2-D tensor map into `dst`.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, int c0,
                                         int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// ---- wgmma ----
// Descriptor of a K-major operand tile in shared memory with the 128-byte swizzle: rows of 128
// bytes, 8-row groups 1024 bytes apart. Adding 2 advances the start by 32 bytes (one k32 step).
__device__ __forceinline__ uint64_t tile_descriptor(const void* tile) {
  const uint64_t start = (shared_address(tile) & 0x3FFFF) >> 4;
  return start | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving reads of the accumulators above the wait.
__device__ __forceinline__ void fence_registers(float (&acc)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}

#define FLUX2_ACC8(a, i)                                                                      \
  "+f"(a[i]), "+f"(a[i + 1]), "+f"(a[i + 2]), "+f"(a[i + 3]), "+f"(a[i + 4]), "+f"(a[i + 5]), \
      "+f"(a[i + 6]), "+f"(a[i + 7])
#define FLUX2_ACC64(a)                                                                         \
  FLUX2_ACC8(a, 0), FLUX2_ACC8(a, 8), FLUX2_ACC8(a, 16), FLUX2_ACC8(a, 24), FLUX2_ACC8(a, 32), \
      FLUX2_ACC8(a, 40), FLUX2_ACC8(a, 48), FLUX2_ACC8(a, 56)
#define FLUX2_ACC_LIST                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"

// acc (+)= A · Bᵀ for a 64 x 128 x 32 step, A and B in shared memory.
__device__ __forceinline__ void mma_shared(float (&acc)[64], uint64_t a, uint64_t b,
                                           int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " FLUX2_ACC_LIST
      ", %64, %65, p, 1, 1;\n}\n"
      : FLUX2_ACC64(acc)
      : "l"(a), "l"(b), "r"(accumulate));
}
// acc += A · Bᵀ for a 64 x 128 x 32 step, A from registers (4 x 4 E4M3 per thread).
__device__ __forceinline__ void mma_registers(float (&acc)[64], const uint32_t (&a)[4],
                                              uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " FLUX2_ACC_LIST
      ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
      : FLUX2_ACC64(acc)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// Four fp32 values to E4M3 (RNE, saturating), the first in the lowest byte.
__device__ __forceinline__ uint32_t pack_e4m3(float x0, float x1, float x2, float x3) {
  return DeviceCvt<true>::e4m3x2(x0, x1) | (uint32_t{DeviceCvt<true>::e4m3x2(x2, x3)} << 16);
}
// log2 of a (normal) power of two, exactly: its exponent.
__device__ __forceinline__ float power_of_two_log2(float x) {
  return static_cast<float>(static_cast<int>((__float_as_uint(x) >> 23) & 0xffu) - 127);
}
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void fence_registers(uint32_t (&regs)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(regs[i][j])::"memory");
  }
}
__device__ __forceinline__ void named_barrier_sync(int id) {
  asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id) {
  asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory");
}

// Online softmax over one 64 x 128 score tile (rows r = 0: registers 4c, 4c+1; r = 1: 4c+2,
// 4c+3). Keys at or past `valid` are masked. The probabilities are scaled by 256 (the exponent
// offset 8) to use E4M3's range; the row sums carry the same factor. Leaves the exponentials in
// `acc` for pack_probabilities, and the factor by which the output accumulated so far must be
// scaled in `correction`. Maxima and sums reduce in trees (fixed order), not chains: the
// special-function unit's latency, not its throughput, bounds this part.
struct RowStats {
  float max[2] = {-INFINITY, -INFINITY};
  float sum[2] = {0.0f, 0.0f};
};
// V's per-block scale 2^v_log2 rides in the exponent: the stored probabilities are
// 256 · 2^(logit + v_log2 - max), max taken over logit + v_log2, so P·V8 needs no rescaling per
// tile; the row sums take them times 2^-v_log2 (v_inverse), exact for a power of two.
__device__ __forceinline__ void softmax_tile(float (&acc)[64], int valid, int t, float score_scale,
                                             float v_log2, float v_inverse, RowStats& stats,
                                             float (&correction)[2]) {
  if (valid < 128) {
#pragma unroll
    for (int c = 0; c < 16; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (8 * c + 2 * t + e >= valid) acc[4 * c + e] = acc[4 * c + 2 + e] = -INFINITY;
      }
    }
  }
  float offset[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float m[16];
#pragma unroll
    for (int c = 0; c < 16; ++c) m[c] = fmaxf(acc[4 * c + 2 * r], acc[4 * c + 2 * r + 1]);
#pragma unroll
    for (int c = 0; c < 8; ++c) m[c] = fmaxf(m[c], m[c + 8]);
#pragma unroll
    for (int c = 0; c < 4; ++c) m[c] = fmaxf(m[c], m[c + 4]);
    m[0] = fmaxf(fmaxf(m[0], m[2]), fmaxf(m[1], m[3]));
    float tile_max = fmaxf(m[0], __shfl_xor_sync(0xffffffff, m[0], 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 2));
    const float new_max = fmaxf(stats.max[r], fmaf(tile_max, score_scale, v_log2));
    correction[r] = fast_exp2(stats.max[r] - new_max);
    stats.max[r] = new_max;
    offset[r] = new_max - 8.0f - v_log2;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float partial[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < 16; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 4 * c + 2 * r + e;
        acc[i] = fast_exp2(fmaf(acc[i], score_scale, -offset[r]));
        partial[(2 * c + e) % 4] += acc[i];
      }
    }
    const float tile_sum = (partial[0] + partial[1]) + (partial[2] + partial[3]);
    stats.sum[r] = stats.sum[r] * correction[r] + tile_sum * v_inverse;
  }
}
// The exponentials of softmax_tile as the A operand of four k32 steps (E4M3).
__device__ __forceinline__ void pack_probabilities(const float (&acc)[64], uint32_t (&p)[4][4]) {
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) {
    const float* a = acc + 16 * kc;
    p[kc][0] = pack_e4m3(a[0], a[1], a[4], a[5]);
    p[kc][1] = pack_e4m3(a[2], a[3], a[6], a[7]);
    p[kc][2] = pack_e4m3(a[8], a[9], a[12], a[13]);
    p[kc][3] = pack_e4m3(a[10], a[11], a[14], a[15]);
  }
}
__device__ __forceinline__ void rescale(float (&o)[64], const float (&correction)[2]) {
#pragma unroll
  for (int c = 0; c < 16; ++c) {
    o[4 * c] *= correction[0];
    o[4 * c + 1] *= correction[0];
    o[4 * c + 2] *= correction[1];
    o[4 * c + 3] *= correction[1];
  }
}
__device__ __forceinline__ void issue_scores(float (&acc)[64], uint64_t q_desc,
                                             const uint8_t* k_tile) {
  const uint64_t k_desc = tile_descriptor(k_tile);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) mma_shared(acc, q_desc + 2 * kk, k_desc + 2 * kk, kk);
  wgmma_commit();
}
__device__ __forceinline__ void issue_values(float (&o)[64], const uint32_t (&p)[4][4],
                                             const uint8_t* v_tile) {
  const uint64_t v_desc = tile_descriptor(v_tile);
  wgmma_fence();
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) mma_registers(o, p[kc], v_desc + 2 * kc);
  wgmma_commit();
}

#endif  // FLUX2_FLASH_FP8_DEVICE

// Accumulator layout (64 x 128 per warpgroup): thread (warp w, lane l) holds rows
// 16w + l/4 (registers 4j, 4j+1) and 16w + l/4 + 8 (4j+2, 4j+3), columns 8j + 2(l%4) + {0, 1}.
// The A operand of a k32 step holds, per row, slots 4(l%4)..+3 and 16 + 4(l%4)..+3: packing the
// accumulator columns {2t, 2t+1, 8+2t, 9+2t} and {16+2t, .., 25+2t} into them is the key
// permutation of flash_fp8_key_at, which V's transposed layout carries.
// Keys: `keys0` of segment 0 (k_map0, vt_map0, scale_k0, scale_v0), then `keys1` of segment 1
// (keys1 0: none, its maps copies of segment 0's), walked tile by tile (fp8_attention_key_tile).
__global__ void __launch_bounds__(kThreads, 1) flash_attention_fp8_kernel(
    const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map0,
    const __grid_constant__ CUtensorMap vt_map0, const __grid_constant__ CUtensorMap k_map1,
    const __grid_constant__ CUtensorMap vt_map1, __nv_bfloat16* out, int64_t out_stride, int s_q,
    int keys0, int keys1, float scale_log2, const float* scale_q, const float* scale_k0,
    const float* scale_v0, const float* scale_k1, const float* scale_v1) {
#ifdef FLUX2_FLASH_FP8_DEVICE  // elsewhere never launched: flash_attention_fp8_available()
  extern __shared__ uint8_t shared_raw[];
  auto& s = *reinterpret_cast<SharedTiles*>((reinterpret_cast<uintptr_t>(shared_raw) + 1023) &
                                            ~uintptr_t{1023});
  const int head = blockIdx.y, m_block = blockIdx.x;
  const int tiles0 = fp8_attention_tiles(keys0), tiles1 = fp8_attention_tiles(keys1);
  const int tiles = tiles0 + tiles1;
  if (threadIdx.x == 0) {
    barrier_init(&s.q_full, 1);
    for (int i = 0; i < kStages; ++i) {
      barrier_init(&s.k_full[i], 1);
      barrier_init(&s.v_full[i], 1);
      barrier_init(&s.k_empty[i], kConsumers / 32);
      barrier_init(&s.v_empty[i], kConsumers / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (threadIdx.x >= kConsumers) {  // producer warpgroup: gives its registers to the consumers
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == kConsumers) {
      barrier_expect_bytes(&s.q_full, kTileBytes);
      tma_load(s.q, &q_map, &s.q_full, head * 128, m_block * kBlockM);
      for (int j = 0; j < tiles; ++j) {
        const int stage = j % kStages;
        const uint32_t parity = ((j / kStages) & 1) ^ 1;
        const Fp8KeyTile tile = fp8_attention_key_tile(keys0, keys1, j);
        const bool first = tile.segment == 0;
        barrier_wait(&s.k_empty[stage], parity);
        barrier_expect_bytes(&s.k_full[stage], kTileBytes);
        tma_load(s.k[stage], first ? &k_map0 : &k_map1, &s.k_full[stage], head * 128,
                 tile.tile * kBlockN);
        barrier_wait(&s.v_empty[stage], parity);
        barrier_expect_bytes(&s.v_full[stage], kTileBytes);
        tma_load(s.v[stage], first ? &vt_map0 : &vt_map1, &s.v_full[stage], tile.tile * kBlockN,
                 head * 128);
      }
    }
    return;
  }

  // Consumers. The two warpgroups take turns issuing their tensor-core work (named barriers 1 and
  // 2), so that one's softmax overlaps the other's multiplies; within a warpgroup, the softmax of
  // tile j overlaps the P·V of tile j - 1.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int group = threadIdx.x / 128, lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  const int t = lane % 4;
  const int my_turn = 1 + group, other_turn = 2 - group;
  // log2-domain logits per stored unit: Q's scale for this block of rows times K's for each tile.
  const float q_scale_log2 = scale_log2 * scale_q[head * gridDim.x + m_block];
  const float *k_scales0 = scale_k0 + head * tiles0, *k_scales1 = scale_k1 + head * tiles1;
  const float *v_scales0 = scale_v0 + head * tiles0, *v_scales1 = scale_v1 + head * tiles1;
  // Tile j's keys that exist, and its K and V scales (V's powers of two).
  auto valid_keys = [&](int j) { return fp8_attention_key_tile(keys0, keys1, j).valid; };
  auto k_scale = [&](int j) {
    const Fp8KeyTile tile = fp8_attention_key_tile(keys0, keys1, j);
    return (tile.segment == 0 ? k_scales0 : k_scales1)[tile.tile];
  };
  auto v_scale_of = [&](int j) {
    const Fp8KeyTile tile = fp8_attention_key_tile(keys0, keys1, j);
    return (tile.segment == 0 ? v_scales0 : v_scales1)[tile.tile];
  };
  const uint64_t q_desc = tile_descriptor(s.q + group * 64 * 128);
  float o[64], acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = acc[i] = 0.0f;
  uint32_t p[4][4];
  RowStats stats;
  float correction[2];
  auto release = [&](uint64_t* bar) {
    __syncwarp();
    if (lane == 0) barrier_arrive(bar);
  };

  if (group == 1) named_barrier_arrive(1);  // warpgroup 0 goes first
  barrier_wait(&s.q_full, 0);
  named_barrier_sync(my_turn);
  barrier_wait(&s.k_full[0], 0);
  issue_scores(acc, q_desc, s.k[0]);
  named_barrier_arrive(other_turn);
  wgmma_wait<0>();
  fence_registers(acc);
  release(&s.k_empty[0]);
  const float first_v_scale = v_scale_of(0);
  softmax_tile(acc, valid_keys(0), t, q_scale_log2 * k_scale(0), power_of_two_log2(first_v_scale),
               __frcp_rn(first_v_scale), stats, correction);
  pack_probabilities(acc, p);
  float next_k_scale = tiles > 1 ? k_scale(1) : 0.0f,
        next_v_scale = tiles > 1 ? v_scale_of(1) : 1.0f;
  for (int j = 1; j < tiles; ++j) {
    const int k_stage = j % kStages, v_stage = (j - 1) % kStages;
    const float score_scale = q_scale_log2 * next_k_scale, v_scale = next_v_scale;
    if (j + 1 < tiles) {  // in flight during this tile
      next_k_scale = k_scale(j + 1);
      next_v_scale = v_scale_of(j + 1);
    }
    named_barrier_sync(my_turn);
    barrier_wait(&s.k_full[k_stage], (j / kStages) & 1);
    issue_scores(acc, q_desc, s.k[k_stage]);
    barrier_wait(&s.v_full[v_stage], ((j - 1) / kStages) & 1);
    issue_values(o, p, s.v[v_stage]);
    named_barrier_arrive(other_turn);
    wgmma_wait<1>();
    fence_registers(acc);
    release(&s.k_empty[k_stage]);
    softmax_tile(acc, valid_keys(j), t, score_scale, power_of_two_log2(v_scale), __frcp_rn(v_scale),
                 stats, correction);
    wgmma_wait<0>();
    fence_registers(o);
    fence_registers(p);
    release(&s.v_empty[v_stage]);
    // Once the row maxima settle, most tiles leave them unchanged (correction 1: a no-op).
    if (__any_sync(0xffffffff, correction[0] != 1.0f || correction[1] != 1.0f))
      rescale(o, correction);
    pack_probabilities(acc, p);
  }
  const int last = (tiles - 1) % kStages;
  named_barrier_sync(my_turn);
  barrier_wait(&s.v_full[last], ((tiles - 1) / kStages) & 1);
  issue_values(o, p, s.v[last]);
  if (group == 0) named_barrier_arrive(other_turn);  // warpgroup 1's turns end here
  wgmma_wait<0>();
  fence_registers(o);
  release(&s.v_empty[last]);

  const int row = m_block * kBlockM + group * 64 + warp * 16 + lane / 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = stats.sum[r];
    sum += __shfl_xor_sync(0xffffffff, sum, 1);
    sum += __shfl_xor_sync(0xffffffff, sum, 2);
    const float factor = 1.0f / sum;
    __nv_bfloat162 values[16];
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      values[c] = __floats2bfloat162_rn(o[4 * c + 2 * r] * factor, o[4 * c + 2 * r + 1] * factor);
    }
    if (row + 8 * r >= s_q) continue;
    __nv_bfloat16* dst = out + (row + 8 * r) * out_stride + head * 128 + 2 * t;
#pragma unroll
    for (int c = 0; c < 16; ++c) *reinterpret_cast<__nv_bfloat162*>(dst + 8 * c) = values[c];
  }
#endif  // FLUX2_FLASH_FP8_DEVICE
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A 2-D E4M3 tensor map of `rows` x `cols` bytes (row stride `stride` bytes), 128 x 128 boxes,
// 128-byte swizzle; reads past the edges give zeros.
absl::Status make_tile_map(CUtensorMap* map, const void* base, int64_t rows, int64_t cols,
                           int64_t stride, const char* field) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr)
    return absl::InternalError("flash_attention_fp8: no cuTensorMapEncodeTiled");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride)};
  const cuuint32_t box[2] = {128, 128};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    return absl::InvalidArgumentError(absl::StrCat("flash_attention_fp8: ", field,
                                                   " cannot be described to TMA (CUresult ",
                                                   static_cast<int>(result), ")"));
  }
  return absl::OkStatus();
}

absl::Status check_operand(const Mat& m, int64_t width, const char* field) {
  if (m.cols != width) {
    return absl::InvalidArgumentError(absl::StrCat("flash_attention_fp8: ", field, " has ", m.cols,
                                                   " columns, expected ", width));
  }
  if (reinterpret_cast<uintptr_t>(m.data) % 16 != 0 || m.stride % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("flash_attention_fp8: ", field, " rows must start 16-byte aligned"));
  }
  return absl::OkStatus();
}

// Segment `index`'s keys, Vᵀ and scales checked (naming the field), and its two tensor maps.
absl::Status check_segment(const FlashFp8KeySegment& segment, int64_t width, int index,
                           CUtensorMap* k_map, CUtensorMap* vt_map) {
  const std::string k = absl::StrCat("keys[", index, "].k"),
                    vt = absl::StrCat("keys[", index, "].vt");
  FLUX_RETURN_IF_ERROR(check_operand(segment.k, width, k.c_str()));
  if (reinterpret_cast<uintptr_t>(segment.vt) % 16 != 0 || segment.vt == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("flash_attention_fp8: ", vt, " must be a 16-byte aligned buffer"));
  }
  if (segment.scale_k == nullptr || segment.scale_v == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("flash_attention_fp8: keys[", index, "].scale_k and scale_v are required"));
  }
  const int64_t padded = flash_fp8_padded_keys(segment.k.rows);
  FLUX_RETURN_IF_ERROR(
      make_tile_map(k_map, segment.k.data, segment.k.rows, width, segment.k.stride, k.c_str()));
  return make_tile_map(vt_map, segment.vt, width, padded, padded, vt.c_str());
}

}  // namespace

bool flash_attention_fp8_available() {
  // Per thread: the current device's answer (a --gpus N rank's thread launches on its own device).
  static thread_local const bool available = [] {
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
      return false;
    }
    cudaFuncAttributes attributes{};
    // A kernel compiled for this device at all (the sm_90a image carries the real body).
    if (major != 9 || minor != 0 ||
        cudaFuncGetAttributes(&attributes, flash_attention_fp8_kernel) != cudaSuccess) {
      return false;
    }
    return attributes.ptxVersion >= 90 && attributes.binaryVersion == 90 &&
           tensor_map_encoder() != nullptr;
  }();
  return available;
}

bool flash_attention_fp8_supports(const AttentionParams& params, const Mat& q, const Mat& k,
                                  const Mat& v) {
  return !params.causal && params.num_valid_keys < 0 && params.head_dim == kFlashFp8HeadDim &&
         params.num_kv_heads == params.num_heads && k.rows == v.rows && k.rows > 0 &&
         q.rows <= (int64_t{1} << 30) && k.rows <= (int64_t{1} << 30) && rows_aligned16(q, 2) &&
         rows_aligned16(k, 2) && rows_aligned16(v, 2);
}

absl::Status flash_attention_fp8(const FlashFp8Args& args, cudaStream_t stream) {
  if (!flash_attention_fp8_available()) {
    return absl::UnimplementedError("flash_attention_fp8: needs an sm_90a build on a 9.0 device");
  }
  const int64_t width = args.heads * kFlashFp8HeadDim, s_q = args.q.rows;
  const int64_t keys0 = args.keys[0].k.rows, keys1 = args.keys[1].k.rows;
  constexpr int64_t kMaxRows = int64_t{1} << 30;
  if (args.heads <= 0 || s_q <= 0 || keys0 <= 0 || keys1 < 0 || s_q > kMaxRows ||
      keys0 + keys1 > kMaxRows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flash_attention_fp8: heads, q rows and segment 0's keys must be positive, at most 2^30 "
        "queries and keys; got ",
        args.heads, " heads, ", s_q, " queries, ", keys0, " + ", keys1, " keys"));
  }
  FLUX_RETURN_IF_ERROR(check_operand(args.q, width, "q"));
  if (args.out.cols != width || args.out.rows != s_q ||
      reinterpret_cast<uintptr_t>(args.out.data) % 4 != 0 || args.out.stride % 2 != 0) {
    return absl::InvalidArgumentError(
        "flash_attention_fp8: out must be bf16 [S_q, H·128], rows 4-byte aligned");
  }
  if (args.scale_q == nullptr) {
    return absl::InvalidArgumentError("flash_attention_fp8: scale_q is required");
  }
  CUtensorMap q_map, k_maps[2], vt_maps[2];
  FLUX_RETURN_IF_ERROR(make_tile_map(&q_map, args.q.data, s_q, width, args.q.stride, "q"));
  for (int i = 0; i < 2; ++i) {
    if (i == 1 && keys1 == 0) {  // no second segment: never read, its maps segment 0's
      k_maps[1] = k_maps[0];
      vt_maps[1] = vt_maps[0];
      continue;
    }
    FLUX_RETURN_IF_ERROR(check_segment(args.keys[i], width, i, &k_maps[i], &vt_maps[i]));
  }
  // At every launch, not once per process: the opt-in belongs to the current device's context,
  // and a multi-GPU engine launches on several devices, one thread each (parallel_engine.h).
  const cudaError_t opted_in = cudaFuncSetAttribute(
      flash_attention_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
  if (opted_in != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("flash_attention_fp8: ", kSharedBytes,
                     " bytes of shared memory: ", cudaGetErrorString(opted_in)));
  }
  const float scale_log2 = args.softmax_scale * static_cast<float>(M_LOG2E);
  const dim3 grid(static_cast<unsigned>((s_q + kBlockM - 1) / kBlockM),
                  static_cast<unsigned>(args.heads));
  const FlashFp8KeySegment& second = keys1 > 0 ? args.keys[1] : args.keys[0];
  flash_attention_fp8_kernel<<<grid, kThreads, kSharedBytes, stream>>>(
      q_map, k_maps[0], vt_maps[0], k_maps[1], vt_maps[1],
      static_cast<__nv_bfloat16*>(args.out.data), args.out.stride, static_cast<int>(s_q),
      static_cast<int>(keys0), static_cast<int>(keys1), scale_log2, args.scale_q,
      args.keys[0].scale_k, args.keys[0].scale_v, second.scale_k, second.scale_v);
  FLUX_RETURN_IF_LAUNCH_FAILED("flash_attention_fp8");
  return absl::OkStatus();
}

}  // namespace flux2::cuda
