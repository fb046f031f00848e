// CpuBackend element-wise ops: silu, add, sub, gated residual, SwiGLU, Euler step, CFG combine,
// nearest upsampling and latent unpacking, and the mean_abs_diff_ratio reduction. Float32
// throughout. Tested by tests/host/cpu_ops_test.cc.
#include <cmath>
#include <vector>

#include "kernels/base/parallel.h"
#include "kernels/base/postprocess.h"
#include "kernels/cpu/cpu_access.h"
#include "kernels/cpu/cpu_backend.h"

namespace flux2 {
namespace {

float silu_f32(float v) {
  return v / (1.0f + std::exp(-v));
}

// Applies fn(out_row, in_rows..., cols) to every row in parallel.
template <typename Fn>
void for_each_row(const Tensor& shape_of, Fn fn) {
  parallel_for(shape_of.rows(), cpu::rows_per_chunk(shape_of), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) fn(r);
  });
}

absl::Status check_same(absl::string_view op, const Tensor& a, absl::string_view b_name,
                        const Tensor& b) {
  FLUX_RETURN_IF_ERROR(cpu::check_f32(op, b_name, b));
  return check_matrix(op, b_name, b, a.rows(), a.cols());
}

}  // namespace

absl::Status CpuBackend::silu(const Tensor& x, const Tensor& out) {
  FLUX_RETURN_IF_ERROR(cpu::check_f32("silu", "x", x));
  FLUX_RETURN_IF_ERROR(check_same("silu", x, "out", out));
  for_each_row(x, [&](int64_t r) {
    const float* in = cpu::row(x, r);
    float* o = cpu::row(out, r);
    for (int64_t c = 0; c < x.cols(); ++c) o[c] = silu_f32(in[c]);
  });
  return absl::OkStatus();
}

