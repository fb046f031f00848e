// PromptCache: a bounded LRU of prompt embeddings on the backend, keyed by the tokenized prompt
// (ids and unpadded length), so a repeated prompt (and CFG's default negative prompt) skips the
// text encoder. Entries are immutable tensors shared with the requests using them. Tested by
// tests/host/pipeline_test.cc (PromptCache*).
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/base/tensor.h"

namespace flux2 {

// 256 MiB: 16 FLUX.2-dev prompts of 512 tokens (512 x 15360 bf16 = 15.7 MB each), 32 of klein-4B.
inline constexpr int64_t kDefaultPromptCacheBytes = int64_t{256} << 20;

class PromptCache {
 public:
  struct Key {
    std::vector<int32_t> ids;
    int64_t num_tokens = 0;
    bool operator<(const Key& other) const {
      return std::tie(num_tokens, ids) < std::tie(other.num_tokens, other.ids);
    }
  };

  explicit PromptCache(int64_t capacity_bytes = 0) : capacity_bytes_(capacity_bytes) {}

  int64_t capacity_bytes() const { return capacity_bytes_; }
  int64_t bytes() const { return bytes_; }
  int64_t size() const { return static_cast<int64_t>(entries_.size()); }

  // The embeddings of `key` (now the most recently used), or nullopt.
  std::optional<Tensor> find(const Key& key);
  // Keeps `embeddings` under `key`, evicting the least recently used entries until it fits; an
  // entry larger than the capacity is not kept.
  void insert(Key key, Tensor embeddings);

 private:
  using Order = std::list<Key>;  // most recently used first
  struct Entry {
    Tensor embeddings;
    Order::iterator position;
  };

  int64_t capacity_bytes_ = 0;
  int64_t bytes_ = 0;
  Order order_;
  std::map<Key, Entry> entries_;
};

}  // namespace flux2
