// CpuBackend attention: softmax(q kᵀ · scale + mask) v per head, with grouped-query heads, an
// optional causal mask and a key-length mask. Float32 values, double accumulation for the
// softmax denominator. At quality=high the transformer's attention (non-causal, unmasked)
// emulates the CUDA backend's FP8 attention: Q, K and V in E4M3 per head and 128 tokens, the
// probabilities rounded to E4M3 (cpu_fp8.h); with cached keys (klein-KV) each key segment is
// quantized on its own (kernels/base/fp8_attention_keys.h). Tested by tests/host/cpu_ops_test.cc
// and tests/host/attention_cached_keys_test.cc.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/base/parallel.h"
#include "kernels/cpu/cpu_access.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_fp8.h"

namespace flux2 {

absl::Status CpuBackend::check_attention(absl::string_view op, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const AttentionParams& params,
                                         const Tensor& out) {
  const int64_t heads = params.num_heads, kv_heads = params.num_kv_heads, dh = params.head_dim;
  if (heads <= 0 || kv_heads <= 0 || dh <= 0 || heads % kv_heads != 0) {
    return op_error(op, absl::StrCat("bad head layout: ", heads, " query heads, ", kv_heads,
                                     " kv heads, head dim ", dh));
  }
  FLUX_RETURN_IF_ERROR(cpu::check_f32(op, "q", q));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(op, "k", k));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(op, "v", v));
  FLUX_RETURN_IF_ERROR(cpu::check_f32(op, "out", out));
  const int64_t sq = q.rows(), sk = k.rows();
  FLUX_RETURN_IF_ERROR(check_matrix(op, "q", q, sq, heads * dh));
  FLUX_RETURN_IF_ERROR(check_matrix(op, "k", k, sk, kv_heads * dh));
  FLUX_RETURN_IF_ERROR(check_matrix(op, "v", v, sk, kv_heads * dh));
  return check_matrix(op, "out", out, sq, heads * dh);
}

bool CpuBackend::emulates_fp8_attention(const AttentionParams& params) const {
  return request().quality == Quality::kHigh && !params.causal && params.num_valid_keys < 0;
}

absl::StatusOr<Tensor> CpuBackend::fp8_attention_operand(const Tensor& t, int64_t head_dim,
                                                         bool value) {
  FLUX_ASSIGN_OR_RETURN(Tensor copy, empty(DType::kF32, {t.rows(), t.cols()}));
  cpu::quantize_head_blocks_e4m3(t, head_dim, /*power_of_two=*/value, copy);
  return copy;
}

absl::Status CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionParams& params, const Tensor& out) {
  FLUX_RETURN_IF_ERROR(check_attention("attention", q, k, v, params, out));
  const int64_t sk = k.rows();
  const int64_t valid_keys = params.num_valid_keys < 0 ? sk : std::min(sk, params.num_valid_keys);
  if (!emulates_fp8_attention(params)) {
    return attention_rows(q, k, v, params, out, valid_keys, false);
  }
  // quality=high: the operands the FP8 kernel reads, then P rounded as it rounds P.
  const int64_t dh = params.head_dim;
  FLUX_ASSIGN_OR_RETURN(Tensor q8, fp8_attention_operand(q, dh, false));
  FLUX_ASSIGN_OR_RETURN(Tensor k8, fp8_attention_operand(k, dh, false));
  FLUX_ASSIGN_OR_RETURN(Tensor v8, fp8_attention_operand(v, dh, true));
  return attention_rows(q8, k8, v8, params, out, valid_keys, true);
}

absl::Status CpuBackend::attention_with_cached_keys(const Tensor& q, const Tensor& k,
                                                    const Tensor& v, const CachedKeys& cached,
                                                    const Tensor& k_room, const Tensor& v_room,
                                                    const AttentionParams& params,
                                                    const Tensor& out) {
  if (!emulates_fp8_attention(params)) {
    return Backend::attention_with_cached_keys(q, k, v, cached, k_room, v_room, params, out);
  }
  constexpr absl::string_view kOp = "attention_with_cached_keys";
  FLUX_RETURN_IF_ERROR(check_cached_keys_layout(k, v, cached, k_room, v_room));
  const auto* plain = dynamic_cast<const PlainCachedKeys*>(&cached);
  if (plain == nullptr) return op_error(kOp, "the cache was not made by this backend's cache_keys");
  FLUX_RETURN_IF_ERROR(check_attention(kOp, q, k_room, v_room, params, out));
  // quality=high: [own keys ; cached keys], each segment quantized per head and 128 keys from its
  // own first row, as the FP8 kernel reads them (the room's rows are not needed).
  const int64_t dh = params.head_dim, s = k.rows(), r = cached.rows();
  FLUX_ASSIGN_OR_RETURN(Tensor q8, fp8_attention_operand(q, dh, false));
  FLUX_ASSIGN_OR_RETURN(Tensor k8, empty(DType::kF32, {s + r, k.cols()}));
  FLUX_ASSIGN_OR_RETURN(Tensor v8, empty(DType::kF32, {s + r, v.cols()}));
  cpu::quantize_head_blocks_e4m3(k, dh, false, k8.row_slice(0, s));
  cpu::quantize_head_blocks_e4m3(plain->k, dh, false, k8.row_slice(s, r));
  cpu::quantize_head_blocks_e4m3(v, dh, true, v8.row_slice(0, s));
  cpu::quantize_head_blocks_e4m3(plain->v, dh, true, v8.row_slice(s, r));
  return attention_rows(q8, k8, v8, params, out, s + r, true);
}

absl::Status CpuBackend::attention_rows(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const AttentionParams& params, const Tensor& out,
                                        int64_t valid_keys, bool fp8_probabilities) {
  const int64_t heads = params.num_heads, dh = params.head_dim, sq = q.rows(), sk = k.rows();
  const int64_t group = heads / params.num_kv_heads;

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
        const float weight = fp8_probabilities ? cpu::round_probability_e4m3(p) : p;
        const float* vj = cpu::row(v, j) + kvh * dh;
        for (int64_t d = 0; d < dh; ++d) acc[d] += static_cast<double>(weight) * vj[d];
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
