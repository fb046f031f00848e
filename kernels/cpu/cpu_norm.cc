// CpuBackend normalisations: LayerNorm + modulation, RMSNorm, per-head QK RMSNorm + RoPE and
// GroupNorm (+SiLU). Statistics accumulate in double, results are float32.
// Tested by tests/host/cpu_ops_test.cc.
#include <cmath>
#include <vector>

#include "kernels/base/parallel.h"
#include "kernels/cpu/cpu_access.h"
#include "kernels/cpu/cpu_backend.h"

namespace flux2 {
namespace {

// Mean and 1/sqrt(biased variance + eps) of n values.
void mean_rstd(const float* x, int64_t n, float eps, float* mean_out, float* rstd_out) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const double mean = sum / static_cast<double>(n);
  double squares = 0.0;
  for (int64_t i = 0; i < n; ++i) squares += (x[i] - mean) * (x[i] - mean);
  *mean_out = static_cast<float>(mean);
  *rstd_out = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(n) + eps));
}

// 1/sqrt(mean(x²) + eps) of n values.
float rms_rstd(const float* x, int64_t n, float eps) {
  double squares = 0.0;
  for (int64_t i = 0; i < n; ++i) squares += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(n) + eps));
}

}  // namespace

absl::Status CpuBackend::layer_norm_modulate(const Tensor& x, const Tensor& shift,
                                             const Tensor& scale, float eps, const Tensor& out) {
  constexpr absl::string_view kOp = "layer_norm_modulate";
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "x", x));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "out", out));
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "out", out, x.rows(), x.cols()));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "shift", shift));
  FLUX_RETURN_IF_ERROR(check_vector(kOp, "shift", shift, x.cols()));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "scale", scale));
  FLUX_RETURN_IF_ERROR(check_vector(kOp, "scale", scale, x.cols()));
  const float* sh = shift.data_as<float>();
  const float* sc = scale.data_as<float>();
  const int64_t d = x.cols();
  parallel_for(x.rows(), cpu::rows_per_chunk(x), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* in = cpu::row(x, r);
      float* o = cpu::row(out, r);
      float mean, rstd;
      mean_rstd(in, d, eps, &mean, &rstd);
      for (int64_t c = 0; c < d; ++c) o[c] = (1.0f + sc[c]) * ((in[c] - mean) * rstd) + sh[c];
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps,
                                  const Tensor& out) {
  constexpr absl::string_view kOp = "rms_norm";
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "x", x));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "out", out));
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "out", out, x.rows(), x.cols()));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "weight", weight));
  FLUX_RETURN_IF_ERROR(check_vector(kOp, "weight", weight, x.cols()));
  const float* w = weight.data_as<float>();
  parallel_for(x.rows(), cpu::rows_per_chunk(x), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* in = cpu::row(x, r);
      float* o = cpu::row(out, r);
      const float rstd = rms_rstd(in, x.cols(), eps);
      for (int64_t c = 0; c < x.cols(); ++c) o[c] = in[c] * rstd * w[c];
    }
  });
  return absl::OkStatus();
}

