// CUDA launchers for the VAE decoder and text-encoder ops that are not GEMMs or attention:
// GroupNorm (+SiLU), nearest ×2 upsampling, zero padding, latent (un)packing
// (bf16, NHWC).
// Tested against the CPU backend by tests/cuda/op_cases.cc (gpu_op_test).
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2::cuda {

// The statistics of GroupNorm over x [P, C] (bf16): per group, mean and rstd = 1/sqrt(var + eps)
// (two passes in fp32, a fixed reduction tree) into the device arrays mean, rstd [groups].
absl::Status group_norm_statistics_bf16(const Mat& x, int64_t groups, float eps, float* mean,
                                        float* rstd, cudaStream_t stream);
// out = GroupNorm(x [P, C]) with gamma/beta [C] (bf16): bf16((x − mean)·rstd·gamma + beta), then,
// when `silu`, bf16(silu(·)) — PyTorch's GroupNorm followed by a separate SiLU (silu_math
// kExact; kFast at quality=high). `one_pass`: the statistics of group_norm_one_pass.h (x read
// twice in all instead of three times; quality=high), else the two-pass ones above.
absl::Status group_norm_bf16(const Mat& x, int64_t groups, const void* gamma, const void* beta,
                             float eps, bool silu, SiluMath silu_math, bool one_pass,
                             const Mat& out, cudaStream_t stream);
// out [2H, 2W, C] = nearest ×2 of x [H, W, C] (contiguous bf16).
absl::Status upsample_nearest_2x_bf16(const void* x, int64_t h, int64_t w, int64_t c, void* out,
                                      cudaStream_t stream);
// Tokens [h·w, 4C] -> BatchNorm de-normalisation with f32-or-bf16 stats (mean, var [4C], bf16)
// -> unpatchify -> out [2h, 2w, C] (contiguous bf16). diffusers' bf16 order:
// bf16(bf16(z · bf16(sqrt(bf16(var + eps)))) + mean).
absl::Status latent_unpack_bf16(const Mat& tokens, const void* mean, const void* var, float eps,
                                int64_t h, int64_t w, int64_t c, void* out, cudaStream_t stream);
// The inverse for reference latents: the first C channels of x [2h, 2w, Cx] (contiguous bf16) ->
// patchify -> tokens [h·w, 4C] = bf16(bf16(z − mean) / bf16(sqrt(bf16(var + eps)))), diffusers'
// bf16 order.
absl::Status latent_pack_bf16(const void* x, int64_t cx, const void* mean, const void* var,
                              float eps, int64_t h, int64_t w, int64_t c, const Mat& tokens,
                              cudaStream_t stream);
// out [H + 1, W + 1, C] = x [H, W, C] with a zero row appended at the bottom and a zero column at
// the right (F.pad(x, (0, 1, 0, 1)) in NCHW terms); contiguous bf16.
absl::Status pad_bottom_right_bf16(const void* x, int64_t h, int64_t w, int64_t c, void* out,
                                   cudaStream_t stream);
// image[i] = bf16(u8_to_unit(bytes[i])) (kernels/base/postprocess.h) for `count` device bytes,
// into a contiguous bf16 image.
absl::Status rgb8_to_image_bf16(const uint8_t* bytes, int64_t count, void* image,
                                cudaStream_t stream);
// out[i] = round(clamp(bf16(bf16(x / 2) + 0.5), 0, 1) · 255) as uint8 (device bytes), for a
// contiguous bf16 image.
absl::Status image_to_rgb8_bf16(const void* image, int64_t count, uint8_t* out,
                                cudaStream_t stream);

}  // namespace flux2::cuda
