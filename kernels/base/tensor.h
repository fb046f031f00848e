// Tensor: a typed, shaped view of backend memory, seen by every op as a row-major matrix
// [rows, cols] whose rows may be strided (column slices of a wider buffer). Tested by
// tests/host/tensor_test.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/inlined_vector.h"
#include "kernels/base/dtype.h"

namespace flux2 {

using Shape = absl::InlinedVector<int64_t, 4>;

// Where a tensor's memory lives.
enum class Device : uint8_t {
  kCpu,   // host memory
  kCuda,  // device memory of the current CUDA device
};

absl::string_view device_name(Device device);
int64_t shape_numel(const Shape& shape);
std::string shape_string(const Shape& shape);  // "[16, 128]"

class Tensor {
 public:
  Tensor() = default;
  // `storage` keeps the memory alive (null for borrowed memory); `data` is the first element.
  Tensor(std::shared_ptr<void> storage, void* data, DType dtype, Device device, Shape shape,
         int64_t row_stride);
  // A contiguous view of memory the caller keeps alive.
  static Tensor borrow(void* data, DType dtype, Device device, Shape shape);

  bool defined() const { return data_ != nullptr || numel() == 0; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  // Dimension `i`; negative counts from the end.
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int64_t numel() const { return shape_numel(shape_); }
  // The matrix view every op uses: cols = last dimension, rows = everything before it.
  int64_t cols() const { return shape_.empty() ? 1 : shape_.back(); }
  int64_t rows() const { return cols() == 0 ? 0 : numel() / cols(); }
  // Elements from the start of one row to the start of the next (>= cols()).
  int64_t row_stride() const { return row_stride_; }
  bool contiguous() const { return row_stride_ == cols() || rows() <= 1; }
  int64_t bytes() const { return numel() * dtype_size(dtype_); }

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }

  // Rows [begin, begin + count) of the matrix view; shape [count, cols].
  Tensor row_slice(int64_t begin, int64_t count) const;
  // Columns [begin, begin + count) of the matrix view; shape [rows, count], strided rows.
  Tensor col_slice(int64_t begin, int64_t count) const;
  // Same memory, new shape; requires a contiguous tensor and the same element count.
  Tensor reshape(Shape shape) const;

  // "f32[16, 96] cpu" (plus " stride N" when strided), for error messages.
  std::string describe() const;

 private:
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  Shape shape_;
  int64_t row_stride_ = 0;
};

}  // namespace flux2
