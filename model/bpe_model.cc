// BPE vocabulary, merges and the rank-ordered merge loop; see bpe_model.h.
// Tested by tests/host/tokenizer_test.cc (Bpe*) and the corpus in tests/tokenizer/.
#include "model/bpe_model.h"

#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/tokenizer_utf8.h"

namespace flux2 {
namespace {

// One symbol of a word being merged: a token id in a doubly linked list over the initial
// characters (Hugging Face's bpe::Word).
struct Symbol {
  int32_t id;
  int64_t prev;  // index of the previous live symbol, or -1
  int64_t next;  // index of the next live symbol, or -1
  size_t bytes;  // bytes of the word it covers; 0 once merged into its left neighbour
};

// A candidate merge of the symbol at `pos` with its right neighbour.
struct Candidate {
  uint32_t rank;
  size_t pos;
  int32_t new_id;
};

// Lowest rank first, then leftmost: the order Hugging Face's heap pops merges in.
struct LaterCandidate {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.pos > b.pos;
  }
};

void add_symbol(int32_t id, size_t bytes, std::vector<Symbol>* symbols) {
  const int64_t index = static_cast<int64_t>(symbols->size());
  if (!symbols->empty()) symbols->back().next = index;
  symbols->push_back({id, index - 1, -1, bytes});
}

absl::StatusOr<std::pair<std::string, std::string>> parse_merge(const nlohmann::json& merge,
                                                                size_t index,
                                                                absl::string_view source) {
  if (merge.is_string()) {
    const std::string text = merge.get<std::string>();
    const size_t space = text.find(' ');
    if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": model.merges[", index,
                                                     "] is not two tokens separated by one space"));
    }
    return std::make_pair(text.substr(0, space), text.substr(space + 1));
  }
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    return std::make_pair(merge[0].get<std::string>(), merge[1].get<std::string>());
  }
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": model.merges[", index, "] is neither \"a b\" nor [\"a\", \"b\"]"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::from_json(const nlohmann::json& model,
                                                              absl::string_view source) {
  if (!model.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": \"model\" is not an object"));
  }
  if (model.contains("type") && !(model["type"].is_string() && model["type"] == "BPE")) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": model.type is ", model["type"].dump(), "; only BPE is supported"));
  }
  if (model.contains("dropout") && model["dropout"].is_number() &&
      model["dropout"].get<double>() != 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": model.dropout is set; BPE dropout is not supported"));
  }
  std::unique_ptr<BpeModel> bpe(new BpeModel());
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": model.vocab is not an object"));
  }
  bpe->vocab_.reserve(model["vocab"].size());
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": model.vocab[\"", token, "\"] is not a token id"));
    }
    bpe->vocab_[token] = static_cast<int32_t>(id.get<int64_t>());
  }
  const auto read_string = [&](const char* key, std::string* out) -> absl::Status {
    if (!model.contains(key) || model[key].is_null()) return absl::OkStatus();
    if (!model[key].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": model.", key, " is not a string"));
    }
    *out = model[key].get<std::string>();
    return absl::OkStatus();
  };
  if (absl::Status s = read_string("continuing_subword_prefix", &bpe->continuing_subword_prefix_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = read_string("end_of_word_suffix", &bpe->end_of_word_suffix_); !s.ok()) {
    return s;
  }
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    std::string unk;
    if (absl::Status s = read_string("unk_token", &unk); !s.ok()) return s;
    bpe->unk_token_ = unk;
  }
  const auto read_flag = [&](const char* key) {
    return model.contains(key) && model[key].is_boolean() && model[key].get<bool>();
  };
  bpe->fuse_unk_ = read_flag("fuse_unk");
  bpe->byte_fallback_ = read_flag("byte_fallback");
  bpe->ignore_merges_ = read_flag("ignore_merges");

  if (!model.contains("merges") || !model["merges"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": model.merges is not an array"));
  }
  const nlohmann::json& merges = model["merges"];
  bpe->merges_.reserve(merges.size());
  const size_t prefix_length = bpe->continuing_subword_prefix_.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    auto pair = parse_merge(merges[rank], rank, source);
    if (!pair.ok()) return pair.status();
    const auto& [left, right] = *pair;
    const int32_t left_id = bpe->token_id(left);
    const int32_t right_id = bpe->token_id(right);
    // The merged token drops the right part's continuing-subword prefix.
    const std::string merged =
        left + (right.size() >= prefix_length ? right.substr(prefix_length) : right);
    const int32_t merged_id = bpe->token_id(merged);
    if (left_id < 0 || right_id < 0 || merged_id < 0) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": model.merges[", rank, "] (\"", left,
                                                     "\" + \"", right,
                                                     "\") uses a token missing from model.vocab"));
    }
    // A repeated pair keeps its last rank, as Hugging Face's map construction does.
    bpe->merges_[pair_key(left_id, right_id)] = {static_cast<uint32_t>(rank), merged_id};
  }
  return bpe;
}

