// Image and lookup kernels; see image_ops.h.
#include "absl/strings/str_cat.h"
#include "kernels/base/postprocess.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/group_norm_one_pass.h"
#include "kernels/cuda/image_ops.h"
#include "kernels/cuda/launch.cuh"

namespace flux2::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;
// The scalar statistics (any layout): blocks per group, partial sums per (group, slice) then a
// fixed-order reduction keep GroupNorm deterministic without atomics.
constexpr int kSlices = 64;

// partial[g * kSlices + s] = (sum, sum of squares) over slice s of group g.
__global__ void group_partials_kernel(Mat x, int64_t per_group, float2* partial) {
  __shared__ float scratch[32];
  const int g = blockIdx.y, s = blockIdx.x;
  const int64_t count = x.rows * per_group;
  const int64_t begin = count * s / kSlices, end = count * (s + 1) / kSlices;
  float sum = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const int64_t p = i / per_group, c = g * per_group + i % per_group;
    sum = __fadd_rn(sum, to_f32(static_cast<const bf16*>(x.data)[p * x.stride + c]));
  }
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) partial[g * kSlices + s].x = sum;
}

__global__ void group_variance_kernel(Mat x, int64_t per_group, const float* mean,
                                      float2* partial) {
  __shared__ float scratch[32];
  const int g = blockIdx.y, s = blockIdx.x;
  const int64_t count = x.rows * per_group;
  const int64_t begin = count * s / kSlices, end = count * (s + 1) / kSlices;
  float squares = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const int64_t p = i / per_group, c = g * per_group + i % per_group;
    const float d = __fsub_rn(to_f32(static_cast<const bf16*>(x.data)[p * x.stride + c]), mean[g]);
    squares = __fadd_rn(squares, __fmul_rn(d, d));
  }
  squares = block_sum(squares, scratch);
  if (threadIdx.x == 0) partial[g * kSlices + s].y = squares;
}

// One thread per group sums its slices in order; `second` selects the variance pass.
__global__ void group_reduce_kernel(const float2* partial, int groups, float count, float eps,
                                    bool second, float* mean, float* rstd) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  float total = 0.0f;
  for (int s = 0; s < kSlices; ++s)
    total = __fadd_rn(total, second ? partial[g * kSlices + s].y : partial[g * kSlices + s].x);
  if (!second) {
    mean[g] = __fdiv_rn(total, count);
  } else {
    rstd[g] = rsqrtf(__fadd_rn(__fdiv_rn(total, count), eps));
  }
}

// ---- vectorized statistics (C % 8 == 0, C <= 8 x kStatThreads, 16-byte aligned rows) ----
// Each of kStatBlocks blocks takes a contiguous range of pixels; thread t reads the 8 channels
// [8 (t % P), 8 (t % P) + 8) (P = C / 8 packs per pixel) of every (256 / P)-th pixel with one
// 16-byte load, so a block reads whole pixels, coalesced. Per channel, each thread sums its pixels
// in order; the block then sums the threads' channel sums in thread-row order and the channels
// of each group in channel order: a fixed tree, independent of the GPU (kStatBlocks is fixed).
constexpr int kStatBlocks = 512;
constexpr int kStatThreads = 256;

bool group_stats_vectorized(const Mat& x) {
  return x.cols % 8 == 0 && x.cols / 8 <= kStatThreads && rows_aligned16(x, 2);
}

