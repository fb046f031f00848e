// The split patterns of a tokenizer.json ("Regex" or literal "String"), compiled with PCRE2 (UTF +
// UCP, JIT when available) and iterated like Hugging Face tokenizers' Oniguruma find_iter, so that
// pre-tokenization agrees (Unicode properties included, see oniguruma_compatible_pattern). Tested
// by tests/host/tokenizer_test.cc (TokenizerRegex*) and the corpus.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flux2 {

class TokenizerRegex {
 public:
  struct Match {
    size_t begin;  // byte offsets into the searched text
    size_t end;
  };

  // `pattern` in the Oniguruma (Ruby) syntax tokenizer.json files use; `source` names the file and
  // field in errors. Differences from PCRE2 that change matches are translated first
  // (oniguruma_compatible_pattern).
  static absl::StatusOr<std::unique_ptr<TokenizerRegex>> compile_regex(absl::string_view pattern,
                                                                       absl::string_view source);
  // Matches `text` literally.
  static absl::StatusOr<std::unique_ptr<TokenizerRegex>> compile_literal(absl::string_view text,
                                                                         absl::string_view source);
  ~TokenizerRegex();
  TokenizerRegex(const TokenizerRegex&) = delete;
  TokenizerRegex& operator=(const TokenizerRegex&) = delete;

  // Successive non-overlapping matches in `text` (valid UTF-8), in order. Like Oniguruma's
  // find_iter, an empty match is reported unless it ends where the previous match ended, in which
  // case the search moves on by one character. Thread-safe. Should PCRE2 hit a resource limit
  // (which the linear patterns of GPT-style tokenizers never do), the matches found so far are
  // returned and the rest of the text stays unmatched.
  std::vector<Match> find_all(absl::string_view text) const;

 private:
  struct Compiled;
  explicit TokenizerRegex(std::unique_ptr<Compiled> compiled);
  std::unique_ptr<Compiled> compiled_;
};

// `pattern` with \s and \S rewritten to Unicode White_Space, which Oniguruma (and so Hugging Face
// tokenizers) uses; PCRE2's UCP \s also matches U+180E MONGOLIAN VOWEL SEPARATOR. \S inside a
// bracket class is left as it is. The general categories of letters, marks and numbers (\p{L},
// \p{Lu}, ..., \p{N}, \pL, and \P{..} outside a bracket class) also get the code points that
// Oniguruma's Unicode 16.0 has and PCRE2's tables lack (tokenizer_unicode_additions.h).
// Exposed for tests.
std::string oniguruma_compatible_pattern(absl::string_view pattern);

}  // namespace flux2
