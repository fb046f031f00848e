// klein-KV's reference cache and its forward rules; see flux2_kv_cache.h. Tested by `flux2
// check-golden --only edit_kv` (tests/golden).
#include "model/flux2_kv_cache.h"

#include <algorithm>

#include "kernels/base/status.h"

namespace flux2 {

Flux2KvMode flux2_kv_mode(bool has_cache, int64_t step) {
  if (!has_cache) return Flux2KvMode::kOff;
  return step == 0 ? Flux2KvMode::kExtract : Flux2KvMode::kCached;
}

std::vector<Flux2RowModulation> flux2_kv_row_modulation(Flux2KvMode mode, const Tensor& mod,
                                                        const Tensor& reference_mod,
                                                        int64_t references_from, int64_t begin,
                                                        int64_t end) {
  if (mode != Flux2KvMode::kExtract) return {Flux2RowModulation{begin, end - begin, mod}};
  const int64_t split = std::clamp(references_from, begin, end);
  std::vector<Flux2RowModulation> segments;
  if (split > begin) segments.push_back({begin, split - begin, mod});
  if (end > split) segments.push_back({split, end - split, reference_mod});
  return segments;
}

absl::StatusOr<std::shared_ptr<Flux2KvCache>> Flux2KvCache::allocate(Backend& be, size_t layers,
                                                                     int64_t rows, int64_t width) {
  auto cache = std::make_shared<Flux2KvCache>();
  for (size_t i = 0; i < layers; ++i) {
    FLUX_ASSIGN_OR_RETURN(Tensor keys, be.empty(be.activation_dtype(), {rows, width}));
    FLUX_ASSIGN_OR_RETURN(Tensor values, be.empty(be.activation_dtype(), {rows, width}));
    cache->keys_.push_back(keys);
    cache->values_.push_back(values);
  }
  return cache;
}

absl::Status Flux2KvCache::extract(Backend& be, size_t layer, const AttentionParams& params,
                                   int64_t joint, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out) {
  const int64_t r = q.rows() - joint;
  const Tensor ref_q = q.row_slice(joint, r), ref_k = k.row_slice(joint, r),
               ref_v = v.row_slice(joint, r);
  FLUX_RETURN_IF_ERROR(be.copy(ref_k, keys_[layer]));    // [R, D]
  FLUX_RETURN_IF_ERROR(be.copy(ref_v, values_[layer]));  // [R, D]
  FLUX_RETURN_IF_ERROR(
      be.attention(q.row_slice(0, joint), k, v, params, out.row_slice(0, joint)));  // [L+N, D]
  return be.attention(ref_q, ref_k, ref_v, params, out.row_slice(joint, r));        // [R, D]
}

absl::Status Flux2KvCache::attend_cached(Backend& be, size_t layer, const AttentionParams& params,
                                         const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& k_room, const Tensor& v_room,
                                         const Tensor& out) {
  const int64_t joint = k.rows(), refs = k_room.rows() - joint;
  if (k_room.data() != k.data() || v_room.data() != v.data()) {
    return absl::InternalError("klein-KV attention: k and v are not the first rows of their room");
  }
  FLUX_RETURN_IF_ERROR(be.copy(keys_[layer], k_room.row_slice(joint, refs)));    // [R, D]
  FLUX_RETURN_IF_ERROR(be.copy(values_[layer], v_room.row_slice(joint, refs)));  // [R, D]
  return be.attention(q, k_room, v_room, params, out);                           // [L+N, D]
}

}  // namespace flux2
