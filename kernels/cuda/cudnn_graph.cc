// cuDNN backend-API helpers; see cudnn_graph.h. Every descriptor is created, configured with
// cudnnBackendSetAttribute and finalized. Exercised through the SDPA tests in tests/cuda/.
#include "kernels/cuda/cudnn_graph.h"

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"

namespace flux2::cuda::dnn {
namespace {
constexpr int kMaxEngineConfigs = 16;
struct EngineNotes {
  int64_t index = -1;
  bool nondeterministic = false;
};

// The engine behind an engine config: its global index and whether cuDNN notes it as
// nondeterministic (atomics across thread blocks).
absl::StatusOr<EngineNotes> engine_notes(cudnnBackendDescriptor_t config) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  FLUX_RETURN_IF_ERROR(check(engine.created(), "create engine"));
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t count = 0;
  FLUX_RETURN_IF_ERROR(
      check(cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &raw),
            "engine of a config"));
  EngineNotes notes;
  FLUX_RETURN_IF_ERROR(check(cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
                                                      CUDNN_TYPE_INT64, 1, &count, &notes.index),
                             "engine index"));
  cudnnBackendNumericalNote_t numerical[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  FLUX_RETURN_IF_ERROR(check(
      cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count, numerical),
      "engine notes"));
  for (int64_t i = 0; i < count; ++i)
    notes.nondeterministic |= numerical[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
  return notes;
}

}  // namespace

absl::Status check(cudnnStatus_t status, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuDNN ", what, ": ", cudnnGetErrorString(status)));
}

absl::StatusOr<Descriptor> make_tensor(const TensorSpec& spec) {
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  FLUX_RETURN_IF_ERROR(check(t.created(), "create tensor"));
  const int64_t alignment = 16;
  FLUX_RETURN_IF_ERROR(t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &spec.type, 1));
  FLUX_RETURN_IF_ERROR(t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, spec.dims, 4));
  FLUX_RETURN_IF_ERROR(t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, spec.strides, 4));
  FLUX_RETURN_IF_ERROR(t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &spec.id, 1));
  FLUX_RETURN_IF_ERROR(t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment, 1));
  const bool yes = true;
  if (spec.is_virtual)
    FLUX_RETURN_IF_ERROR(t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &yes, 1));
  if (spec.by_value)
    FLUX_RETURN_IF_ERROR(t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &yes, 1));
  FLUX_RETURN_IF_ERROR(t.finalize());
  return t;
}

absl::StatusOr<ExecutionPlan> build_plan(cudnnHandle_t handle,
                                         const std::vector<const Descriptor*>& operations) {
  ExecutionPlan result;
  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  FLUX_RETURN_IF_ERROR(check(graph.created(), "create graph"));
  FLUX_RETURN_IF_ERROR(graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle, 1));
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const Descriptor* op : operations) ops.push_back(op->get());
  FLUX_RETURN_IF_ERROR(graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                 ops.data(), static_cast<int64_t>(ops.size())));
  FLUX_RETURN_IF_ERROR(graph.finalize());

  Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  FLUX_RETURN_IF_ERROR(check(heuristics.created(), "create heuristics"));
  FLUX_RETURN_IF_ERROR(heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph));
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  FLUX_RETURN_IF_ERROR(heuristics.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode, 1));
  FLUX_RETURN_IF_ERROR(heuristics.finalize());

  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> config_raw;
  for (int i = 0; i < kMaxEngineConfigs; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    FLUX_RETURN_IF_ERROR(check(configs.back().created(), "create engine config"));
    config_raw.push_back(configs.back().get());
  }
  int64_t returned = 0;
  FLUX_RETURN_IF_ERROR(
      check(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, kMaxEngineConfigs, &returned,
                                     config_raw.data()),
            "heuristic results"));
  absl::Status last = absl::UnimplementedError("cuDNN returned no engine for this graph");
  for (int64_t i = 0; i < returned; ++i) {
    FLUX_ASSIGN_OR_RETURN(const EngineNotes notes, engine_notes(config_raw[i]));
    if (notes.nondeterministic) {  // the same request must give the same bits every time
      last = absl::UnimplementedError(absl::StrCat("engine ", notes.index, " is nondeterministic"));
      continue;
    }
    Descriptor candidate(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    if (!candidate.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle, 1).ok())
      continue;
    if (!candidate
             .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                  &config_raw[i], 1)
             .ok()) {
      continue;
    }
    last = candidate.finalize();
    if (!last.ok()) continue;
    int64_t count = 0;
    FLUX_RETURN_IF_ERROR(
        check(cudnnBackendGetAttribute(candidate.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, &count, &result.workspace_bytes),
              "workspace size"));
    result.plan = std::move(candidate);
    result.engine_index = notes.index;
    break;
  }
  if (result.plan.get() == nullptr) {
    return absl::UnimplementedError(absl::StrCat("no cuDNN engine finalized: ", last.message()));
  }
  result.keep_alive.push_back(std::move(graph));
  for (Descriptor& c : configs) result.keep_alive.push_back(std::move(c));
  return result;
}

OwnedPlan::~OwnedPlan() {
  if (workspace != nullptr) cudaFree(workspace);
}

absl::Status OwnedPlan::allocate_workspace() {
  if (exec.workspace_bytes <= 0 || workspace != nullptr) return absl::OkStatus();
  const cudaError_t error = cudaMalloc(&workspace, exec.workspace_bytes);
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("cuDNN plan workspace: ", cudaGetErrorString(error)));
}

absl::StatusOr<cudnnHandle_t> create_handle(cudaStream_t stream) {
  cudnnHandle_t handle = nullptr;
  FLUX_RETURN_IF_ERROR(check(cudnnCreate(&handle), "create handle"));
  if (absl::Status status = check(cudnnSetStream(handle, stream), "set stream"); !status.ok()) {
    cudnnDestroy(handle);
    return status;
  }
  return handle;
}

absl::Status execute(cudnnHandle_t handle, const Descriptor& plan, const std::vector<int64_t>& ids,
                     const std::vector<void*>& pointers, void* workspace) {
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  FLUX_RETURN_IF_ERROR(check(pack.created(), "create variant pack"));
  const auto count = static_cast<int64_t>(ids.size());
  FLUX_RETURN_IF_ERROR(
      pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, ids.data(), count));
  FLUX_RETURN_IF_ERROR(
      pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers.data(), count));
  FLUX_RETURN_IF_ERROR(
      pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace, 1));
  FLUX_RETURN_IF_ERROR(pack.finalize());
  return check(cudnnBackendExecute(handle, plan.get(), pack.get()), "execute");
}

}  // namespace flux2::cuda::dnn
