// PromptCache's LRU bookkeeping; see prompt_cache.h. Tested by tests/host/pipeline_test.cc
// (PromptCache*).
#include "model/prompt_cache.h"

namespace flux2 {

std::optional<Tensor> PromptCache::find(const Key& key) {
  auto found = entries_.find(key);
  if (found == entries_.end()) return std::nullopt;
  order_.splice(order_.begin(), order_, found->second.position);
  return found->second.embeddings;
}

void PromptCache::insert(Key key, Tensor embeddings) {
  const int64_t bytes = embeddings.bytes();
  if (bytes > capacity_bytes_ || entries_.count(key) != 0) return;
  while (bytes_ + bytes > capacity_bytes_ && !order_.empty()) {
    auto oldest = entries_.find(order_.back());
    bytes_ -= oldest->second.embeddings.bytes();
    entries_.erase(oldest);
    order_.pop_back();
  }
  order_.push_front(key);
  bytes_ += bytes;
  entries_.emplace(std::move(key), Entry{std::move(embeddings), order_.begin()});
}

}  // namespace flux2
