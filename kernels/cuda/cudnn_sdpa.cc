// cuDNN SDPA plans through the backend API (one SDPA_FWD operation); see cudnn_sdpa.h. Tensors
// are (b, h, s, d) with token-major strides so Q, K and V are read straight out of fused
// projection buffers. Tested by tests/cuda/op_cases.cc (gpu_op_test) (vs the CPU reference).
#include "kernels/cuda/cudnn_sdpa.h"

#include <cudnn.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/cudnn_graph.h"

namespace flux2::cuda {
namespace {
enum TensorId : int64_t { kQ = 1, kK, kV, kO, kScale };
}  // namespace

struct CudnnSdpa::Plan : dnn::OwnedPlan {};

absl::StatusOr<std::unique_ptr<CudnnSdpa>> CudnnSdpa::create(cudaStream_t stream) {
  std::unique_ptr<CudnnSdpa> sdpa(new CudnnSdpa());
  FLUX_ASSIGN_OR_RETURN(cudnnHandle_t handle, dnn::create_handle(stream));
  sdpa->handle_ = handle;
  return sdpa;
}

CudnnSdpa::~CudnnSdpa() {
  plans_.clear();
  if (handle_ != nullptr) cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

bool CudnnSdpa::supports(const Mat& q, const Mat& k, const Mat& v, const AttentionParams& params,
                         const Mat& out) {
  const int64_t d = params.head_dim;
  const bool aligned = rows_aligned16(q, 2) && rows_aligned16(k, 2) && rows_aligned16(v, 2) &&
                       rows_aligned16(out, 2);
  return !params.causal && (params.num_valid_keys < 0 || params.num_valid_keys >= k.rows) &&
         d % 8 == 0 && d <= 256 && params.num_heads % params.num_kv_heads == 0 && aligned &&
         q.rows > 0 && k.rows > 0;
}

absl::StatusOr<CudnnSdpa::Plan*> CudnnSdpa::plan(const Key& key) {
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second.get();
  const auto [s_q, s_kv, heads, kv_heads, d, q_stride, k_stride, v_stride, o_stride] = key;
  auto plan = std::make_unique<Plan>();
  auto tensor = [&](int64_t id, int64_t h, int64_t s, int64_t row_stride) {
    dnn::TensorSpec spec{
        id, CUDNN_DATA_BFLOAT16, {1, h, s, d}, {s * row_stride, d, row_stride, 1}};  // (b, s, h, d)
    return dnn::make_tensor(spec);
  };
  FLUX_ASSIGN_OR_RETURN(dnn::Descriptor q, tensor(kQ, heads, s_q, q_stride));
  FLUX_ASSIGN_OR_RETURN(dnn::Descriptor k, tensor(kK, kv_heads, s_kv, k_stride));
  FLUX_ASSIGN_OR_RETURN(dnn::Descriptor v, tensor(kV, kv_heads, s_kv, v_stride));
  FLUX_ASSIGN_OR_RETURN(dnn::Descriptor o, tensor(kO, heads, s_q, o_stride));
  dnn::TensorSpec scale_spec;
  scale_spec.id = kScale;
  scale_spec.by_value = true;
  FLUX_ASSIGN_OR_RETURN(dnn::Descriptor scale, dnn::make_tensor(scale_spec));

  dnn::Descriptor op(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR);
  FLUX_RETURN_IF_ERROR(dnn::check(op.created(), "create SDPA operation (cuDNN >= 9.13 needed)"));
  FLUX_RETURN_IF_ERROR(op.set(CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, q));
  FLUX_RETURN_IF_ERROR(op.set(CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, k));
  FLUX_RETURN_IF_ERROR(op.set(CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, v));
  FLUX_RETURN_IF_ERROR(op.set(CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, o));
  FLUX_RETURN_IF_ERROR(op.set(CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, scale));
  FLUX_RETURN_IF_ERROR(op.finalize());
  FLUX_ASSIGN_OR_RETURN(plan->exec, dnn::build_plan(static_cast<cudnnHandle_t>(handle_), {&op}));
  FLUX_RETURN_IF_ERROR(plan->allocate_workspace());
  for (dnn::Descriptor* d : {&q, &k, &v, &o, &scale, &op})
    plan->keep_alive.push_back(std::move(*d));
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status CudnnSdpa::run(const Mat& q, const Mat& k, const Mat& v, const AttentionParams& params,
                            const Mat& out) {
  if (!supports(q, k, v, params, out))
    return absl::UnimplementedError("cuDNN SDPA does not support this shape");
  const Key key{q.rows,   k.rows,   params.num_heads, params.num_kv_heads, params.head_dim,
                q.stride, k.stride, v.stride,         out.stride};
  FLUX_ASSIGN_OR_RETURN(Plan * p, plan(key));
  float scale = params.scale;
  return dnn::execute(static_cast<cudnnHandle_t>(handle_), p->exec.plan, {kQ, kK, kV, kO, kScale},
                      {q.data, k.data, v.data, out.data, &scale}, p->workspace);
}

}  // namespace flux2::cuda