namespace {

// out = op(a, b) element by element, after the checks both add and sub make.
template <typename Op>
absl::Status binary_rows(const char* name, const Tensor& a, const Tensor& b, const Tensor& out,
                         Op op) {
  FLUX_RETURN_IF_ERROR(cpu::check_f32(name, "a", a));
  FLUX_RETURN_IF_ERROR(check_same(name, a, "b", b));
  FLUX_RETURN_IF_ERROR(check_same(name, a, "out", out));
  for_each_row(a, [&](int64_t r) {
    const float* x = cpu::row(a, r);
    const float* y = cpu::row(b, r);
    float* o = cpu::row(out, r);
    for (int64_t c = 0; c < a.cols(); ++c) o[c] = op(x[c], y[c]);
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status CpuBackend::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  return binary_rows("add", a, b, out, [](float x, float y) { return x + y; });
}

absl::Status CpuBackend::sub(const Tensor& a, const Tensor& b, const Tensor& out) {
  return binary_rows("sub", a, b, out, [](float x, float y) { return x - y; });
}

absl::StatusOr<float> CpuBackend::mean_abs_diff_ratio(const Tensor& a, const Tensor& b) {
  FLUX_RETURN_IF_ERROR(cpu::check_f32("mean_abs_diff_ratio", "a", a));
  FLUX_RETURN_IF_ERROR(check_same("mean_abs_diff_ratio", a, "b", b));
  // Per-row sums in float64 (rows in parallel), then the rows in order: the same result for any
  // thread count.
  std::vector<double> diff(static_cast<size_t>(a.rows())), mag(diff.size());
  for_each_row(a, [&](int64_t r) {
    const float* x = cpu::row(a, r);
    const float* y = cpu::row(b, r);
    double d = 0.0, m = 0.0;
    for (int64_t c = 0; c < a.cols(); ++c) {
      d += std::fabs(static_cast<double>(x[c]) - static_cast<double>(y[c]));
      m += std::fabs(static_cast<double>(x[c]));
    }
    diff[r] = d;
    mag[r] = m;
  });
  double d = 0.0, m = 0.0;
  for (size_t r = 0; r < diff.size(); ++r) {
    d += diff[r];
    m += mag[r];
  }
  // The means' common count cancels; the quotient is rounded to float32 as torch's .item() is.
  return static_cast<float>(d / m);
}

absl::Status CpuBackend::gate_residual(const Tensor& x, const Tensor& gate, const Tensor& update) {
  constexpr absl::string_view kOp = "gate_residual";
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "x", x));
  FLUX_RETURN_IF_ERROR(check_same(kOp, x, "update", update));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "gate", gate));
  FLUX_RETURN_IF_ERROR(check_vector(kOp, "gate", gate, x.cols()));
  const float* g = gate.data_as<float>();
  for_each_row(x, [&](int64_t r) {
    float* h = cpu::row(x, r);
    const float* u = cpu::row(update, r);
    for (int64_t c = 0; c < x.cols(); ++c) h[c] += g[c] * u[c];
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  FLUX_RETURN_IF_ERROR(cpu::check_f32("swiglu", "gate", gate));
  FLUX_RETURN_IF_ERROR(check_same("swiglu", gate, "up", up));
  FLUX_RETURN_IF_ERROR(check_same("swiglu", gate, "out", out));
  for_each_row(gate, [&](int64_t r) {
    const float* g = cpu::row(gate, r);
    const float* u = cpu::row(up, r);
    float* o = cpu::row(out, r);
    for (int64_t c = 0; c < gate.cols(); ++c) o[c] = silu_f32(g[c]) * u[c];
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::from_rgb8(const uint8_t* host, const Tensor& image) {
  FLUX_RETURN_IF_ERROR(cpu::check_f32("from_rgb8", "image", image));
  if (!image.contiguous()) return op_error("from_rgb8", "image must be contiguous");
  float* out = image.data_as<float>();
  for (int64_t i = 0; i < image.numel(); ++i) out[i] = u8_to_unit(host[i]);
  return absl::OkStatus();
}

absl::Status CpuBackend::to_rgb8(const Tensor& image, uint8_t* host) {
  FLUX_RETURN_IF_ERROR(cpu::check_f32("to_rgb8", "image", image));
  for (int64_t r = 0; r < image.rows(); ++r) {
    const float* in = cpu::row(image, r);
    for (int64_t c = 0; c < image.cols(); ++c)
      host[r * image.cols() + c] = unit_to_u8(in[c] / 2.0f + 0.5f);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::euler_step(const Tensor& x, const Tensor& v, float dt) {
  FLUX_RETURN_IF_ERROR(cpu::check_f32("euler_step", "x", x));
  FLUX_RETURN_IF_ERROR(check_same("euler_step", x, "v", v));
  for_each_row(x, [&](int64_t r) {
    float* s = cpu::row(x, r);
    const float* d = cpu::row(v, r);
    for (int64_t c = 0; c < x.cols(); ++c) s[c] = s[c] + dt * d[c];
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::cfg_combine(const Tensor& uncond, const Tensor& cond, float scale,
                                     const Tensor& out) {
  FLUX_RETURN_IF_ERROR(cpu::check_f32("cfg_combine", "uncond", uncond));
  FLUX_RETURN_IF_ERROR(check_same("cfg_combine", uncond, "cond", cond));
  FLUX_RETURN_IF_ERROR(check_same("cfg_combine", uncond, "out", out));
  for_each_row(uncond, [&](int64_t r) {
    const float* u = cpu::row(uncond, r);
    const float* c = cpu::row(cond, r);
    float* o = cpu::row(out, r);
    for (int64_t i = 0; i < uncond.cols(); ++i) o[i] = u[i] + scale * (c[i] - u[i]);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::upsample_nearest_2x(const Tensor& x, const Tensor& out) {
  constexpr absl::string_view kOp = "upsample_nearest_2x";
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "x", x));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "out", out));
  if (x.rank() != 3 || out.rank() != 3 || !x.contiguous() || !out.contiguous() ||
      out.dim(0) != 2 * x.dim(0) || out.dim(1) != 2 * x.dim(1) || out.dim(2) != x.dim(2)) {
    return op_error(kOp, absl::StrCat("x ", x.describe(), " and out ", out.describe(),
                                      " are not contiguous [H, W, C] and [2H, 2W, C]"));
  }
  const int64_t h = x.dim(0), w = x.dim(1), c = x.dim(2);
  const float* in = x.data_as<float>();
  float* o = out.data_as<float>();
  parallel_for(2 * h, 1, [&](int64_t begin, int64_t end) {
    for (int64_t oy = begin; oy < end; ++oy) {
      for (int64_t ox = 0; ox < 2 * w; ++ox) {
        const float* src = in + ((oy / 2) * w + ox / 2) * c;
        std::copy(src, src + c, o + (oy * 2 * w + ox) * c);
      }
    }
  });
  return absl::OkStatus();
}

namespace {

// The latent BatchNorm's statistics: f32 vectors of the packed channel count.
absl::Status check_batch_norm_stats(absl::string_view op, const Tensor& bn_mean,
                                    const Tensor& bn_var, int64_t channels) {
  FLUX_RETURN_IF_ERROR(cpu::check_f32(op, "bn_mean", bn_mean));
  FLUX_RETURN_IF_ERROR(check_vector(op, "bn_mean", bn_mean, channels));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(op, "bn_var", bn_var));
  return check_vector(op, "bn_var", bn_var, channels);
}

}  // namespace

absl::Status CpuBackend::latent_unpack(const Tensor& tokens, const Tensor& bn_mean,
                                       const Tensor& bn_var, float eps, const Tensor& out) {
  constexpr absl::string_view kOp = "latent_unpack";
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "tokens", tokens));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "out", out));
  if (out.rank() != 3 || !out.contiguous() || out.dim(0) % 2 || out.dim(1) % 2) {
    return op_error(kOp, absl::StrCat("out ", out.describe(), " is not a contiguous [2h, 2w, C]"));
  }
  const int64_t h = out.dim(0) / 2, w = out.dim(1) / 2, c = out.dim(2);
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "tokens", tokens, h * w, 4 * c));
  FLUX_RETURN_IF_ERROR(check_batch_norm_stats(kOp, bn_mean, bn_var, 4 * c));
  const float* mean = bn_mean.data_as<float>();
  const float* var = bn_var.data_as<float>();
  float* o = out.data_as<float>();
  for (int64_t row = 0; row < h; ++row) {
    for (int64_t col = 0; col < w; ++col) {
      const float* token = cpu::row(tokens, row * w + col);
      for (int64_t ch = 0; ch < 4 * c; ++ch) {
        const float value = token[ch] * std::sqrt(var[ch] + eps) + mean[ch];
        const int64_t latent_c = ch / 4, dy = (ch / 2) % 2, dx = ch % 2;
        o[((2 * row + dy) * 2 * w + (2 * col + dx)) * c + latent_c] = value;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::latent_pack(const Tensor& x, const Tensor& bn_mean, const Tensor& bn_var,
                                     float eps, const Tensor& tokens) {
  constexpr absl::string_view kOp = "latent_pack";
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "x", x));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "tokens", tokens));
  const int64_t c = tokens.cols() / 4;
  if (x.rank() != 3 || !x.contiguous() || x.dim(0) % 2 || x.dim(1) % 2 || x.dim(2) < c ||
      tokens.cols() % 4 != 0) {
    return op_error(kOp, absl::StrCat("x ", x.describe(), " is not a contiguous [2h, 2w, >= ", c,
                                      "] for tokens ", tokens.describe()));
  }
  const int64_t h = x.dim(0) / 2, w = x.dim(1) / 2, cx = x.dim(2);
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "tokens", tokens, h * w, 4 * c));
  FLUX_RETURN_IF_ERROR(check_batch_norm_stats(kOp, bn_mean, bn_var, 4 * c));
  const float* mean = bn_mean.data_as<float>();
  const float* var = bn_var.data_as<float>();
  const float* in = x.data_as<float>();
  for (int64_t row = 0; row < h; ++row) {
    for (int64_t col = 0; col < w; ++col) {
      float* token = cpu::row(tokens, row * w + col);
      for (int64_t ch = 0; ch < 4 * c; ++ch) {
        const int64_t latent_c = ch / 4, dy = (ch / 2) % 2, dx = ch % 2;
        const float z = in[((2 * row + dy) * 2 * w + (2 * col + dx)) * cx + latent_c];
        token[ch] = (z - mean[ch]) / std::sqrt(var[ch] + eps);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace flux2
