// Tensor views; see tensor.h. Tested by tests/host/tensor_test.cc.
#include "kernels/base/tensor.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/base/status.h"

namespace flux2 {

absl::string_view device_name(Device device) {
  return device == Device::kCpu ? "cpu" : "cuda";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

Tensor::Tensor(std::shared_ptr<void> storage, void* data, DType dtype, Device device, Shape shape,
               int64_t row_stride)
    : storage_(std::move(storage)),
      data_(data),
      dtype_(dtype),
      device_(device),
      shape_(std::move(shape)),
      row_stride_(row_stride) {
  FLUX_CHECK(row_stride_ >= cols());
}

Tensor Tensor::borrow(void* data, DType dtype, Device device, Shape shape) {
  const int64_t cols = shape.empty() ? 1 : shape.back();
  return Tensor(nullptr, data, dtype, device, std::move(shape), cols);
}

Tensor Tensor::row_slice(int64_t begin, int64_t count) const {
  FLUX_CHECK(begin >= 0 && count >= 0 && begin + count <= rows());
  char* base = static_cast<char*>(data_) + begin * row_stride_ * dtype_size(dtype_);
  return Tensor(storage_, base, dtype_, device_, Shape{count, cols()}, row_stride_);
}

Tensor Tensor::col_slice(int64_t begin, int64_t count) const {
  FLUX_CHECK(begin >= 0 && count >= 0 && begin + count <= cols());
  char* base = static_cast<char*>(data_) + begin * dtype_size(dtype_);
  return Tensor(storage_, base, dtype_, device_, Shape{rows(), count}, row_stride_);
}

Tensor Tensor::reshape(Shape shape) const {
  FLUX_CHECK(contiguous());
  FLUX_CHECK(shape_numel(shape) == numel());
  const int64_t cols = shape.empty() ? 1 : shape.back();
  return Tensor(storage_, data_, dtype_, device_, std::move(shape), cols);
}

std::string Tensor::describe() const {
  std::string text = absl::StrCat(absl::AsciiStrToLower(dtype_name(dtype_)), shape_string(shape_),
                                  " ", device_name(device_));
  if (!contiguous()) absl::StrAppend(&text, " stride ", row_stride_);
  return text;
}

}  // namespace flux2
