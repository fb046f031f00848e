// FP8 attention plans through cuDNN's backend API; see cudnn_sdpa_fp8.h. The graph is the one
// cudnn-frontend's composite SDPA node builds for per-tensor FP8 scaling (inference, no mask):
//   S = (Q·Kᵀ)·attn_scale·descale_q·descale_k;  P = softmax(S) (max, sub, exp, sum, div, with the
//   log-sum-exp stats as a virtual output);  amax_s = max|P|;  P8 = E4M3(P·scale_s);
//   O = (P8·V)·descale_s·descale_v;  amax_o = max|O|;  O8 = E4M3(O·scale_o).
#include "kernels/cuda/cudnn_sdpa_fp8.h"

#include <cudnn.h>

#include <cstdio>
#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/cudnn_graph.h"
#include "kernels/cuda/quantize.h"

namespace flux2::cuda {
namespace {

// Tensors bound in the variant pack; virtual intermediates take ids from kFirstVirtual on.
enum TensorId : int64_t {
  kQ = 1,
  kKt,
  kV,
  kO,
  kAttnScale,
  kDescaleQ,
  kDescaleK,
  kDescaleV,
  kDescaleS,
  kScaleS,
  kScaleO,
  kAmaxS,
  kAmaxO,
  kFirstVirtual = 100,
};

// Builds the operation list of one graph; owns every descriptor it creates.
class GraphBuilder {
 public:
  std::deque<dnn::Descriptor> descriptors;  // a deque: pointers to its elements stay valid
  std::vector<const dnn::Descriptor*> operations;

  absl::StatusOr<const dnn::Descriptor*> tensor(const dnn::TensorSpec& spec) {
    FLUX_ASSIGN_OR_RETURN(dnn::Descriptor t, dnn::make_tensor(spec));
    return keep(std::move(t));
  }
  // A virtual fp32 intermediate of dims (1, h, s_q, cols), row-major.
  absl::StatusOr<const dnn::Descriptor*> intermediate(int64_t h, int64_t s_q, int64_t cols,
                                                      cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    dnn::TensorSpec spec{
        next_virtual_++, type, {1, h, s_q, cols}, {h * s_q * cols, s_q * cols, cols, 1}, true};
    return tensor(spec);
  }
  // A device fp32 scalar (1, 1, 1, 1), or a host one passed by value.
  absl::StatusOr<const dnn::Descriptor*> scalar(int64_t id, bool by_value = false) {
    dnn::TensorSpec spec;
    spec.id = id;
    spec.by_value = by_value;
    return tensor(spec);
  }

  absl::Status matmul(const dnn::Descriptor* a, const dnn::Descriptor* b,
                      const dnn::Descriptor* c) {
    dnn::Descriptor desc(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    FLUX_RETURN_IF_ERROR(dnn::check(desc.created(), "create matmul"));
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    FLUX_RETURN_IF_ERROR(desc.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute, 1));
    FLUX_RETURN_IF_ERROR(desc.finalize());
    dnn::Descriptor op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    FLUX_RETURN_IF_ERROR(dnn::check(op.created(), "create matmul operation"));
    FLUX_RETURN_IF_ERROR(op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, *a));
    FLUX_RETURN_IF_ERROR(op.set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, *b));
    FLUX_RETURN_IF_ERROR(op.set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, *c));
    FLUX_RETURN_IF_ERROR(op.set(CUDNN_ATTR_OPERATION_MATMUL_DESC, desc));
    FLUX_RETURN_IF_ERROR(op.finalize());
    keep(std::move(desc));
    operations.push_back(keep(std::move(op)));
    return absl::OkStatus();
  }

  // y = x (mode) b; b == nullptr for unary modes.
  absl::Status pointwise(cudnnPointwiseMode_t mode, const dnn::Descriptor* x,
                         const dnn::Descriptor* b, const dnn::Descriptor* y) {
    dnn::Descriptor desc(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    FLUX_RETURN_IF_ERROR(dnn::check(desc.created(), "create pointwise"));
    const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
    FLUX_RETURN_IF_ERROR(desc.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode, 1));
    FLUX_RETURN_IF_ERROR(
        desc.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &precision, 1));
    FLUX_RETURN_IF_ERROR(desc.finalize());
    dnn::Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    FLUX_RETURN_IF_ERROR(dnn::check(op.created(), "create pointwise operation"));
    FLUX_RETURN_IF_ERROR(op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, desc));
    FLUX_RETURN_IF_ERROR(op.set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *x));
    if (b != nullptr) FLUX_RETURN_IF_ERROR(op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b));
    FLUX_RETURN_IF_ERROR(op.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, *y));
    FLUX_RETURN_IF_ERROR(op.finalize());
    keep(std::move(desc));
    operations.push_back(keep(std::move(op)));
    return absl::OkStatus();
  }

  absl::Status reduction(cudnnReduceTensorOp_t mode, const dnn::Descriptor* x,
                         const dnn::Descriptor* y) {
    dnn::Descriptor desc(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    FLUX_RETURN_IF_ERROR(dnn::check(desc.created(), "create reduction"));
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    FLUX_RETURN_IF_ERROR(
        desc.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &mode, 1));
    FLUX_RETURN_IF_ERROR(
        desc.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute, 1));
    FLUX_RETURN_IF_ERROR(desc.finalize());
    dnn::Descriptor op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    FLUX_RETURN_IF_ERROR(dnn::check(op.created(), "create reduction operation"));
    FLUX_RETURN_IF_ERROR(op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, *x));
    FLUX_RETURN_IF_ERROR(op.set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, *y));
    FLUX_RETURN_IF_ERROR(op.set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, desc));
    FLUX_RETURN_IF_ERROR(op.finalize());
    keep(std::move(desc));
    operations.push_back(keep(std::move(op)));
    return absl::OkStatus();
  }

 private:
  const dnn::Descriptor* keep(dnn::Descriptor d) {
    descriptors.push_back(std::move(d));
    return &descriptors.back();
  }
  int64_t next_virtual_ = kFirstVirtual;
};

}  // namespace