namespace {

// The rotary embedding of every head of x [S, H·Dh], after the head's RMSNorm with `norm_weight`
// when one is given (qk_norm_rope) or on the values as they are (rope).
absl::Status rotate_heads(absl::string_view op, const Tensor& x, int64_t head_dim,
                          const Tensor* norm_weight, float eps, const Tensor& cos,
                          const Tensor& sin, RopeStyle style) {
  FLUX_RETURN_IF_ERROR(cpu::check_f32(op, "x", x));
  if (head_dim <= 0 || head_dim % 2 != 0 || x.cols() % head_dim != 0) {
    return op_error(op,
                    absl::StrCat("x ", x.describe(), " is not whole heads of even dim ", head_dim));
  }
  if (norm_weight != nullptr) {
    FLUX_RETURN_IF_ERROR(cpu::check_f32(op, "norm_weight", *norm_weight));
    FLUX_RETURN_IF_ERROR(check_vector(op, "norm_weight", *norm_weight, head_dim));
  }
  FLUX_RETURN_IF_ERROR(cpu::check_f32(op, "cos", cos));
  FLUX_RETURN_IF_ERROR(check_matrix(op, "cos", cos, x.rows(), head_dim));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(op, "sin", sin));
  FLUX_RETURN_IF_ERROR(check_matrix(op, "sin", sin, x.rows(), head_dim));
  const float* w = norm_weight != nullptr ? norm_weight->data_as<float>() : nullptr;
  const int64_t heads = x.cols() / head_dim;
  const int64_t half = head_dim / 2;
  parallel_for(x.rows(), cpu::rows_per_chunk(x), [&](int64_t begin, int64_t end) {
    std::vector<float> normed(static_cast<size_t>(head_dim));
    for (int64_t r = begin; r < end; ++r) {
      const float* c = cpu::row(cos, r);
      const float* s = cpu::row(sin, r);
      for (int64_t h = 0; h < heads; ++h) {
        float* v = cpu::row(x, r) + h * head_dim;
        if (w != nullptr) {
          const float rstd = rms_rstd(v, head_dim, eps);
          for (int64_t d = 0; d < head_dim; ++d) normed[d] = v[d] * rstd * w[d];
        } else {
          for (int64_t d = 0; d < head_dim; ++d) normed[d] = v[d];
        }
        for (int64_t d = 0; d < head_dim; ++d) {
          float rotated;
          if (style == RopeStyle::kInterleaved) {
            rotated = (d % 2 == 0) ? -normed[d + 1] : normed[d - 1];
          } else {
            rotated = (d < half) ? -normed[d + half] : normed[d - half];
          }
          v[d] = normed[d] * c[d] + rotated * s[d];
        }
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status CpuBackend::qk_norm_rope(const Tensor& x, int64_t head_dim, const Tensor& norm_weight,
                                      float eps, const Tensor& cos, const Tensor& sin,
                                      RopeStyle style) {
  return rotate_heads("qk_norm_rope", x, head_dim, &norm_weight, eps, cos, sin, style);
}

absl::Status CpuBackend::rope(const Tensor& x, int64_t head_dim, const Tensor& cos,
                              const Tensor& sin, RopeStyle style) {
  return rotate_heads("rope", x, head_dim, nullptr, 0.0f, cos, sin, style);
}

absl::Status CpuBackend::group_norm(const Tensor& x, int64_t groups, const Tensor& gamma,
                                    const Tensor& beta, float eps, bool silu, const Tensor& out) {
  constexpr absl::string_view kOp = "group_norm";
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "x", x));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "out", out));
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "out", out, x.rows(), x.cols()));
  const int64_t channels = x.cols(), pixels = x.rows();
  if (groups <= 0 || channels % groups != 0) {
    return op_error(kOp, absl::StrCat(channels, " channels do not split into ", groups, " groups"));
  }
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "gamma", gamma));
  FLUX_RETURN_IF_ERROR(check_vector(kOp, "gamma", gamma, channels));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "beta", beta));
  FLUX_RETURN_IF_ERROR(check_vector(kOp, "beta", beta, channels));
  const int64_t per_group = channels / groups;
  std::vector<float> mean(static_cast<size_t>(groups)), rstd(static_cast<size_t>(groups));
  parallel_for(groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      double sum = 0.0;
      for (int64_t p = 0; p < pixels; ++p) {
        const float* v = cpu::row(x, p) + g * per_group;
        for (int64_t c = 0; c < per_group; ++c) sum += v[c];
      }
      const double count = static_cast<double>(pixels * per_group);
      const double m = sum / count;
      double squares = 0.0;
      for (int64_t p = 0; p < pixels; ++p) {
        const float* v = cpu::row(x, p) + g * per_group;
        for (int64_t c = 0; c < per_group; ++c) squares += (v[c] - m) * (v[c] - m);
      }
      mean[g] = static_cast<float>(m);
      rstd[g] = static_cast<float>(1.0 / std::sqrt(squares / count + eps));
    }
  });
  const float* gm = gamma.data_as<float>();
  const float* bt = beta.data_as<float>();
  parallel_for(pixels, cpu::rows_per_chunk(x), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const float* in = cpu::row(x, p);
      float* o = cpu::row(out, p);
      for (int64_t c = 0; c < channels; ++c) {
        const int64_t g = c / per_group;
        float y = (in[c] - mean[g]) * rstd[g] * gm[c] + bt[c];
        if (silu) y = y / (1.0f + std::exp(-y));
        o[c] = y;
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace flux2
