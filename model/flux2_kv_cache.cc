// klein-KV's reference cache and its forward rules; see flux2_kv_cache.h. Tested by `flux2
// check-golden --only edit_kv` (tests/golden) and tests/host/attention_cached_keys_test.cc.
#include "model/flux2_kv_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
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
  if (rows <= 0 || width <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("klein-KV cache: ", rows, " reference rows of width ", width));
  }
  auto cache = std::make_shared<Flux2KvCache>();
  cache->rows_ = rows;
  cache->layers_.resize(layers);
  return cache;
}

absl::Status Flux2KvCache::extract(Backend& be, size_t layer, const AttentionParams& params,
                                   int64_t joint, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out) {
  const int64_t r = q.rows() - joint;
  if (layer >= layers_.size() || layers_[layer] != nullptr || r != rows_) {
    return absl::InternalError(absl::StrCat("klein-KV cache: layer ", layer, " of ", layers_.size(),
                                            " extracted twice, or ", r,
                                            " reference rows where the cache has ", rows_));
  }
  const Tensor ref_q = q.row_slice(joint, r), ref_k = k.row_slice(joint, r),
               ref_v = v.row_slice(joint, r);
  FLUX_ASSIGN_OR_RETURN(layers_[layer], be.cache_keys(ref_k, ref_v, params));  // R rows, once
  FLUX_RETURN_IF_ERROR(
      be.attention(q.row_slice(0, joint), k, v, params, out.row_slice(0, joint)));  // [L+N, D]
  return be.attention(ref_q, ref_k, ref_v, params, out.row_slice(joint, r));        // [R, D]
}

absl::Status Flux2KvCache::attend_cached(Backend& be, size_t layer, const AttentionParams& params,
                                         const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& k_room, const Tensor& v_room,
                                         const Tensor& out) const {
  const CachedKeys* cached = this->layer(layer);
  if (cached == nullptr) {
    return absl::InternalError(absl::StrCat("klein-KV cache: layer ", layer,
                                            " has no cached keys (step 0 must run first)"));
  }
  return be.attention_with_cached_keys(q, k, v, *cached, k_room, v_room, params,
                                       out);  // [L+N, D]
}

const CachedKeys* Flux2KvCache::layer(size_t layer) const {
  return layer < layers_.size() ? layers_[layer].get() : nullptr;
}

int64_t Flux2KvCache::device_bytes() const {
  int64_t bytes = 0;
  for (const auto& cached : layers_) bytes += cached != nullptr ? cached->device_bytes() : 0;
  return bytes;
}

}  // namespace flux2
