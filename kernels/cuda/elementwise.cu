// Element-wise CUDA kernels; see elementwise.h. Every eager op rounds its output to bf16 exactly
// once; fused kernels call the same rounding sequence with __fmul_rn/__fadd_rn so nvcc cannot
// contract across an eager op boundary (kernels/README.md, "Rounding points").
#include "absl/strings/str_cat.h"
#include "kernels/base/uniform_hash.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/launch.cuh"

namespace flux2::cuda {
namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ bf16* at(const Mat& m, int64_t r, int64_t c) {
  return static_cast<bf16*>(m.data) + r * m.stride + c;
}

absl::Status check_same_shape(const char* op, const Mat& a, const Mat& b) {
  if (a.rows != b.rows || a.cols != b.cols) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": shapes [", a.rows, ", ", a.cols,
                                                   "] and [", b.rows, ", ", b.cols, "] differ"));
  }
  return absl::OkStatus();
}

bool vec_ok(std::initializer_list<const Mat*> mats) {
  for (const Mat* m : mats) {
    if (!rows_aligned16(*m, 2)) return false;
  }
  return true;
}

// out = op(a, b) element-wise, for the eager binary pieces.
template <typename Op>
absl::Status binary(const char* name, const Mat& a, const Mat& b, const Mat& out,
                    cudaStream_t stream, Op op) {
  if (auto s = check_same_shape(name, a, b); !s.ok()) return s;
  if (auto s = check_same_shape(name, a, out); !s.ok()) return s;
  launch_rows(
      a.rows, a.cols, vec_ok({&a, &b, &out}), stream,
      [=] __device__(int64_t r, int64_t c) {
        float x[8], y[8];
        load8(at(a, r, c), x);
        load8(at(b, r, c), y);
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] = op(x[i], y[i]);
        store8(at(out, r, c), x);
      },
      [=] __device__(int64_t r, int64_t c) {
        *at(out, r, c) = to_bf16(op(to_f32(*at(a, r, c)), to_f32(*at(b, r, c))));
      });
  FLUX_RETURN_IF_LAUNCH_FAILED(name);
  return absl::OkStatus();
}

struct AddOp {
  __device__ float operator()(float x, float y) const { return __fadd_rn(x, y); }
};
struct SubOp {
  __device__ float operator()(float x, float y) const { return __fsub_rn(x, y); }
};
struct MulOp {
  __device__ float operator()(float x, float y) const { return __fmul_rn(x, y); }
};
template <SiluMath kMath>
struct SwiGluOp {  // bf16(bf16(silu(g)) · u)
  __device__ float operator()(float g, float u) const { return swiglu_value<kMath>(g, u); }
};

}  // namespace

absl::Status silu_bf16(const Mat& x, const Mat& out, cudaStream_t stream) {
  if (auto s = check_same_shape("silu", x, out); !s.ok()) return s;
  launch_rows(
      x.rows, x.cols, vec_ok({&x, &out}), stream,
      [=] __device__(int64_t r, int64_t c) {
        float v[8];
        load8(at(x, r, c), v);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = silu_value<SiluMath::kExact>(v[i]);
        store8(at(out, r, c), v);
      },
      [=] __device__(int64_t r, int64_t c) {
        *at(out, r, c) = to_bf16(silu_value<SiluMath::kExact>(to_f32(*at(x, r, c))));
      });
  FLUX_RETURN_IF_LAUNCH_FAILED("silu");
  return absl::OkStatus();
}

absl::Status add_bf16(const Mat& a, const Mat& b, const Mat& out, cudaStream_t stream) {
  return binary("add", a, b, out, stream, AddOp{});
}

absl::Status sub_bf16(const Mat& a, const Mat& b, const Mat& out, cudaStream_t stream) {
  return binary("sub", a, b, out, stream, SubOp{});
}

absl::Status mul_bf16(const Mat& a, const Mat& b, const Mat& out, cudaStream_t stream) {
  return binary("mul", a, b, out, stream, MulOp{});
}

absl::Status swiglu_fused(const Mat& gate, const Mat& up, const Mat& out, cudaStream_t stream) {
  return swiglu_fused(gate, up, out, SiluMath::kExact, stream);
}

