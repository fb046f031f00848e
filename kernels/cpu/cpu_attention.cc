// CpuBackend attention: softmax(q kᵀ · scale + mask) v per head, with grouped-query heads, an
// optional causal mask and a key-length mask. Float32 values, double accumulation for the
// softmax denominator. Tested by tests/host/cpu_ops_test.cc.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/base/parallel.h"
#include "kernels/cpu/cpu_access.h"
#include "kernels/cpu/cpu_backend.h"

namespace flux2 {

absl::Status CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionParams& params, const Tensor& out) {
  constexpr absl::string_view kOp = "attention";
  const int64_t heads = params.num_heads, kv_heads = params.num_kv_heads, dh = params.head_dim;
  if (heads <= 0 || kv_heads <= 0 || dh <= 0 || heads % kv_heads != 0) {
    return op_error(kOp, absl::StrCat("bad head layout: ", heads, " query heads, ", kv_heads,
                                      " kv heads, head dim ", dh));
  }
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "q", q));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "k", k));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "v", v));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(kOp, "out", out));
  const int64_t sq = q.rows(), sk = k.rows();
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "q", q, sq, heads * dh));
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "k", k, sk, kv_heads * dh));
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "v", v, sk, kv_heads * dh));
  FLUX_RETURN_IF_ERROR(check_matrix(kOp, "out", out, sq, heads * dh));
  const int64_t valid_keys = params.num_valid_keys < 0 ? sk : std::min(sk, params.num_valid_keys);
  const int64_t group = heads / kv_heads;

  parallel_for(heads * sq, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(sk));
    std::vector<double> acc(static_cast<size_t>(dh));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / sq, i = item % sq, kvh = h / group;
      const float* qi = cpu::row(q, i) + h * dh;
      const int64_t last = params.causal ? std::min(valid_keys, i + 1) : valid_keys;
      float max_score = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < last; ++j) {
        const float* kj = cpu::row(k, j) + kvh * dh;
        float dot = 0.0f;
        for (int64_t d = 0; d < dh; ++d) dot += qi[d] * kj[d];
        scores[j] = dot * params.scale;
        max_score = std::max(max_score, scores[j]);
      }
      double denominator = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < last; ++j) {
        const float p = std::exp(scores[j] - max_score);
        denominator += p;
        const float* vj = cpu::row(v, j) + kvh * dh;
        for (int64_t d = 0; d < dh; ++d) acc[d] += static_cast<double>(p) * vj[d];
      }
      float* o = cpu::row(out, i) + h * dh;
      for (int64_t d = 0; d < dh; ++d) {
        o[d] = last > 0 ? static_cast<float>(acc[d] / denominator) : 0.0f;
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace flux2