// partial[b * groups + g]: block b's sum over group g of x (kSecond false) or of (x - mean[g])^2.
template <bool kSecond>
__global__ void __launch_bounds__(kStatThreads)
    group_stats_vec_kernel(Mat x, int per_group, int groups, const float* mean, float* partial) {
  __shared__ float channel_sums[kStatThreads * 8];  // [thread row][channel]
  const int cols = static_cast<int>(x.cols), packs = cols / 8, rows_per_pass = kStatThreads / packs;
  const int pack = threadIdx.x % packs, thread_row = threadIdx.x / packs;
  const int64_t begin = x.rows * blockIdx.x / kStatBlocks,
                end = x.rows * (blockIdx.x + 1) / kStatBlocks;
  if (thread_row < rows_per_pass) {
    float centre[8], acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      centre[i] = kSecond ? mean[(pack * 8 + i) / per_group] : 0.0f;
      acc[i] = 0.0f;
    }
    const bf16* column = static_cast<const bf16*>(x.data) + pack * 8;
#pragma unroll 4
    for (int64_t p = begin + thread_row; p < end; p += rows_per_pass) {
      float v[8];
      load8(column + p * x.stride, v);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (kSecond) {
          const float d = __fsub_rn(v[i], centre[i]);
          acc[i] = __fadd_rn(acc[i], __fmul_rn(d, d));
        } else {
          acc[i] = __fadd_rn(acc[i], v[i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) channel_sums[thread_row * cols + pack * 8 + i] = acc[i];
  }
  __syncthreads();
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    float total = 0.0f;
    for (int c = g * per_group; c < (g + 1) * per_group; ++c) {
      float channel = 0.0f;
      for (int r = 0; r < rows_per_pass; ++r)
        channel = __fadd_rn(channel, channel_sums[r * cols + c]);
      total = __fadd_rn(total, channel);
    }
    partial[blockIdx.x * groups + g] = total;
  }
}

// One warp per group: lane l sums the blocks l, l + 32, ... in order, then the fixed butterfly.
__global__ void group_stats_finish_kernel(const float* partial, int groups, float count, float eps,
                                          bool second, float* mean, float* rstd) {
  const int g = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (g >= groups) return;
  float total = 0.0f;
  for (int b = lane; b < kStatBlocks; b += 32) total = __fadd_rn(total, partial[b * groups + g]);
  total = warp_sum(total);
  if (lane != 0) return;
  if (!second) {
    mean[g] = __fdiv_rn(total, count);
  } else {
    rstd[g] = rsqrtf(__fadd_rn(__fdiv_rn(total, count), eps));
  }
}

// Per-channel copies of the group statistics, so the normalising pass reads 8 channels' worth
// with two 16-byte loads each instead of dividing every channel index by the group size.
__global__ void group_channel_stats_kernel(const float* mean, const float* rstd, int channels,
                                           int per_group, float* channel_mean,
                                           float* channel_rstd) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  channel_mean[c] = mean[c / per_group];
  channel_rstd[c] = rstd[c / per_group];
}

}  // namespace

absl::Status group_norm_statistics_bf16(const Mat& x, int64_t groups, float eps, float* mean,
                                        float* rstd, cudaStream_t stream) {
  if (groups <= 0 || x.cols <= 0 || x.cols % groups != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("group_norm: ", x.cols, " channels, ", groups, " groups"));
  }
  if (x.rows == 0) return absl::OkStatus();
  const int64_t per_group = x.cols / groups;
  const float count = static_cast<float>(x.rows * per_group);
  const bool vectorized = group_stats_vectorized(x);
  void* partial = nullptr;  // per-block partial sums (stream-ordered allocation)
  const size_t partial_bytes =
      vectorized ? sizeof(float) * groups * kStatBlocks : sizeof(float2) * groups * kSlices;
  FLUX_RETURN_IF_ERROR(
      cuda_status(cudaMallocAsync(&partial, partial_bytes, stream), "group_norm scratch"));
  if (vectorized) {
    const int finish_blocks = static_cast<int>((groups + 7) / 8);  // 8 warps per block
    for (bool second : {false, true}) {
      const auto kernel = second ? group_stats_vec_kernel<true> : group_stats_vec_kernel<false>;
      kernel<<<kStatBlocks, kStatThreads, 0, stream>>>(x, static_cast<int>(per_group),
                                                       static_cast<int>(groups), mean,
                                                       static_cast<float*>(partial));
      group_stats_finish_kernel<<<finish_blocks, 256, 0, stream>>>(
          static_cast<float*>(partial), static_cast<int>(groups), count, eps, second, mean, rstd);
    }
  } else {
    auto* pairs = static_cast<float2*>(partial);
    const dim3 grid(kSlices, static_cast<unsigned>(groups));
    const int reduce_blocks = static_cast<int>((groups + 127) / 128);
    group_partials_kernel<<<grid, kThreads, 0, stream>>>(x, per_group, pairs);
    group_reduce_kernel<<<reduce_blocks, 128, 0, stream>>>(pairs, static_cast<int>(groups), count,
                                                           eps, false, mean, rstd);
    group_variance_kernel<<<grid, kThreads, 0, stream>>>(x, per_group, mean, pairs);
    group_reduce_kernel<<<reduce_blocks, 128, 0, stream>>>(pairs, static_cast<int>(groups), count,
                                                           eps, true, mean, rstd);
  }
  const cudaError_t launched = cudaGetLastError();
  FLUX_RETURN_IF_ERROR(cuda_status(cudaFreeAsync(partial, stream), "group_norm scratch free"));
  return cuda_status(launched, "group_norm statistics launch");
}

