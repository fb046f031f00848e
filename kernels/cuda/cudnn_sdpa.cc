// cuDNN SDPA plans through the backend API; see cudnn_sdpa.h. Every descriptor is created,
// configured with cudnnBackendSetAttribute and finalized; tensors are (b, h, s, d) with
// token-major strides so Q, K and V are read straight out of fused projection buffers.
#include "kernels/cuda/cudnn_sdpa.h"

#include <cudnn.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "kernels/cuda/cuda_status.h"

namespace flux2::cuda {
namespace {

constexpr int kMaxEngineConfigs = 16;
enum TensorId : int64_t { kQ = 1, kK, kV, kO, kScale };

absl::Status dnn_status(cudnnStatus_t status, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuDNN ", what, ": ", cudnnGetErrorString(status)));
}

// Owns one backend descriptor.
class Descriptor {
 public:
  Descriptor() = default;
  explicit Descriptor(cudnnBackendDescriptorType_t type) { status_ = cudnnBackendCreateDescriptor(type, &desc_); }
  Descriptor(Descriptor&& other) noexcept : desc_(other.desc_), status_(other.status_) { other.desc_ = nullptr; }
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
  absl::Status set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T* values, int64_t count) {
    return dnn_status(cudnnBackendSetAttribute(desc_, name, type, count, values), "set attribute");
  }
  absl::Status finalize() { return dnn_status(cudnnBackendFinalize(desc_), "finalize"); }

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
  cudnnStatus_t status_ = CUDNN_STATUS_SUCCESS;
};

absl::StatusOr<Descriptor> make_tensor(int64_t id, cudnnDataType_t type, const int64_t dims[4], const int64_t strides[4],
                                       bool by_value) {
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  FLUX_RETURN_IF_ERROR(dnn_status(t.created(), "create tensor"));
  const int64_t alignment = 16;
  FLUX_RETURN_IF_ERROR(t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type, 1));
  FLUX_RETURN_IF_ERROR(t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims, 4));
  FLUX_RETURN_IF_ERROR(t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides, 4));
  FLUX_RETURN_IF_ERROR(t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &id, 1));
  FLUX_RETURN_IF_ERROR(t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment, 1));
  if (by_value) {
    const bool yes = true;
    FLUX_RETURN_IF_ERROR(t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &yes, 1));
  }
  FLUX_RETURN_IF_ERROR(t.finalize());
  return t;
}

}  // namespace

struct CudnnSdpa::Plan {
  std::vector<Descriptor> keep_alive;  // tensors, operation, graph, engine configs
  Descriptor plan;
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  ~Plan() {
    if (workspace != nullptr) cudaFree(workspace);
  }
};

absl::StatusOr<std::unique_ptr<CudnnSdpa>> CudnnSdpa::create(cudaStream_t stream) {
  std::unique_ptr<CudnnSdpa> sdpa(new CudnnSdpa());
  cudnnHandle_t handle;
  FLUX_RETURN_IF_ERROR(dnn_status(cudnnCreate(&handle), "create handle"));
  sdpa->handle_ = handle;
  FLUX_RETURN_IF_ERROR(dnn_status(cudnnSetStream(handle, stream), "set stream"));
  return sdpa;
}