absl::Status swiglu_fused(const Mat& gate, const Mat& up, const Mat& out, SiluMath math,
                          cudaStream_t stream) {
  if (math == SiluMath::kExact) {
    return binary("swiglu", gate, up, out, stream, SwiGluOp<SiluMath::kExact>{});
  }
  return binary("swiglu", gate, up, out, stream, SwiGluOp<SiluMath::kFast>{});
}

absl::Status gate_mul_bf16(const Mat& gate, int64_t rows_per_gate, const Mat& update,
                           const Mat& out, cudaStream_t stream) {
  if (auto s = check_same_shape("gate_mul", update, out); !s.ok()) return s;
  if (gate.cols != update.cols || rows_per_gate <= 0 || gate.rows * rows_per_gate != update.rows) {
    return absl::InvalidArgumentError(
        "gate_mul: gate rows x rows_per_gate must cover the update rows");
  }
  launch_rows(
      update.rows, update.cols, vec_ok({&gate, &update, &out}), stream,
      [=] __device__(int64_t r, int64_t c) {
        float g[8], u[8];
        load8(at(gate, row_div(r, rows_per_gate), c), g);
        load8(at(update, r, c), u);
#pragma unroll
        for (int i = 0; i < 8; ++i) g[i] = __fmul_rn(g[i], u[i]);
        store8(at(out, r, c), g);
      },
      [=] __device__(int64_t r, int64_t c) {
        *at(out, r, c) = to_bf16(
            __fmul_rn(to_f32(*at(gate, row_div(r, rows_per_gate), c)), to_f32(*at(update, r, c))));
      });
  FLUX_RETURN_IF_LAUNCH_FAILED("gate_mul");
  return absl::OkStatus();
}

absl::Status add_row_bf16(const Mat& x, const Mat& row, int64_t rows_per_row, const Mat& out,
                          cudaStream_t stream) {
  if (auto s = check_same_shape("add_row", x, out); !s.ok()) return s;
  if (row.cols != x.cols || rows_per_row <= 0 || row.rows * rows_per_row != x.rows) {
    return absl::InvalidArgumentError("add_row: row count x rows_per_row must cover x's rows");
  }
  launch_rows(
      x.rows, x.cols, vec_ok({&x, &row, &out}), stream,
      [=] __device__(int64_t r, int64_t c) {
        float a[8], b[8];
        load8(at(x, r, c), a);
        load8(at(row, row_div(r, rows_per_row), c), b);
#pragma unroll
        for (int i = 0; i < 8; ++i) a[i] = __fadd_rn(a[i], b[i]);
        store8(at(out, r, c), a);
      },
      [=] __device__(int64_t r, int64_t c) {
        *at(out, r, c) =
            to_bf16(__fadd_rn(to_f32(*at(x, r, c)), to_f32(*at(row, row_div(r, rows_per_row), c))));
      });
  FLUX_RETURN_IF_LAUNCH_FAILED("add_row");
  return absl::OkStatus();
}

absl::Status one_plus_bf16(const Mat& x, const Mat& out, cudaStream_t stream) {
  if (auto s = check_same_shape("one_plus", x, out); !s.ok()) return s;
  launch_rows(
      x.rows, x.cols, false, stream, [=] __device__(int64_t, int64_t) {},
      [=] __device__(int64_t r, int64_t c) {
        *at(out, r, c) = to_bf16(__fadd_rn(1.0f, to_f32(*at(x, r, c))));
      });
  FLUX_RETURN_IF_LAUNCH_FAILED("one_plus");
  return absl::OkStatus();
}

absl::Status bias_residual_fused(const Mat& x, const Mat& bias, const Mat& residual, const Mat& out,
                                 cudaStream_t stream) {
  if (auto s = check_same_shape("bias_residual", x, residual); !s.ok()) return s;
  if (auto s = check_same_shape("bias_residual", x, out); !s.ok()) return s;
  if (bias.rows != 1 || bias.cols != x.cols) {
    return absl::InvalidArgumentError("bias_residual: the bias must be one row of x's width");
  }
  launch_rows(
      x.rows, x.cols, vec_ok({&x, &bias, &residual, &out}), stream,
      [=] __device__(int64_t r, int64_t c) {
        float a[8], b[8], res[8];
        load8(at(x, r, c), a);
        load8(at(bias, 0, c), b);
        load8(at(residual, r, c), res);
#pragma unroll
        for (int i = 0; i < 8; ++i) a[i] = __fadd_rn(res[i], round_bf16(__fadd_rn(a[i], b[i])));
        store8(at(out, r, c), a);
      },
      [=] __device__(int64_t r, int64_t c) {
        const float biased = round_bf16(__fadd_rn(to_f32(*at(x, r, c)), to_f32(*at(bias, 0, c))));
        *at(out, r, c) = to_bf16(__fadd_rn(to_f32(*at(residual, r, c)), biased));
      });
  FLUX_RETURN_IF_LAUNCH_FAILED("bias_residual");
  return absl::OkStatus();
}