absl::Status group_norm_bf16(const Mat& x, int64_t groups, const void* gamma, const void* beta,
                             float eps, bool silu, SiluMath silu_math, bool one_pass,
                             const Mat& out, cudaStream_t stream) {
  if (groups <= 0 || x.cols % groups != 0 || out.rows != x.rows || out.cols != x.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("group_norm: ", x.cols, " channels, ", groups, " groups"));
  }
  if (x.rows == 0 || x.cols == 0) return absl::OkStatus();
  const int64_t per_group = x.cols / groups;
  // Scratch: mean [G] | rstd [G] | channel mean [C] | channel rstd [C], 16-byte aligned.
  auto aligned = [](size_t bytes) { return (bytes + 15) / 16 * 16; };
  const size_t group_bytes = aligned(sizeof(float) * groups),
               channel_bytes = aligned(sizeof(float) * x.cols);
  void* scratch = nullptr;
  FLUX_RETURN_IF_ERROR(
      cuda_status(cudaMallocAsync(&scratch, 2 * group_bytes + 2 * channel_bytes, stream),
                  "group_norm scratch"));
  char* base = static_cast<char*>(scratch);
  auto* mean = reinterpret_cast<float*>(base);
  auto* rstd = reinterpret_cast<float*>(base + group_bytes);
  auto* channel_mean = reinterpret_cast<float*>(base + 2 * group_bytes);
  auto* channel_rstd = reinterpret_cast<float*>(base + 2 * group_bytes + channel_bytes);
  absl::Status status =
      one_pass ? group_norm_statistics_one_pass_bf16(x, groups, eps, mean, rstd, stream)
               : group_norm_statistics_bf16(x, groups, eps, mean, rstd, stream);
  if (!status.ok()) {
    cudaFreeAsync(scratch, stream);
    return status;
  }
  const bf16* g = static_cast<const bf16*>(gamma);
  const bf16* b = static_cast<const bf16*>(beta);
  // bf16((x - mean) · rstd · gamma + beta), then SiLU: one rounding sequence for both paths.
  auto normalise = [=] __device__(float v, float m, float r, float gm, float bt) {
    const float y = round_bf16(__fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(v, m), r), gm), bt));
    if (!silu) return y;
    return silu_math == SiluMath::kExact ? silu_value<SiluMath::kExact>(y)
                                         : silu_value<SiluMath::kFast>(y);
  };
  const bool vectorized = x.cols % 8 == 0 && rows_aligned16(x, 2) && rows_aligned16(out, 2) &&
                          reinterpret_cast<uintptr_t>(gamma) % 16 == 0 &&
                          reinterpret_cast<uintptr_t>(beta) % 16 == 0;
  if (vectorized) {
    group_channel_stats_kernel<<<static_cast<unsigned>((x.cols + 255) / 256), 256, 0, stream>>>(
        mean, rstd, static_cast<int>(x.cols), static_cast<int>(per_group), channel_mean,
        channel_rstd);
  }
  launch_rows(
      x.rows, x.cols, vectorized, stream,
      [=] __device__(int64_t r, int64_t c) {
        float v[8], gm[8], bt[8];
        load8(static_cast<const bf16*>(x.data) + r * x.stride + c, v);
        load8(g + c, gm);
        load8(b + c, bt);
        const float4 m0 = *reinterpret_cast<const float4*>(channel_mean + c);
        const float4 m1 = *reinterpret_cast<const float4*>(channel_mean + c + 4);
        const float4 r0 = *reinterpret_cast<const float4*>(channel_rstd + c);
        const float4 r1 = *reinterpret_cast<const float4*>(channel_rstd + c + 4);
        const float m[8] = {m0.x, m0.y, m0.z, m0.w, m1.x, m1.y, m1.z, m1.w};
        const float rs[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = normalise(v[i], m[i], rs[i], gm[i], bt[i]);
        store8(static_cast<bf16*>(out.data) + r * out.stride + c, v);
      },
      [=] __device__(int64_t r, int64_t c) {
        const float v = to_f32(static_cast<const bf16*>(x.data)[r * x.stride + c]);
        const int64_t grp = c / per_group;
        static_cast<bf16*>(out.data)[r * out.stride + c] =
            to_bf16(normalise(v, mean[grp], rstd[grp], to_f32(g[c]), to_f32(b[c])));
      });
  FLUX_RETURN_IF_LAUNCH_FAILED("group_norm");
  return cuda_status(cudaFreeAsync(scratch, stream), "group_norm scratch free");
}

