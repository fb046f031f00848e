// CpuBackend NHWC convolution (stride 1, "same" zero padding) as im2col over blocks of image rows
// followed by one OpenBLAS sgemm per block. Tested by tests/host/cpu_ops_test.cc against a direct
// loop.
#include <cblas.h>

#include <vector>

#include "kernels/base/parallel.h"
#include "kernels/cpu/cpu_access.h"
#include "kernels/cpu/cpu_backend.h"

namespace flux2 {

absl::Status CpuBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                                const Tensor& out) {
  constexpr absl::string_view kOp = "conv2d";
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "x", x));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "w", w));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "bias", bias));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "out", out));
  if (x.rank() != 3 || out.rank() != 3 || w.rank() != 4 || !x.contiguous() || !out.contiguous() ||
      !w.contiguous()) {
    return op_error(
        kOp, absl::StrCat(
                 "expected contiguous x [H, W, Cin], w [Cout, k, k, Cin], out [H, W, Cout]; got ",
                 x.describe(), ", ", w.describe(), ", ", out.describe()));
  }
  const int64_t height = x.dim(0), width = x.dim(1), cin = x.dim(2);
  const int64_t cout = w.dim(0), ksize = w.dim(1);
  if (w.dim(2) != ksize || ksize % 2 == 0 || w.dim(3) != cin || out.dim(0) != height ||
      out.dim(1) != width || out.dim(2) != cout) {
    return op_error(kOp, absl::StrCat("shapes do not match: x ", x.describe(), ", w ", w.describe(),
                                      ", out ", out.describe()));
  }
  FLUX_RETURN_IF_ERROR(check_vector(kOp, "bias", bias, cout));
  const int64_t pad = ksize / 2;
  const int64_t patch = ksize * ksize * cin;  // one im2col row: taps (ky, kx) outer, ci inner
  // Image rows per im2col block, keeping the patch matrix under about 64 MiB.
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
            const int64_t sy = y + ky - pad, sx = px + kx - pad;
            if (sy < 0 || sy >= height || sx < 0 || sx >= width) {
              std::fill(dst, dst + cin, 0.0f);
            } else {
              const float* src = in + (sy * width + sx) * cin;
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
  return absl::OkStatus();
}

}  // namespace flux2