struct CudnnSdpaFp8::Plan : dnn::OwnedPlan {
  bool deterministic = false;  // two runs on the same inputs gave the same bits
};

absl::StatusOr<std::unique_ptr<CudnnSdpaFp8>> CudnnSdpaFp8::create(cudaStream_t stream) {
  std::unique_ptr<CudnnSdpaFp8> sdpa(new CudnnSdpaFp8());
  FLUX_ASSIGN_OR_RETURN(cudnnHandle_t handle, dnn::create_handle(stream));
  sdpa->handle_ = handle;
  sdpa->stream_ = stream;
  return sdpa;
}

CudnnSdpaFp8::~CudnnSdpaFp8() {
  plans_.clear();
  if (handle_ != nullptr) cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

bool CudnnSdpaFp8::supports(const AttentionParams& params, int64_t s_q, int64_t s_kv) {
  const int64_t d = params.head_dim;
  return !params.causal && (params.num_valid_keys < 0 || params.num_valid_keys >= s_kv) &&
         d % 16 == 0 && d <= 256 && params.num_heads == params.num_kv_heads && s_q > 0 && s_kv > 0;
}

absl::StatusOr<CudnnSdpaFp8::Plan*> CudnnSdpaFp8::plan(const Key& key) {
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second.get();
  const auto [s_q, s_kv, h, d, q_stride, k_stride, v_stride, o_stride] = key;
  GraphBuilder g;
  auto io = [&](int64_t id, int64_t s, int64_t row_stride, bool transposed) {
    dnn::TensorSpec spec{id, CUDNN_DATA_FP8_E4M3, {1, h, s, d}, {s * row_stride, d, row_stride, 1}};
    if (transposed) {  // Kᵀ: dims (b, h, d, s) over the same memory
      std::swap(spec.dims[2], spec.dims[3]);
      std::swap(spec.strides[2], spec.strides[3]);
    }
    return g.tensor(spec);
  };
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* q, io(kQ, s_q, q_stride, false));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* kt, io(kKt, s_kv, k_stride, true));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* v, io(kV, s_kv, v_stride, false));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* o, io(kO, s_q, o_stride, false));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* attn_scale, g.scalar(kAttnScale, /*by_value=*/true));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* descale_q, g.scalar(kDescaleQ));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* descale_k, g.scalar(kDescaleK));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* descale_v, g.scalar(kDescaleV));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* descale_s, g.scalar(kDescaleS));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* scale_s, g.scalar(kScaleS));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* scale_o, g.scalar(kScaleO));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* amax_s, g.scalar(kAmaxS));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* amax_o, g.scalar(kAmaxO));

  // Scores and their descaling.
  auto scores = [&] { return g.intermediate(h, s_q, s_kv); };
  auto per_row = [&] { return g.intermediate(h, s_q, 1); };
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* qk, scores());
  FLUX_RETURN_IF_ERROR(g.matmul(q, kt, qk));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* scaled, scores());
  FLUX_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_MUL, qk, attn_scale, scaled));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* descaled_q, scores());
  FLUX_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_MUL, scaled, descale_q, descaled_q));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* logits, scores());
  FLUX_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_MUL, descaled_q, descale_k, logits));
  // Softmax: max, sub, exp, sum, (stats = max + log sum), div. Nothing reads the stats, but
  // cuDNN 9.14 offers no engine for the graph without them (PERF_NOTES run 26).
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* row_max, per_row());
  FLUX_RETURN_IF_ERROR(g.reduction(CUDNN_REDUCE_TENSOR_MAX, logits, row_max));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* shifted, scores());
  FLUX_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_SUB, logits, row_max, shifted));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* exps, scores());
  FLUX_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, exps));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* row_sum, per_row());
  FLUX_RETURN_IF_ERROR(g.reduction(CUDNN_REDUCE_TENSOR_ADD, exps, row_sum));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* log_sum, per_row());
  FLUX_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_LOG, row_sum, nullptr, log_sum));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* stats, per_row());
  FLUX_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_ADD, row_max, log_sum, stats));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* probs, scores());
  FLUX_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_DIV, exps, row_sum, probs));
  // P to E4M3, P·V, descales, O to E4M3.
  FLUX_RETURN_IF_ERROR(g.reduction(CUDNN_REDUCE_TENSOR_AMAX, probs, amax_s));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* probs8,
                        g.intermediate(h, s_q, s_kv, CUDNN_DATA_FP8_E4M3));
  FLUX_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_MUL, probs, scale_s, probs8));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* pv, g.intermediate(h, s_q, d));
  FLUX_RETURN_IF_ERROR(g.matmul(probs8, v, pv));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* pv_s, g.intermediate(h, s_q, d));
  FLUX_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_MUL, pv, descale_s, pv_s));
  FLUX_ASSIGN_OR_RETURN(const dnn::Descriptor* pv_sv, g.intermediate(h, s_q, d));
  FLUX_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_MUL, pv_s, descale_v, pv_sv));
  FLUX_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_MUL, pv_sv, scale_o, o));
  FLUX_RETURN_IF_ERROR(g.reduction(CUDNN_REDUCE_TENSOR_AMAX, pv_sv, amax_o));

  auto plan = std::make_unique<Plan>();
  FLUX_ASSIGN_OR_RETURN(plan->exec,
                        dnn::build_plan(static_cast<cudnnHandle_t>(handle_), g.operations));
  FLUX_RETURN_IF_ERROR(plan->allocate_workspace());
  plan->keep_alive = std::move(g.descriptors);
  FLUX_ASSIGN_OR_RETURN(plan->deterministic, runs_deterministically(*plan, key));
  std::fprintf(stderr,
               "flux2: FP8 attention plan for %lld x %lld tokens, %lld heads: cuDNN engine %lld, workspace "
               "%lld bytes, %s\n",
               static_cast<long long>(s_q), static_cast<long long>(s_kv), static_cast<long long>(h),
               static_cast<long long>(plan->exec.engine_index), static_cast<long long>(plan->exec.workspace_bytes),
               plan->deterministic ? "deterministic" : "NOT deterministic (bf16 attention serves this shape)");
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