absl::Status gate_residual_fused(const Mat& x, const Mat& gate, int64_t rows_per_gate,
                                 const Mat& update, cudaStream_t stream) {
  if (auto s = check_same_shape("gate_residual", x, update); !s.ok()) return s;
  if (gate.cols != x.cols || rows_per_gate <= 0 || gate.rows * rows_per_gate != x.rows) {
    return absl::InvalidArgumentError(
        "gate_residual: gate rows x rows_per_gate must cover x's rows");
  }
  launch_rows(
      x.rows, x.cols, vec_ok({&x, &gate, &update}), stream,
      [=] __device__(int64_t r, int64_t c) {
        float h[8], g[8], u[8];
        load8(at(x, r, c), h);
        load8(at(gate, row_div(r, rows_per_gate), c), g);
        load8(at(update, r, c), u);
#pragma unroll
        for (int i = 0; i < 8; ++i) h[i] = __fadd_rn(h[i], round_bf16(__fmul_rn(g[i], u[i])));
        store8(at(x, r, c), h);
      },
      [=] __device__(int64_t r, int64_t c) {
        const float t = round_bf16(
            __fmul_rn(to_f32(*at(gate, row_div(r, rows_per_gate), c)), to_f32(*at(update, r, c))));
        *at(x, r, c) = to_bf16(__fadd_rn(to_f32(*at(x, r, c)), t));
      });
  FLUX_RETURN_IF_LAUNCH_FAILED("gate_residual");
  return absl::OkStatus();
}

absl::Status euler_step_bf16(const Mat& x, const Mat& v, float dt, cudaStream_t stream) {
  if (auto s = check_same_shape("euler_step", x, v); !s.ok()) return s;
  launch_rows(
      x.rows, x.cols, vec_ok({&x, &v}), stream,
      [=] __device__(int64_t r, int64_t c) {
        float s[8], d[8];
        load8(at(x, r, c), s);
        load8(at(v, r, c), d);
#pragma unroll
        for (int i = 0; i < 8; ++i) s[i] = __fadd_rn(s[i], __fmul_rn(dt, d[i]));
        store8(at(x, r, c), s);
      },
      [=] __device__(int64_t r, int64_t c) {
        *at(x, r, c) =
            to_bf16(__fadd_rn(to_f32(*at(x, r, c)), __fmul_rn(dt, to_f32(*at(v, r, c)))));
      });
  FLUX_RETURN_IF_LAUNCH_FAILED("euler_step");
  return absl::OkStatus();
}

absl::Status cfg_combine_bf16(const Mat& uncond, const Mat& cond, float scale, const Mat& out,
                              cudaStream_t stream) {
  if (auto s = check_same_shape("cfg_combine", uncond, cond); !s.ok()) return s;
  if (auto s = check_same_shape("cfg_combine", uncond, out); !s.ok()) return s;
  auto combine = [scale] __device__(float u, float c) {
    const float diff = round_bf16(__fsub_rn(c, u));
    return __fadd_rn(u, round_bf16(__fmul_rn(scale, diff)));
  };
  launch_rows(
      uncond.rows, uncond.cols, vec_ok({&uncond, &cond, &out}), stream,
      [=] __device__(int64_t r, int64_t c) {
        float u[8], k[8];
        load8(at(uncond, r, c), u);
        load8(at(cond, r, c), k);
#pragma unroll
        for (int i = 0; i < 8; ++i) u[i] = combine(u[i], k[i]);
        store8(at(out, r, c), u);
      },
      [=] __device__(int64_t r, int64_t c) {
        *at(out, r, c) = to_bf16(combine(to_f32(*at(uncond, r, c)), to_f32(*at(cond, r, c))));
      });
  FLUX_RETURN_IF_LAUNCH_FAILED("cfg_combine");
  return absl::OkStatus();
}

