// CudaBackend's cache of klein-KV's reference keys (Backend::cache_keys and
// attention_with_cached_keys): at quality=high with our FP8 attention the cached keys and values
// are quantized once, at step 0, into the kernel's layout (E4M3 K, key-permuted Vᵀ, their block
// scales) and every later step reads them as the kernel's second key segment, without copies; the
// FP8 path's fallback dequantizes them into the room after the call's own keys for bf16 attention
// (the cache keeps no bf16 copy). Elsewhere the default: bf16 copies, copied into the room per
// call. Tested by tests/cuda/flash_attention_fp8_keys_test.cc and fast_path_fallback_test.cc.
#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"

#include "kernels/cuda/attention_fp8_operands.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/cuda_checks.h"
#include "kernels/cuda/flash_attention_fp8.h"

namespace flux2 {
namespace {

using cuda::check_bf16;
using cuda::CudaPath;

// The FP8 cache: the operands of the kernel's second key segment for `heads` heads of 128.
struct CudaFp8CachedKeys final : CachedKeys {
  Tensor k8;      // E4M3 [R, H·128]
  Tensor vt8;     // E4M3 [H·128, flash_fp8_padded_keys(R)], keys permuted, padding zeros
  Tensor scales;  // f32 [2·H·flash_fp8_tiles(R)]: K's [H][tiles], then V's
  int64_t heads = 0;
  int64_t rows() const override { return k8.rows(); }
  int64_t device_bytes() const override { return k8.bytes() + vt8.bytes() + scales.bytes(); }
  cuda::FlashFp8KeySegment segment() const {
    const cuda::FlashFp8Operands operands{nullptr, k8.data(), vt8.data(), scales.data_as<float>()};
    return cuda::flash_fp8_key_segment(operands, 0, rows(), heads);
  }
};

}  // namespace

absl::StatusOr<std::shared_ptr<const CachedKeys>> CudaBackend::cache_keys(
    const Tensor& k, const Tensor& v, const AttentionParams& params) {
  // The FP8 form only where the FP8 path would serve these keys; its calls count any fallback.
  const bool fp8 = wants_fp8_attention(params) &&
                   !cuda::fast_path(CudaPath::kFlashAttentionFp8).disabled() &&
                   check_bf16("cache_keys", "k", k).ok() && check_bf16("cache_keys", "v", v).ok() &&
                   cuda::flash_attention_fp8_unsupported(params, mat(k), mat(k), mat(v)).empty();
  if (!fp8) return Backend::cache_keys(k, v, params);
  OpProfileScope profile(*this, op_category("quantize", "attention"));
  const int64_t r = k.rows(), width = k.cols(), heads = params.num_heads;
  auto cache = std::make_shared<CudaFp8CachedKeys>();
  cache->heads = heads;
  FLUX_ASSIGN_OR_RETURN(cache->k8, empty(DType::kF8E4M3, {r, width}));
  FLUX_ASSIGN_OR_RETURN(cache->vt8, empty(DType::kF8E4M3, {width, cuda::flash_fp8_padded_keys(r)}));
  FLUX_ASSIGN_OR_RETURN(cache->scales,
                        empty(DType::kF32, {cuda::flash_fp8_scale_count(heads, 0, r)}));
  const cuda::FlashFp8Operands operands{nullptr, cache->k8.data(), cache->vt8.data(),
                                        cache->scales.data_as<float>()};
  const cuda::Mat no_queries{nullptr, 0, width, width};
  FLUX_RETURN_IF_ERROR(
      cuda::quantize_attention_operands_fp8(no_queries, mat(k), mat(v), heads, operands, stream()));
  return cache;
}

absl::Status CudaBackend::attention_with_cached_keys(const Tensor& q, const Tensor& k,
                                                     const Tensor& v, const CachedKeys& cached,
                                                     const Tensor& k_room, const Tensor& v_room,
                                                     const AttentionParams& params,
                                                     const Tensor& out) {
  const auto* fp8 = dynamic_cast<const CudaFp8CachedKeys*>(&cached);
  if (fp8 == nullptr) {
    return Backend::attention_with_cached_keys(q, k, v, cached, k_room, v_room, params, out);
  }
  constexpr absl::string_view kOp = "attention_with_cached_keys";
  FLUX_RETURN_IF_ERROR(check_cached_keys_layout(k, v, cached, k_room, v_room));
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "q", q));
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "k", k));
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "v", v));
  FLUX_RETURN_IF_ERROR(check_bf16(kOp, "out", out));
  if (fp8->heads != params.num_heads || k.cols() != fp8->k8.cols()) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention_with_cached_keys: the FP8 cache holds ", fp8->heads, " heads of ",
                     fp8->k8.cols() / std::max<int64_t>(fp8->heads, 1), ", the call has ",
                     params.num_heads, " heads and ", k.cols(), " key columns"));
  }
  // bf16 attention over the room: the call's own keys, then the cache dequantized after them.
  auto dequantized = [&](const cuda::Mat& target) -> absl::Status {
    const int64_t s = k.rows(), r = cached.rows();
    FLUX_RETURN_IF_ERROR(
        cuda::dequantize_attention_keys_fp8(fp8->segment(), fp8->heads, mat(k_room.row_slice(s, r)),
                                            mat(v_room.row_slice(s, r)), stream()));
    return attention_bf16(q, k_room, v_room, params, target);
  };
  return write_output(out, [&](const cuda::Mat& target) -> absl::Status {
    // An FP8 cache read outside quality=high (not the request that made it): not applicable.
    if (!wants_fp8_attention(params)) return dequantized(target);
    const cuda::FlashFp8KeySegment segment = fp8->segment();
    return run_path(
        CudaPath::kFlashAttentionFp8,
        cuda::flash_attention_fp8_unsupported(params, mat(q), mat(k), mat(v)),
        [&] { return attention_flash_fp8(q, k, v, params, nullptr, target, &segment); },
        [&] { return dequantized(target); });
  });
}

}  // namespace flux2
