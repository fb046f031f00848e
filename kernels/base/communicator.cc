// Argument checks shared by the Communicator implementations; see communicator.h.
// Tested by tests/host/sequence_parallel_test.cc (InProcessCommunicator cases).
#include "kernels/base/communicator.h"

#include "absl/strings/str_cat.h"

namespace flux2 {

absl::Status check_collective_tensors(const char* collective, const char* name,
                                      const std::vector<Tensor>& tensors, int count, DType dtype,
                                      Device device) {
  if (static_cast<int>(tensors.size()) != count) {
    return absl::InvalidArgumentError(absl::StrCat(collective, ": ", name, " holds ",
                                                   tensors.size(), " tensors for a group of ",
                                                   count, " ranks"));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (t.numel() == 0) continue;
    if (!t.contiguous() || t.dtype() != dtype || t.device() != device) {
      return absl::InvalidArgumentError(
          absl::StrCat(collective, ": ", name, "[", i, "] ", t.describe(), " is not a contiguous ",
                       dtype_name(dtype), " tensor on ", device_name(device)));
    }
  }
  return absl::OkStatus();
}

}  // namespace flux2