absl::Status upsample_nearest_2x_bf16(const void* x, int64_t h, int64_t w, int64_t c, void* out,
                                      cudaStream_t stream) {
  const bf16* in = static_cast<const bf16*>(x);
  bf16* o = static_cast<bf16*>(out);
  // Source pixel of output pixel `pixel` (row_div: 32-bit divisions where they fit).
  auto source = [=] __device__(int64_t pixel) {
    const int64_t oy = row_div(pixel, 2 * w), ox = pixel - oy * 2 * w;
    return (oy / 2) * w + ox / 2;
  };
  const bool vectorized = c % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                          reinterpret_cast<uintptr_t>(out) % 16 == 0;
  launch_rows(
      4 * h * w, c, vectorized, stream,
      [=] __device__(int64_t pixel, int64_t ch) {
        *reinterpret_cast<Bf16x8*>(o + pixel * c + ch) =
            *reinterpret_cast<const Bf16x8*>(in + source(pixel) * c + ch);
      },
      [=] __device__(int64_t pixel, int64_t ch) {
        o[pixel * c + ch] = in[source(pixel) * c + ch];
      });
  FLUX_RETURN_IF_LAUNCH_FAILED("upsample_nearest_2x");
  return absl::OkStatus();
}

absl::Status latent_unpack_bf16(const Mat& tokens, const void* mean, const void* var, float eps,
                                int64_t h, int64_t w, int64_t c, void* out, cudaStream_t stream) {
  if (tokens.rows != h * w || tokens.cols != 4 * c) {
    return absl::InvalidArgumentError("latent_unpack: tokens do not match the grid");
  }
  const bf16* m = static_cast<const bf16*>(mean);
  const bf16* s = static_cast<const bf16*>(var);
  bf16* o = static_cast<bf16*>(out);
  launch_rows(
      h * w, 4 * c, false, stream, [=] __device__(int64_t, int64_t) {},
      [=] __device__(int64_t token, int64_t ch) {
        const float std = round_bf16(sqrtf(round_bf16(__fadd_rn(to_f32(s[ch]), eps))));
        const float z = to_f32(static_cast<const bf16*>(tokens.data)[token * tokens.stride + ch]);
        const float value = __fadd_rn(round_bf16(__fmul_rn(z, std)), to_f32(m[ch]));
        const int64_t row = token / w, col = token % w;
        const int64_t latent_c = ch / 4, dy = (ch / 2) % 2, dx = ch % 2;
        o[((2 * row + dy) * 2 * w + (2 * col + dx)) * c + latent_c] = to_bf16(value);
      });
  FLUX_RETURN_IF_LAUNCH_FAILED("latent_unpack");
  return absl::OkStatus();
}

