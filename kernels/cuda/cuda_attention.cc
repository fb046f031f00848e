// CudaBackend's attention strategy: cuDNN SDPA for the transformer's attention at lossless, our FP8
// flash attention (with QK-norm and RoPE fused into its operand quantizer; any number of keys) at
// quality=high, the plain kernel for what neither serves (the text encoder's causal attention: not
// applicable to either, so not a fallback), and two GEMMs around a row softmax for the VAE's single
// wide head. klein-KV's cached keys: cuda_cached_keys.cc. Tested by tests/cuda/op_cases.cc
// (gpu_op_test), flash_attention_fp8_test.cc, flash_attention_fp8_keys_test.cc and
// fast_path_fallback_test.cc.
#include <algorithm>
#include <optional>
#include <string>

#include "kernels/cuda/attention_fallback.h"
#include "kernels/cuda/attention_fp8_operands.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/cuda_checks.h"
#include "kernels/cuda/flash_attention_fp8.h"
#include "kernels/cuda/softmax.h"

namespace flux2 {

using cuda::check_bf16;
using cuda::CudaPath;

bool CudaBackend::wants_fp8_attention(const AttentionParams& params) const {
  // The FP8 kernel serves the transformer's attention: its joint self-attention and klein-KV's
  // queries over more keys (their own, then the references'), as many keys as any of them has.
  return request().quality == Quality::kHigh && options_.fp8_attention &&
         cuda::cudnn_attention_applies(params);
}

absl::Status CudaBackend::attention_bf16(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const AttentionParams& params, const cuda::Mat& target) {
  OpProfileScope profile(*this, "attention");
  auto plain = [&] {
    return cuda::attention_fallback(mat(q), mat(k), mat(v), params, target, stream());
  };
  if (!cuda::cudnn_attention_applies(params)) return plain();
  return run_path(
      CudaPath::kCudnnAttention,
      cuda::cudnn_attention_unsupported(mat(q), mat(k), mat(v), params, target),
      [&] { return sdpa_->run(mat(q), mat(k), mat(v), params, target); }, plain);
}

absl::Status CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionParams& params, const Tensor& out) {
  FLUX_RETURN_IF_ERROR(check_bf16("attention", "q", q));
  FLUX_RETURN_IF_ERROR(check_bf16("attention", "k", k));
  FLUX_RETURN_IF_ERROR(check_bf16("attention", "v", v));
  FLUX_RETURN_IF_ERROR(check_bf16("attention", "out", out));
  return write_output(out, [&](const cuda::Mat& target) -> absl::Status {
    if (params.num_heads == 1 && params.num_kv_heads == 1 && params.head_dim > 256 &&
        cuda::cudnn_attention_applies(params)) {
      // The VAE's single wide head (beyond cuDNN's head_dim): two GEMMs around a row softmax.
      OpProfileScope profile(*this, "attention");
      return attention_by_gemms(q, k, v, params.scale, target);
    }
    if (!wants_fp8_attention(params)) {
      return attention_bf16(q, k, v, params, target);
    }
    return run_path(
        CudaPath::kFlashAttentionFp8,
        cuda::flash_attention_fp8_unsupported(params, mat(q), mat(k), mat(v)),
        [&] { return attention_flash_fp8(q, k, v, params, nullptr, target); },
        [&] { return attention_bf16(q, k, v, params, target); });
  });
}

absl::Status CudaBackend::normed_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const QkNormRope& norm, const AttentionParams& params,
                                           const Tensor& out) {
  // quality=high with our FP8 attention: QK-norm and RoPE run inside its operand quantizer (q and
  // k are read once and never written back); everywhere else the ops in turn, whose attention()
  // then counts the FP8 path's fallback if it has one.
  auto norm_weight = [](const Tensor& w) {
    return w.dtype() == DType::kBF16 && w.device() == Device::kCuda &&
           w.numel() == cuda::kFlashFp8HeadDim && w.contiguous();
  };
  auto table = [&](const Tensor& t) {
    return t.dtype() == DType::kF32 && t.device() == Device::kCuda && t.rank() == 2 &&
           t.rows() == q.rows() && t.cols() == cuda::kFlashFp8HeadDim &&
           cuda::rows_aligned16(mat(t), 4);
  };
  const bool fusable =
      wants_fp8_attention(params) && q.rows() == k.rows() &&
      !cuda::fast_path(CudaPath::kFlashAttentionFp8).disabled() &&
      check_bf16("normed_attention", "q", q).ok() && check_bf16("normed_attention", "k", k).ok() &&
      check_bf16("normed_attention", "v", v).ok() &&
      check_bf16("normed_attention", "out", out).ok() &&
      cuda::flash_attention_fp8_unsupported(params, mat(q), mat(k), mat(v)).empty() &&
      norm.style == RopeStyle::kInterleaved && norm.split >= 0 && norm.split <= q.rows() &&
      norm_weight(norm.q_weight[0]) && norm_weight(norm.k_weight[0]) &&
      (norm.split == q.rows() ||
       (norm_weight(norm.q_weight[1]) && norm_weight(norm.k_weight[1]))) &&
      table(norm.cos) && table(norm.sin);
  if (!fusable) return Backend::normed_attention(q, k, v, norm, params, out);
  return run_path(
      CudaPath::kFlashAttentionFp8, "",
      [&] {
        return write_output(out, [&](const cuda::Mat& target) {
          return attention_flash_fp8(q, k, v, params, &norm, target);
        });
      },
      [&] { return Backend::normed_attention(q, k, v, norm, params, out); });
}