int32_t BpeModel::token_id(absl::string_view token) const {
  const auto it = vocab_.find(std::string_view(token.data(), token.size()));
  return it == vocab_.end() ? -1 : it->second;
}

const BpeModel::Merge* BpeModel::find_merge(int32_t left, int32_t right) const {
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

std::vector<int32_t> BpeModel::merge_word(std::string_view word) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  // A pending unknown-token symbol (unk_bytes > 0) and the bytes it covers.
  size_t unk_bytes = 0;
  const int32_t unk_id = unk_token_.has_value() ? token_id(*unk_token_) : -1;
  const absl::string_view text(word.data(), word.size());
  std::string decorated;
  size_t pos = 0;
  while (pos < word.size()) {
    int length = 0;
    utf8_decode(text, pos, &length);
    const bool is_first = pos == 0;
    const bool is_last = pos + length == word.size();
    std::string_view piece = word.substr(pos, length);
    if ((!is_first && !continuing_subword_prefix_.empty()) ||
        (is_last && !end_of_word_suffix_.empty())) {
      decorated = absl::StrCat(is_first ? "" : continuing_subword_prefix_,
                               absl::string_view(piece.data(), piece.size()),
                               is_last ? end_of_word_suffix_ : "");
      piece = decorated;
    }
    pos += length;
    const auto found = vocab_.find(piece);
    if (found != vocab_.end()) {
      if (unk_bytes > 0) {
        add_symbol(unk_id, unk_bytes, &symbols);
        unk_bytes = 0;
      }
      add_symbol(found->second, static_cast<size_t>(length), &symbols);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int32_t> byte_ids;
      for (const char byte : piece) {
        const int32_t id = token_id(absl::StrFormat("<0x%02X>", static_cast<unsigned char>(byte)));
        if (id < 0) break;
        byte_ids.push_back(id);
      }
      if (byte_ids.size() == piece.size()) {
        for (const int32_t id : byte_ids) add_symbol(id, 1, &symbols);
        continue;
      }
    }
    // Without an unknown token (or with one missing from the vocabulary) the character is
    // dropped, as Hugging Face does without an unk_token.
    if (unk_id < 0) continue;
    if (unk_bytes > 0 && fuse_unk_) {
      unk_bytes += static_cast<size_t>(length);
    } else {
      if (unk_bytes > 0) add_symbol(unk_id, unk_bytes, &symbols);
      unk_bytes = static_cast<size_t>(length);
    }
  }
  if (unk_bytes > 0) add_symbol(unk_id, unk_bytes, &symbols);

  std::priority_queue<Candidate, std::vector<Candidate>, LaterCandidate> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* merge = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({merge->rank, i, merge->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& current = symbols[top.pos];
    if (current.bytes == 0 || current.next < 0) continue;  // merged away, or the last symbol
    const size_t next_pos = static_cast<size_t>(current.next);
    const Symbol right = symbols[next_pos];
    // Skip stale entries: the pair at `pos` must still merge into the same token.
    const Merge* still = find_merge(current.id, right.id);
    if (still == nullptr || still->new_id != top.new_id) continue;

    current.id = top.new_id;
    current.bytes += right.bytes;
    current.next = right.next;
    symbols[next_pos].bytes = 0;
    if (right.next >= 0)
      symbols[static_cast<size_t>(right.next)].prev = static_cast<int64_t>(top.pos);
    if (current.prev >= 0) {
      const size_t prev = static_cast<size_t>(current.prev);
      if (const Merge* merge = find_merge(symbols[prev].id, current.id)) {
        queue.push({merge->rank, prev, merge->new_id});
      }
    }
    if (current.next >= 0) {
      if (const Merge* merge =
              find_merge(current.id, symbols[static_cast<size_t>(current.next)].id)) {
        queue.push({merge->rank, top.pos, merge->new_id});
      }
    }
  }
  std::vector<int32_t> ids;
  for (const Symbol& symbol : symbols) {
    if (symbol.bytes != 0) ids.push_back(symbol.id);
  }
  return ids;
}

void BpeModel::encode_word(absl::string_view word, std::vector<int32_t>* ids) const {
  const std::string_view key(word.data(), word.size());
  if (ignore_merges_) {
    if (const auto it = vocab_.find(key); it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = key.size() < kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (const auto it = cache_.find(key); it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> merged = merge_word(key);
  ids->insert(ids->end(), merged.begin(), merged.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheMaxEntries) cache_.clear();
    cache_.emplace(std::string(key), std::move(merged));
  }
}

}  // namespace flux2