absl::StatusOr<bool> CudnnSdpaFp8::runs_deterministically(Plan& plan, const Key& key) {
  const auto [s_q, s_kv, h, d, q_stride, k_stride, v_stride, o_stride] = key;
  // Device buffers of the shape's extents (E4M3 bytes), random finite codes, plausible scales.
  const int64_t q_bytes = s_q * q_stride, k_bytes = s_kv * k_stride, v_bytes = s_kv * v_stride,
                o_bytes = s_q * o_stride;
  void* buffer = nullptr;
  const int64_t total = q_bytes + k_bytes + v_bytes + 2 * o_bytes + 64;
  FLUX_RETURN_IF_ERROR(
      cuda_status(cudaMallocAsync(&buffer, total, stream_), "FP8 SDPA check buffers"));
  auto at = [&](int64_t offset) { return static_cast<char*>(buffer) + offset; };
  float* scales = reinterpret_cast<float*>(at(q_bytes + k_bytes + v_bytes + 2 * o_bytes));
  const float host_scales[8] = {1.0f / 64, 1.0f / 64, 1.0f / 64, 1.0f / 448,
                                448.0f,    4.0f,      0.0f,      0.0f};
  Fp8AttentionArgs a;
  a.q = Mat{at(0), s_q, h * d, q_stride};
  a.k = Mat{at(q_bytes), s_kv, h * d, k_stride};
  a.v = Mat{at(q_bytes + k_bytes), s_kv, h * d, v_stride};
  a.o = Mat{at(q_bytes + k_bytes + v_bytes), s_q, h * d, o_stride};
  a.descale_q = scales;
  a.descale_k = scales + 1;
  a.descale_v = scales + 2;
  a.descale_s = scales + 3;
  a.scale_s = scales + 4;
  a.scale_o = scales + 5;
  a.amax_s = scales + 6;
  a.amax_o = scales + 7;
  Fp8AttentionArgs again = a;
  again.o.data = at(q_bytes + k_bytes + v_bytes + o_bytes);
  std::vector<uint8_t> first(static_cast<size_t>(o_bytes)), second(first.size());
  absl::Status status = cuda_status(
      cudaMemcpyAsync(scales, host_scales, sizeof(host_scales), cudaMemcpyHostToDevice, stream_),
      "FP8 SDPA check scales");
  if (status.ok()) status = fill_random_e4m3(buffer, q_bytes + k_bytes + v_bytes, 1234, stream_);
  if (status.ok())
    status =
        cuda_status(cudaMemsetAsync(a.o.data, 0, 2 * o_bytes, stream_), "FP8 SDPA check clear");
  if (status.ok()) status = execute(plan, a, 0.0883883f);
  if (status.ok()) status = execute(plan, again, 0.0883883f);
  if (status.ok()) {
    status = cuda_status(
        cudaMemcpyAsync(first.data(), a.o.data, o_bytes, cudaMemcpyDeviceToHost, stream_), "copy");
  }
  if (status.ok()) {
    status = cuda_status(
        cudaMemcpyAsync(second.data(), again.o.data, o_bytes, cudaMemcpyDeviceToHost, stream_),
        "copy");
  }
  cudaFreeAsync(buffer, stream_);
  if (status.ok()) status = cuda_status(cudaStreamSynchronize(stream_), "FP8 SDPA check");
  FLUX_RETURN_IF_ERROR(status);
  return first == second;
}

