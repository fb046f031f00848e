// CpuBackend NHWC convolutions (stride 1 with "same" zero padding; Downsample2D's stride 2 with
// the bottom/right zero padding) as im2col over blocks of output rows followed by one OpenBLAS
// sgemm per block. Tested by tests/host/cpu_ops_test.cc against a direct loop.
#include <cblas.h>

#include <vector>

#include "kernels/base/parallel.h"
#include "kernels/cpu/cpu_access.h"
#include "kernels/cpu/cpu_backend.h"

namespace flux2 {

namespace {

// out[y, x] = bias + sum over taps (ky, kx) of w · in[y·stride + ky − pad, x·stride + kx − pad],
// zero outside the input. Shapes checked by the callers.
void conv2d_im2col(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                   int64_t stride, int64_t pad) {
  const int64_t in_height = x.dim(0), in_width = x.dim(1), cin = x.dim(2);
  const int64_t height = out.dim(0), width = out.dim(1);
  const int64_t cout = w.dim(0), ksize = w.dim(1);
  const int64_t patch = ksize * ksize * cin;  // one im2col row: taps (ky, kx) outer, ci inner
  // Output rows per im2col block, keeping the patch matrix under about 64 MiB.
  const int64_t block_rows = std::max<int64_t>(
      1, std::min<int64_t>(height, (int64_t{16} << 20) / std::max<int64_t>(1, width * patch)));
  std::vector<float> patches(static_cast<size_t>(block_rows * width * patch));
  const float* in = x.data_as<float>();
  const float* b = bias.data_as<float>();
  float* o = out.data_as<float>();
  for (int64_t y0 = 0; y0 < height; y0 += block_rows) {
    const int64_t rows = std::min(block_rows, height - y0);
    parallel_for(rows * width, 64, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const int64_t y = y0 + p / width, px = p % width;
        float* dst = patches.data() + p * patch;
        for (int64_t ky = 0; ky < ksize; ++ky) {
          for (int64_t kx = 0; kx < ksize; ++kx, dst += cin) {
            const int64_t sy = y * stride + ky - pad, sx = px * stride + kx - pad;
            if (sy < 0 || sy >= in_height || sx < 0 || sx >= in_width) {
              std::fill(dst, dst + cin, 0.0f);
            } else {
              const float* src = in + (sy * in_width + sx) * cin;
              std::copy(src, src + cin, dst);
            }
          }
        }
        std::copy(b, b + cout, o + (y * width + px) * cout);
      }
    });
    // out[rows·W, Cout] += patches[rows·W, k·k·Cin] · w[Cout, k·k·Cin]ᵀ
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows * width),
                static_cast<int>(cout), static_cast<int>(patch), 1.0f, patches.data(),
                static_cast<int>(patch), w.data_as<float>(), static_cast<int>(patch), 1.0f,
                o + y0 * width * cout, static_cast<int>(cout));
  }
}

// The checks both convolutions share: f32, contiguous x [H, W, Cin], w [Cout, k, k, Cin] (k odd),
// out [*, *, Cout], bias [Cout].
absl::Status check_conv(absl::string_view op, const Tensor& x, const Tensor& w, const Tensor& bias,
                        const Tensor& out) {
  FLUX_RETURN_IF_ERROR(cpu::check_f32(op, "x", x));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(op, "w", w));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(op, "bias", bias));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(op, "out", out));
  if (x.rank() != 3 || out.rank() != 3 || w.rank() != 4 || !x.contiguous() || !out.contiguous() ||
      !w.contiguous()) {
    return op_error(
        op, absl::StrCat(
                "expected contiguous x [H, W, Cin], w [Cout, k, k, Cin], out [H', W', Cout]; got ",
                x.describe(), ", ", w.describe(), ", ", out.describe()));
  }
  if (w.dim(2) != w.dim(1) || w.dim(1) % 2 == 0 || w.dim(3) != x.dim(2) || out.dim(2) != w.dim(0)) {
    return op_error(op, absl::StrCat("shapes do not match: x ", x.describe(), ", w ", w.describe(),
                                     ", out ", out.describe()));
  }
  return check_vector(op, "bias", bias, w.dim(0));
}

}  // namespace

absl::Status CpuBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                                const Tensor& out) {
  FLUX_RETURN_IF_ERROR(check_conv("conv2d", x, w, bias, out));
  if (out.dim(0) != x.dim(0) || out.dim(1) != x.dim(1)) {
    return op_error("conv2d",
                    absl::StrCat("out ", out.describe(), " is not the size of x ", x.describe()));
  }
  conv2d_im2col(x, w, bias, out, /*stride=*/1, /*pad=*/w.dim(1) / 2);
  return absl::OkStatus();
}

absl::Status CpuBackend::conv2d_downsample(const Tensor& x, const Tensor& w, const Tensor& bias,
                                           const Tensor& out) {
  FLUX_RETURN_IF_ERROR(check_conv("conv2d_downsample", x, w, bias, out));
  if (w.dim(1) != 3 || x.dim(0) % 2 != 0 || x.dim(1) % 2 != 0 || out.dim(0) != x.dim(0) / 2 ||
      out.dim(1) != x.dim(1) / 2) {
    return op_error("conv2d_downsample",
                    absl::StrCat("expected a 3x3 kernel, x [H, W, Cin] with H, W even and out "
                                 "[H/2, W/2, Cout]; got x ",
                                 x.describe(), ", w ", w.describe(), ", out ", out.describe()));
  }
  // Padding (0, 1, 0, 1): taps past the bottom/right edge read zeros, none before the top/left.
  conv2d_im2col(x, w, bias, out, /*stride=*/2, /*pad=*/0);
  return absl::OkStatus();
}

}  // namespace flux2
