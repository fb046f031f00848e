// UTF-8 helpers for the tokenizer: lossy repair of invalid input, code point decoding/encoding and
// the Unicode character classes the tokenizer needs. Tested by tests/host/tokenizer_test.cc.
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace flux2 {

constexpr char32_t kReplacementCharacter = 0xFFFD;

// `bytes` with every ill-formed sequence replaced by U+FFFD, one per maximal subpart (the
// Unicode "best practice" that Python's errors="replace", Rust's from_utf8_lossy and the WHATWG
// decoder used by JavaScript all follow). Surrogates (ED A0..BF xx) and overlongs are ill-formed.
// Returns valid UTF-8; valid input comes back unchanged.
std::string utf8_replace_invalid(absl::string_view bytes);

// Decodes the code point starting at text[pos]; `text` must be valid UTF-8 and pos < size.
// Sets *length to its byte length (1..4).
char32_t utf8_decode(absl::string_view text, size_t pos, int* length);

// Appends the UTF-8 encoding of `code_point` (a Unicode scalar value).
void utf8_append(char32_t code_point, std::string* out);

// Unicode White_Space (what Oniguruma's and Rust regex's \s match).
bool unicode_is_white_space(char32_t code_point);

// A word character as Rust regex's Unicode \w defines it (Alphabetic, marks, decimal digits,
// connector punctuation, join controls), from the utf8proc category tables. Used by the
// `single_word` flag of added tokens.
bool unicode_is_word_character(char32_t code_point);

}  // namespace flux2
