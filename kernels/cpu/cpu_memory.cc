// CpuBackend memory ops: allocation, host transfers (with dtype conversion) and strided copies.
// Tested by tests/host/cpu_ops_test.cc.
#include <cstdlib>
#include <cstring>

#include "kernels/base/uniform_hash.h"
#include "kernels/cpu/cpu_access.h"
#include "kernels/cpu/cpu_backend.h"

namespace flux2 {

absl::StatusOr<Tensor> CpuBackend::empty(DType dtype, Shape shape) {
  const int64_t bytes = std::max<int64_t>(1, shape_numel(shape) * dtype_size(dtype));
  // 64-byte alignment keeps rows vector-friendly; the size must be a multiple of the alignment.
  void* memory = std::aligned_alloc(64, static_cast<size_t>((bytes + 63) / 64 * 64));
  if (memory == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cpu: cannot allocate ", bytes, " bytes for ", shape_string(shape)));
  }
  std::shared_ptr<void> storage(memory, std::free);
  const int64_t cols = shape.empty() ? 1 : shape.back();
  return Tensor(std::move(storage), memory, dtype, Device::kCpu, std::move(shape), cols);
}

absl::Status CpuBackend::upload(const void* host, DType host_dtype, const Tensor& dst) {
  if (dst.device() != Device::kCpu) return op_error("upload", "destination is not on the cpu");
  const int64_t cols = dst.cols();
  const int64_t rows = dst.rows();
  const int64_t elem = dtype_size(host_dtype);
  for (int64_t r = 0; r < rows; ++r) {
    const char* src_row = static_cast<const char*>(host) + r * cols * elem;
    char* dst_row = static_cast<char*>(dst.data()) + r * dst.row_stride() * dtype_size(dst.dtype());
    if (host_dtype == dst.dtype()) {
      std::memcpy(dst_row, src_row, static_cast<size_t>(cols * elem));
    } else if (dst.dtype() == DType::kF32) {
      widen_to_f32(host_dtype, src_row, cols, reinterpret_cast<float*>(dst_row));
    } else if (dst.dtype() == DType::kI32 && host_dtype == DType::kI64) {
      const auto* in = reinterpret_cast<const int64_t*>(src_row);
      auto* out = reinterpret_cast<int32_t*>(dst_row);
      for (int64_t c = 0; c < cols; ++c) out[c] = static_cast<int32_t>(in[c]);
    } else {
      return op_error("upload", absl::StrCat("cannot convert ", dtype_name(host_dtype), " to ",
                                             dtype_name(dst.dtype())));
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::download(const Tensor& src, float* host) {
  if (src.device() != Device::kCpu) return op_error("download", "source is not on the cpu");
  const int64_t elem = dtype_size(src.dtype());
  for (int64_t r = 0; r < src.rows(); ++r) {
    const char* src_row = static_cast<const char*>(src.data()) + r * src.row_stride() * elem;
    widen_to_f32(src.dtype(), src_row, src.cols(), host + r * src.cols());
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  FLUX_RETURN_IF_ERROR(cpu::check_f32("copy", "src", src));
  FLUX_RETURN_IF_ERROR(cpu::check_f32("copy", "dst", dst));
  FLUX_RETURN_IF_ERROR(check_matrix("copy", "dst", dst, src.rows(), src.cols()));
  for (int64_t r = 0; r < src.rows(); ++r) {
    std::memcpy(cpu::row(dst, r), cpu::row(src, r),
                static_cast<size_t>(src.cols()) * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::fill_uniform(const Tensor& t, uint64_t seed, float scale) {
  FLUX_RETURN_IF_ERROR(cpu::check_f32("fill_uniform", "t", t));
  if (!t.contiguous()) return op_error("fill_uniform", "tensor must be contiguous");
  float* out = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    out[i] = (2.0f * uniform_hash(seed, static_cast<uint64_t>(i)) - 1.0f) * scale;
  }
  return absl::OkStatus();
}

}  // namespace flux2
