// klein-KV (Flux2KleinKVPipeline; diffusers' kv_cache_mode): the editing references run once, in
// the step-0 forward at timestep-0 modulation, and every layer caches their post-RoPE keys and
// values; later forwards take only the text and image rows and attend to the cache. What the
// transformer does differently for it is here; flux2_transformer.cc calls it to lay out a forward
// (the mode, the rows' modulation) and from its attention. Tested by `flux2 check-golden --only
// edit_kv` (tests/golden).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace flux2 {

// What one forward does with the reference rows of a klein-KV request.
enum class Flux2KvMode : uint8_t {
  kOff,      // no cache: the references (if any) ride in the stream at every forward
  kExtract,  // step 0 ("extract"): the references run at timestep-0 modulation, attend only to
             // themselves, and fill the cache
  kCached,   // later steps ("cached"): the stream holds text and image rows; their keys and values
             // are followed by the cached references'
};

// The mode of the forward at `step` for a request with (`has_cache`) or without a cache.
Flux2KvMode flux2_kv_mode(bool has_cache, int64_t step);

// Stream rows [first, first + count) that read one modulation row `mod` [1, 17D].
struct Flux2RowModulation {
  int64_t first = 0, count = 0;
  Tensor mod;
};

// The modulation of stream rows [begin, end): `mod` for every row, but in the extract forward the
// reference rows (from `references_from` = L + N on) read `reference_mod`, timestep 0's
// (diffusers' ref_fixed_timestep). One segment, or two where the references start inside.
std::vector<Flux2RowModulation> flux2_kv_row_modulation(Flux2KvMode mode, const Tensor& mod,
                                                        const Tensor& reference_mod,
                                                        int64_t references_from, int64_t begin,
                                                        int64_t end);

// Every layer's reference keys and values, post-RoPE (double blocks, then single blocks), as the
// backend caches them (Backend::cache_keys: at quality=high on the CUDA backend the FP8
// attention's operands, quantized once per request): made by the extract forward, read by the
// cached ones. Held by the request's Flux2Conditioning.
class Flux2KvCache {
 public:
  // An empty cache for `layers` layers of `rows` (R) reference rows each.
  static absl::StatusOr<std::shared_ptr<Flux2KvCache>> allocate(Backend& be, size_t layers,
                                                                int64_t rows, int64_t width);

  // The extract forward's attention of `layer`, after QK-norm and RoPE: q, k, v [L + N + R, D]
  // with the references from row `joint` = L + N. Caches their k and v rows as the layer's (once:
  // a second extract of the layer is an error), then the text and image rows attend to every key
  // and the references only to themselves (diffusers' _flux2_kv_causal_attention), into
  // out [L + N + R, D].
  absl::Status extract(Backend& be, size_t layer, const AttentionParams& params, int64_t joint,
                       const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out);

  // A cached forward's attention of `layer`, after QK-norm and RoPE: q, k, v [L + N, D], where k
  // and v are the first rows of k_room and v_room [L + N + R, D] (scratch past L + N). One
  // attention over the keys [text; image; references] into out [L + N, D]
  // (Backend::attention_with_cached_keys: the cache is a second key segment).
  absl::Status attend_cached(Backend& be, size_t layer, const AttentionParams& params,
                             const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& k_room, const Tensor& v_room, const Tensor& out) const;

  // The cache of `layer` (null until its extract ran), and the bytes all layers hold.
  const CachedKeys* layer(size_t layer) const;
  int64_t device_bytes() const;

 private:
  int64_t rows_ = 0;                                       // R
  std::vector<std::shared_ptr<const CachedKeys>> layers_;  // per layer, null until extracted
};

}  // namespace flux2