absl::Status latent_pack_bf16(const void* x, int64_t cx, const void* mean, const void* var,
                              float eps, int64_t h, int64_t w, int64_t c, const Mat& tokens,
                              cudaStream_t stream) {
  if (tokens.rows != h * w || tokens.cols != 4 * c || cx < c) {
    return absl::InvalidArgumentError("latent_pack: tokens do not match the grid");
  }
  const bf16* in = static_cast<const bf16*>(x);
  const bf16* m = static_cast<const bf16*>(mean);
  const bf16* s = static_cast<const bf16*>(var);
  launch_rows(
      h * w, 4 * c, false, stream, [=] __device__(int64_t, int64_t) {},
      [=] __device__(int64_t token, int64_t ch) {
        const float std = round_bf16(sqrtf(round_bf16(__fadd_rn(to_f32(s[ch]), eps))));
        const int64_t row = token / w, col = token % w;
        const int64_t latent_c = ch / 4, dy = (ch / 2) % 2, dx = ch % 2;
        const float z = to_f32(in[((2 * row + dy) * 2 * w + (2 * col + dx)) * cx + latent_c]);
        const float centered = round_bf16(__fsub_rn(z, to_f32(m[ch])));
        static_cast<bf16*>(tokens.data)[token * tokens.stride + ch] =
            to_bf16(__fdiv_rn(centered, std));
      });
  FLUX_RETURN_IF_LAUNCH_FAILED("latent_pack");
  return absl::OkStatus();
}

namespace {

__global__ void pad_bottom_right_kernel(const bf16* x, int64_t h, int64_t w, int64_t c, bf16* out) {
  const int64_t count = (h + 1) * (w + 1) * c;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ch = i % c, pixel = i / c, col = pixel % (w + 1), row = pixel / (w + 1);
    out[i] = row < h && col < w ? x[(row * w + col) * c + ch] : to_bf16(0.0f);
  }
}

}  // namespace

absl::Status pad_bottom_right_bf16(const void* x, int64_t h, int64_t w, int64_t c, void* out,
                                   cudaStream_t stream) {
  const int64_t count = (h + 1) * (w + 1) * c;
  pad_bottom_right_kernel<<<grid_for(count, 256), 256, 0, stream>>>(static_cast<const bf16*>(x), h,
                                                                    w, c, static_cast<bf16*>(out));
  FLUX_RETURN_IF_LAUNCH_FAILED("pad_bottom_right");
  return absl::OkStatus();
}

namespace {

__global__ void rgb8_kernel(const bf16* image, int64_t count, uint8_t* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    // bf16 pipeline: image / 2 + 0.5 as two bf16 ops, then float32 x 255 and round.
    const float unit = round_bf16(__fadd_rn(round_bf16(__fdiv_rn(to_f32(image[i]), 2.0f)), 0.5f));
    out[i] = unit_to_u8(unit);
  }
}

__global__ void rgb8_to_image_kernel(const uint8_t* bytes, int64_t count, bf16* image) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    image[i] = to_bf16(u8_to_unit(bytes[i]));
  }
}

}  // namespace

absl::Status rgb8_to_image_bf16(const uint8_t* bytes, int64_t count, void* image,
                                cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  rgb8_to_image_kernel<<<grid_for(count, 256), 256, 0, stream>>>(bytes, count,
                                                                 static_cast<bf16*>(image));
  FLUX_RETURN_IF_LAUNCH_FAILED("rgb8_to_image");
  return absl::OkStatus();
}

absl::Status image_to_rgb8_bf16(const void* image, int64_t count, uint8_t* out,
                                cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  rgb8_kernel<<<grid_for(count, 256), 256, 0, stream>>>(static_cast<const bf16*>(image), count,
                                                        out);
  FLUX_RETURN_IF_LAUNCH_FAILED("image_to_rgb8");
  return absl::OkStatus();
}

}  // namespace flux2::cuda
