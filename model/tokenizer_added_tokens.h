// Added and special tokens of a tokenizer.json found in raw text before pre-tokenization:
// leftmost-longest, non-overlapping matching (Hugging Face's Aho-Corasick
// MatchKind::LeftmostLongest) with the single_word, lstrip and rstrip flags. Tested by
// tests/host/tokenizer_test.cc (AddedTokens*).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace flux2 {

struct AddedToken {
  std::string content;  // the text to find (already normalized for normalized tokens)
  int32_t id = -1;
  bool single_word = false;  // only where no word character touches it on either side
  bool lstrip = false;       // also swallows the whitespace on its left
  bool rstrip = false;       // also swallows the whitespace on its right
  bool normalized = false;   // matched in normalized text (else in the raw text)
  bool special = false;      // a control token such as <|im_start|>
};

// One piece of a split text: an added token (id >= 0) or plain text (id -1).
struct TextPiece {
  size_t begin;
  size_t end;
  int32_t id;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // Tokens with empty content are ignored; when two share a content the later one wins.
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  // Splits `text` (valid UTF-8) into added tokens and the text between them, covering it in
  // order; token pieces include the whitespace their lstrip/rstrip flags swallow. Empty text
  // gives no pieces.
  std::vector<TextPiece> split(absl::string_view text) const;
  bool empty() const { return tokens_.empty(); }

 private:
  std::vector<AddedToken> tokens_;
  // Indices into tokens_ by first byte, longest content first.
  std::array<std::vector<uint32_t>, 256> by_first_byte_;
};

}  // namespace flux2