absl::StatusOr<bool> CudnnSdpaFp8::usable(const Fp8AttentionArgs& args,
                                          const AttentionParams& params) {
  if (!supports(params, args.q.rows, args.k.rows)) return false;
  auto p = plan(key_of(args, params));
  if (absl::IsUnimplemented(p.status())) return false;  // no engine for this shape
  FLUX_RETURN_IF_ERROR(p.status());
  return (*p)->deterministic;
}

CudnnSdpaFp8::Key CudnnSdpaFp8::key_of(const Fp8AttentionArgs& a, const AttentionParams& params) {
  return Key{a.q.rows,   a.k.rows,   params.num_heads, params.head_dim,
             a.q.stride, a.k.stride, a.v.stride,       a.o.stride};
}

absl::Status CudnnSdpaFp8::execute(Plan& p, const Fp8AttentionArgs& a, float attn_scale) {
  auto in = [](const float* x) { return const_cast<float*>(x); };
  return dnn::execute(
      static_cast<cudnnHandle_t>(handle_), p.exec.plan,
      {kQ, kKt, kV, kO, kAttnScale, kDescaleQ, kDescaleK, kDescaleV, kDescaleS, kScaleS, kScaleO,
       kAmaxS, kAmaxO},
      {a.q.data, a.k.data, a.v.data, a.o.data, &attn_scale, in(a.descale_q), in(a.descale_k),
       in(a.descale_v), in(a.descale_s), in(a.scale_s), in(a.scale_o), a.amax_s, a.amax_o},
      p.workspace);
}

absl::Status CudnnSdpaFp8::run(const Fp8AttentionArgs& a, const AttentionParams& params) {
  if (!supports(params, a.q.rows, a.k.rows))
    return absl::UnimplementedError("FP8 SDPA does not support this shape");
  FLUX_ASSIGN_OR_RETURN(Plan * p, plan(key_of(a, params)));
  return execute(*p, a, params.scale);
}

}  // namespace flux2::cuda
