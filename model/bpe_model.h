// The BPE model of a tokenizer.json: vocabulary, merges by rank, and the merge loop of Hugging Face
// tokenizers (a priority queue of adjacent pairs, O(n log n) per word) with a per-word cache.
// Tested by tests/host/tokenizer_test.cc (Bpe*) and the corpus in tests/tokenizer/.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace flux2 {

class BpeModel {
 public:
  // From the "model" object (type "BPE"; "vocab" {token: id}; "merges" as "a b" strings or
  // [a, b] pairs; unk_token, continuing_subword_prefix, end_of_word_suffix, fuse_unk,
  // byte_fallback, ignore_merges). `source` names the file in errors; dropout is rejected.
  static absl::StatusOr<std::unique_ptr<BpeModel>> from_json(const nlohmann::json& model,
                                                             absl::string_view source);

  // Appends the ids of one pre-tokenized word (non-empty, valid UTF-8). Thread-safe.
  void encode_word(absl::string_view word, std::vector<int32_t>* ids) const;

  // The vocabulary id of `token`, or -1.
  int32_t token_id(absl::string_view token) const;
  size_t vocab_size() const { return vocab_.size(); }

 private:
  struct Merge {
    uint32_t rank;   // position in the merges list; lower merges first
    int32_t new_id;  // id of the merged token
  };
  // Transparent hashing so that lookups by string_view do not allocate.
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
  };
  using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  BpeModel() = default;
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  const Merge* find_merge(int32_t left, int32_t right) const;
  // The ids of `word` after every merge (Hugging Face BPE::merge_word + Word::merge_all).
  std::vector<int32_t> merge_word(std::string_view word) const;

  Vocab vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<std::string> unk_token_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;

  // Merge results of short words; words of kCacheMaxWordBytes or more are not cached.
  static constexpr size_t kCacheMaxWordBytes = 256;
  static constexpr size_t kCacheMaxEntries = 1 << 16;  // then the cache starts over
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace flux2