CudnnSdpa::~CudnnSdpa() {
  plans_.clear();
  if (handle_ != nullptr) cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

bool CudnnSdpa::supports(const Mat& q, const Mat& k, const Mat& v, const AttentionParams& params, const Mat& out) {
  const int64_t d = params.head_dim;
  const bool aligned = rows_aligned16(q, 2) && rows_aligned16(k, 2) && rows_aligned16(v, 2) && rows_aligned16(out, 2);
  return !params.causal && (params.num_valid_keys < 0 || params.num_valid_keys >= k.rows) && d % 8 == 0 &&
         d <= 256 && params.num_heads % params.num_kv_heads == 0 && aligned && q.rows > 0 && k.rows > 0;
}

absl::StatusOr<CudnnSdpa::Plan*> CudnnSdpa::plan(const Key& key) {
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second.get();
  const auto [s_q, s_kv, heads, kv_heads, d, q_stride, k_stride, v_stride, o_stride] = key;
  auto plan = std::make_unique<Plan>();
  auto tensor = [&](int64_t id, int64_t h, int64_t s, int64_t row_stride) -> absl::StatusOr<Descriptor> {
    const int64_t dims[4] = {1, h, s, d};
    const int64_t strides[4] = {s * row_stride, d, row_stride, 1};  // token-major (b, s, h, d)
    return make_tensor(id, CUDNN_DATA_BFLOAT16, dims, strides, false);
  };
  FLUX_ASSIGN_OR_RETURN(Descriptor q, tensor(kQ, heads, s_q, q_stride));
  FLUX_ASSIGN_OR_RETURN(Descriptor k, tensor(kK, kv_heads, s_kv, k_stride));
  FLUX_ASSIGN_OR_RETURN(Descriptor v, tensor(kV, kv_heads, s_kv, v_stride));
  FLUX_ASSIGN_OR_RETURN(Descriptor o, tensor(kO, heads, s_q, o_stride));
  const int64_t ones[4] = {1, 1, 1, 1};
  FLUX_ASSIGN_OR_RETURN(Descriptor scale, make_tensor(kScale, CUDNN_DATA_FLOAT, ones, ones, true));

  Descriptor op(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR);
  FLUX_RETURN_IF_ERROR(dnn_status(op.created(), "create SDPA operation (cuDNN >= 9.13 needed)"));
  auto set_desc = [&](cudnnBackendAttributeName_t name, const Descriptor& t) {
    const cudnnBackendDescriptor_t raw = t.get();
    return op.set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw, 1);
  };
  FLUX_RETURN_IF_ERROR(set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, q));
  FLUX_RETURN_IF_ERROR(set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, k));
  FLUX_RETURN_IF_ERROR(set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, v));
  FLUX_RETURN_IF_ERROR(set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, o));
  FLUX_RETURN_IF_ERROR(set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, scale));
  FLUX_RETURN_IF_ERROR(op.finalize());

  cudnnHandle_t handle = static_cast<cudnnHandle_t>(handle_);
  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  FLUX_RETURN_IF_ERROR(dnn_status(graph.created(), "create graph"));
  FLUX_RETURN_IF_ERROR(graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle, 1));
  const cudnnBackendDescriptor_t op_raw = op.get();
  FLUX_RETURN_IF_ERROR(graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, &op_raw, 1));
  FLUX_RETURN_IF_ERROR(graph.finalize());

  Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  FLUX_RETURN_IF_ERROR(dnn_status(heuristics.created(), "create heuristics"));
  const cudnnBackendDescriptor_t graph_raw = graph.get();
  FLUX_RETURN_IF_ERROR(heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, &graph_raw, 1));
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  FLUX_RETURN_IF_ERROR(heuristics.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode, 1));
  FLUX_RETURN_IF_ERROR(heuristics.finalize());

  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> config_raw;
  for (int i = 0; i < kMaxEngineConfigs; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    FLUX_RETURN_IF_ERROR(dnn_status(configs.back().created(), "create engine config"));
    config_raw.push_back(configs.back().get());
  }
  int64_t returned = 0;
  FLUX_RETURN_IF_ERROR(dnn_status(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, kMaxEngineConfigs,
                                                           &returned, config_raw.data()),
                                  "heuristic results"));
  absl::Status last = absl::UnimplementedError("cuDNN returned no engine for this SDPA shape");
  for (int64_t i = 0; i < returned; ++i) {
    Descriptor candidate(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    if (!candidate.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle, 1).ok()) continue;
    if (!candidate.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, &config_raw[i], 1).ok()) {
      continue;
    }
    last = candidate.finalize();
    if (!last.ok()) continue;
    int64_t count = 0;
    FLUX_RETURN_IF_ERROR(dnn_status(cudnnBackendGetAttribute(candidate.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                             CUDNN_TYPE_INT64, 1, &count, &plan->workspace_bytes),
                                    "workspace size"));
    plan->plan = std::move(candidate);
    break;
  }
  if (plan->plan.get() == nullptr) {
    return absl::UnimplementedError(absl::StrCat("no cuDNN SDPA engine finalized: ", last.message()));
  }
  if (plan->workspace_bytes > 0) {
    FLUX_RETURN_IF_ERROR(cuda_status(cudaMalloc(&plan->workspace, plan->workspace_bytes), "SDPA workspace"));
  }
  plan->keep_alive.push_back(std::move(q));
  plan->keep_alive.push_back(std::move(k));
  plan->keep_alive.push_back(std::move(v));
  plan->keep_alive.push_back(std::move(o));
  plan->keep_alive.push_back(std::move(scale));
  plan->keep_alive.push_back(std::move(op));
  plan->keep_alive.push_back(std::move(graph));
  for (Descriptor& c : configs) plan->keep_alive.push_back(std::move(c));
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status CudnnSdpa::run(const Mat& q, const Mat& k, const Mat& v, const AttentionParams& params, const Mat& out) {
  if (!supports(q, k, v, params, out)) return absl::UnimplementedError("cuDNN SDPA does not support this shape");
  const Key key{q.rows, k.rows, params.num_heads, params.num_kv_heads, params.head_dim,
                q.stride, k.stride, v.stride, out.stride};
  FLUX_ASSIGN_OR_RETURN(Plan* p, plan(key));
  float scale = params.scale;
  int64_t ids[5] = {kQ, kK, kV, kO, kScale};
  void* pointers[5] = {q.data, k.data, v.data, out.data, &scale};
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  FLUX_RETURN_IF_ERROR(dnn_status(pack.created(), "create variant pack"));
  FLUX_RETURN_IF_ERROR(pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, ids, 5));
  FLUX_RETURN_IF_ERROR(pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers, 5));
  FLUX_RETURN_IF_ERROR(pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &p->workspace, 1));
  FLUX_RETURN_IF_ERROR(pack.finalize());
  return dnn_status(cudnnBackendExecute(static_cast<cudnnHandle_t>(handle_), p->plan.get(), pack.get()), "execute SDPA");
}

}  // namespace flux2::cuda
