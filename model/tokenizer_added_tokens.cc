// Leftmost-longest matching of added tokens and their strip/word flags; see
// tokenizer_added_tokens.h. Tested by tests/host/tokenizer_test.cc (AddedTokens*).
#include "model/tokenizer_added_tokens.h"

#include <algorithm>
#include <unordered_map>

#include "model/tokenizer_utf8.h"

namespace flux2 {
namespace {

// The code point that ends at byte `end` of valid UTF-8 `text` (end > 0).
char32_t code_point_before(absl::string_view text, size_t end) {
  size_t begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
  int length = 0;
  return utf8_decode(text, begin, &length);
}

// Start of the whitespace run that ends at `end` (Rust regex \s*$ on text[..end]).
size_t white_space_run_start(absl::string_view text, size_t end) {
  size_t begin = end;
  while (begin > 0) {
    size_t previous = begin - 1;
    while (previous > 0 && (static_cast<unsigned char>(text[previous]) & 0xC0) == 0x80) --previous;
    int length = 0;
    if (!unicode_is_white_space(utf8_decode(text, previous, &length))) break;
    begin = previous;
  }
  return begin;
}

// End of the whitespace run that starts at `begin` (Rust regex ^\s* on text[begin..]).
size_t white_space_run_end(absl::string_view text, size_t begin) {
  size_t end = begin;
  while (end < text.size()) {
    int length = 0;
    if (!unicode_is_white_space(utf8_decode(text, end, &length))) break;
    end += static_cast<size_t>(length);
  }
  return end;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) {
  std::unordered_map<std::string, size_t> position;
  for (AddedToken& token : tokens) {
    if (token.content.empty()) continue;
    if (const auto it = position.find(token.content); it != position.end()) {
      tokens_[it->second] = std::move(token);
    } else {
      position.emplace(token.content, tokens_.size());
      tokens_.push_back(std::move(token));
    }
  }
  for (uint32_t i = 0; i < tokens_.size(); ++i) {
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
  }
  for (std::vector<uint32_t>& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](uint32_t a, uint32_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

std::vector<TextPiece> AddedTokenMatcher::split(absl::string_view text) const {
  std::vector<TextPiece> pieces;
  if (text.empty()) return pieces;
  if (tokens_.empty()) return {{0, text.size(), -1}};
  size_t covered = 0;  // everything before this offset is in `pieces`
  size_t pos = 0;
  while (pos < text.size()) {
    // The longest token starting at the leftmost position where any starts.
    const AddedToken* found = nullptr;
    for (const uint32_t index : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const std::string& content = tokens_[index].content;
      if (text.size() - pos >= content.size() && text.compare(pos, content.size(), content) == 0) {
        found = &tokens_[index];
        break;
      }
    }
    if (found == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos;
    size_t end = pos + found->content.size();
    pos = end;  // the search resumes after this match even when the flags reject it
    if (found->single_word) {
      const bool word_before =
          begin > 0 && unicode_is_word_character(code_point_before(text, begin));
      int length = 0;
      const bool word_after =
          end < text.size() && unicode_is_word_character(utf8_decode(text, end, &length));
      if (word_before || word_after) continue;
    }
    if (found->lstrip) begin = std::max(white_space_run_start(text, begin), covered);
    if (found->rstrip) end = white_space_run_end(text, end);
    if (covered < begin) pieces.push_back({covered, begin, -1});
    pieces.push_back({begin, end, found->id});
    covered = end;
    // An rstrip that swallowed whitespace moves the search past it too, so that pieces never
    // overlap (Hugging Face would emit overlapping pieces here; no real tokenizer has a token
    // that starts with whitespace next to an rstrip token).
    pos = std::max(pos, end);
  }
  if (covered < text.size()) pieces.push_back({covered, text.size(), -1});
  return pieces;
}

}  // namespace flux2