namespace {

template <typename Src, typename Dst>
__global__ void convert_kernel(const Src* src, int64_t src_stride, Dst* dst, int64_t dst_stride,
                               int64_t rows, int64_t cols) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float v = to_f32(src[r * src_stride + c]);
    if constexpr (sizeof(Dst) == 2) {
      dst[r * dst_stride + c] = to_bf16(v);
    } else {
      dst[r * dst_stride + c] = v;
    }
  }
}

}  // namespace

absl::Status convert_copy(const Mat& src, DType src_dtype, const Mat& dst, DType dst_dtype,
                          cudaStream_t stream) {
  if (auto s = check_same_shape("convert_copy", src, dst); !s.ok()) return s;
  if (src.rows == 0 || src.cols == 0) return absl::OkStatus();
  const bool src_ok = src_dtype == DType::kF32 || src_dtype == DType::kBF16;
  const bool dst_ok = dst_dtype == DType::kF32 || dst_dtype == DType::kBF16;
  if (src_dtype == dst_dtype) {
    const size_t elem = static_cast<size_t>(dtype_size(src_dtype));
    return cuda_status(
        cudaMemcpy2DAsync(dst.data, dst.stride * elem, src.data, src.stride * elem, src.cols * elem,
                          src.rows, cudaMemcpyDeviceToDevice, stream),
        "convert_copy");
  }
  if (!src_ok || !dst_ok)
    return absl::InvalidArgumentError("convert_copy: only f32 and bf16 convert");
  constexpr int kThreads = 256;
  const int grid = grid_for(src.rows * src.cols, kThreads);
  if (src_dtype == DType::kF32) {
    convert_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(src.data), src.stride,
                                                  static_cast<bf16*>(dst.data), dst.stride,
                                                  src.rows, src.cols);
  } else {
    convert_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const bf16*>(src.data), src.stride,
                                                  static_cast<float*>(dst.data), dst.stride,
                                                  src.rows, src.cols);
  }
  FLUX_RETURN_IF_LAUNCH_FAILED("convert_copy");
  return absl::OkStatus();
}

namespace {

__global__ void fill_uniform_kernel(bf16* data, int64_t count, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    data[i] = to_bf16((2.0f * uniform_hash(seed, static_cast<uint64_t>(i)) - 1.0f) * scale);
  }
}

}  // namespace

namespace {

__global__ void inverse_product_kernel(const float* a, const float* b, float* out) {
  out[0] = __fdiv_rn(1.0f, __fmul_rn(a[0], b[0]));
}

}  // namespace

absl::Status gated_channel_scales(const float* w_scale, const void* gate, int64_t count, float* out,
                                  cudaStream_t stream) {
  if (w_scale == nullptr || gate == nullptr || out == nullptr || count < 0) {
    return absl::InvalidArgumentError("gated_channel_scales: null operand or negative count");
  }
  const auto* g = static_cast<const bf16*>(gate);
  launch_grid<1>(1, count, stream, [=] __device__(int64_t, int64_t n) {
    out[n] = __fmul_rn(w_scale[n], to_f32(g[n]));
  });
  FLUX_RETURN_IF_LAUNCH_FAILED("gated_channel_scales");
  return absl::OkStatus();
}

absl::Status inverse_product(const float* a, const float* b, float* out, cudaStream_t stream) {
  inverse_product_kernel<<<1, 1, 0, stream>>>(a, b, out);
  FLUX_RETURN_IF_LAUNCH_FAILED("inverse_product");
  return absl::OkStatus();
}

absl::Status fill_uniform_bf16(void* data, int64_t count, uint64_t seed, float scale,
                               cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  constexpr int kThreads = 256;
  fill_uniform_kernel<<<grid_for(count, kThreads), kThreads, 0, stream>>>(static_cast<bf16*>(data),
                                                                          count, seed, scale);
  FLUX_RETURN_IF_LAUNCH_FAILED("fill_uniform_bf16");
  return absl::OkStatus();
}

}  // namespace flux2::cuda