absl::Status CudaBackend::attention_flash_fp8(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const AttentionParams& params, const QkNormRope* norm,
                                              const cuda::Mat& out,
                                              const cuda::FlashFp8KeySegment* cached) {
  const int64_t s_q = q.rows(), s_kv = k.rows(), width = q.cols(), heads = params.num_heads;
  std::optional<OpProfileScope> profile(std::in_place, *this, op_category("quantize", "attention"));
  FLUX_ASSIGN_OR_RETURN(Tensor q8, scratch({s_q, width}, DType::kF8E4M3));
  FLUX_ASSIGN_OR_RETURN(Tensor k8, scratch({s_kv, width}, DType::kF8E4M3));
  FLUX_ASSIGN_OR_RETURN(Tensor vt8,
                        scratch({width, cuda::flash_fp8_padded_keys(s_kv)}, DType::kF8E4M3));
  FLUX_ASSIGN_OR_RETURN(Tensor scales,
                        scratch({cuda::flash_fp8_scale_count(heads, s_q, s_kv)}, DType::kF32));
  cuda::FlashFp8Operands operands{q8.data(), k8.data(), vt8.data(), scales.data_as<float>()};
  std::optional<cuda::FlashFp8QkNorm> fused_norm;
  if (norm != nullptr) {
    const int second = norm->split < s_q ? 1 : 0;  // the second weights exist when rows use them
    fused_norm = cuda::FlashFp8QkNorm{{norm->q_weight[0].data(), norm->q_weight[second].data()},
                                      {norm->k_weight[0].data(), norm->k_weight[second].data()},
                                      norm->split,
                                      norm->eps,
                                      mat(norm->cos),
                                      mat(norm->sin)};
  }
  FLUX_RETURN_IF_ERROR(cuda::quantize_attention_operands_fp8(
      mat(q), mat(k), mat(v), heads, operands, stream(), fused_norm ? &*fused_norm : nullptr));
  cuda::FlashFp8Args a = cuda::flash_fp8_args(operands, s_q, s_kv, heads);
  if (cached != nullptr) a.keys[1] = *cached;  // the second key segment, quantized once
  a.out = out;
  a.softmax_scale = params.scale;
  profile.emplace(*this, "attention");
  return cuda::flash_attention_fp8(a, stream());
}

absl::Status CudaBackend::attention_by_gemms(const Tensor& q, const Tensor& k, const Tensor& v,
                                             float scale, const cuda::Mat& out) {
  // 4096 query rows x 16384 keys of f32 scores is 256 MiB: bounded whatever the image size.
  constexpr int64_t kMaxScoreElements = int64_t{1} << 26;
  const int64_t keys = k.rows();
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(q.rows(), kMaxScoreElements / keys));
  FLUX_ASSIGN_OR_RETURN(Tensor scores, scratch({chunk, keys}, DType::kF32));
  FLUX_ASSIGN_OR_RETURN(Tensor probs, scratch({chunk, keys}));
  for (int64_t r0 = 0; r0 < q.rows(); r0 += chunk) {
    const int64_t n = std::min(chunk, q.rows() - r0);
    const cuda::Mat s{scores.data(), n, keys, keys}, p{probs.data(), n, keys, keys};
    FLUX_RETURN_IF_ERROR(
        gemm_->matmul(mat(q.row_slice(r0, n)), mat(k), /*b_transposed=*/true, scale, s, true));
    FLUX_RETURN_IF_ERROR(cuda::softmax_rows_f32_to_bf16(s, p, stream()));
    const cuda::Mat o{static_cast<char*>(out.data) + r0 * out.stride * 2, n, out.cols, out.stride};
    FLUX_RETURN_IF_ERROR(gemm_->matmul(p, mat(v), /*b_transposed=*/false, 1.0f, o, false));
  }
  return absl::OkStatus();
}

}  // namespace flux2
