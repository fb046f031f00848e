// Small RAII helpers for cuDNN's backend (graph) API, shared by the SDPA plans and the
// convolutions: an owned descriptor, tensor descriptors, and "first engine config that finalizes"
// plans. Exercised through tests/cuda/op_cases.cc (gpu_op_test).
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <deque>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace flux2::cuda::dnn {

absl::Status check(cudnnStatus_t status, const char* what);

// Owns one backend descriptor.
class Descriptor {
 public:
  Descriptor() = default;
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    status_ = cudnnBackendCreateDescriptor(type, &desc_);
  }
  Descriptor(Descriptor&& other) noexcept : desc_(other.desc_), status_(other.status_) {
    other.desc_ = nullptr;
  }
  Descriptor& operator=(Descriptor&& other) noexcept {
    std::swap(desc_, other.desc_);
    std::swap(status_, other.status_);
    return *this;
  }
  ~Descriptor() {
    if (desc_ != nullptr) cudnnBackendDestroyDescriptor(desc_);
  }
  cudnnBackendDescriptor_t get() const { return desc_; }
  cudnnStatus_t created() const { return status_; }

  template <typename T>
  absl::Status set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                   const T* values, int64_t count) {
    return check(cudnnBackendSetAttribute(desc_, name, type, count, values), "set attribute");
  }
  // Sets a descriptor-valued attribute.
  absl::Status set(cudnnBackendAttributeName_t name, const Descriptor& value) {
    const cudnnBackendDescriptor_t raw = value.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw, 1);
  }
  absl::Status finalize() { return check(cudnnBackendFinalize(desc_), "finalize"); }

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
  cudnnStatus_t status_ = CUDNN_STATUS_SUCCESS;
};

struct TensorSpec {
  int64_t id = 0;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int64_t dims[4] = {1, 1, 1, 1};
  int64_t strides[4] = {1, 1, 1, 1};
  bool is_virtual = false;  // an intermediate inside the fused graph (never in memory)
  bool by_value = false;    // a host scalar passed in the variant pack
};
absl::StatusOr<Descriptor> make_tensor(const TensorSpec& spec);

// A finalized execution plan for one operation graph: the first engine config of heuristic mode A
// that finalizes and is not noted nondeterministic, with its workspace size.
struct ExecutionPlan {
  std::vector<Descriptor> keep_alive;  // graph and engine configs
  Descriptor plan;
  int64_t workspace_bytes = 0;
  int64_t engine_index = -1;  // cuDNN's global engine index (for logs)
};
absl::StatusOr<ExecutionPlan> build_plan(cudnnHandle_t handle,
                                         const std::vector<const Descriptor*>& operations);

// An execution plan, the descriptors it was built from and its device workspace.
struct OwnedPlan {
  std::deque<Descriptor> keep_alive;  // tensors and operations (a deque: pointers stay valid)
  ExecutionPlan exec;
  void* workspace = nullptr;
  OwnedPlan() = default;
  OwnedPlan(const OwnedPlan&) = delete;
  OwnedPlan& operator=(const OwnedPlan&) = delete;
  ~OwnedPlan();
  // Allocates exec.workspace_bytes of device memory (none when 0).
  absl::Status allocate_workspace();
};

// A cuDNN handle whose work goes to `stream`.
absl::StatusOr<cudnnHandle_t> create_handle(cudaStream_t stream);

// Runs `plan` with (unique id, data pointer) pairs and a workspace.
absl::Status execute(cudnnHandle_t handle, const Descriptor& plan, const std::vector<int64_t>& ids,
                     const std::vector<void*>& pointers, void* workspace);

}  // namespace flux2::cuda::dnn
