// GPT-2's byte-level alphabet: every byte maps to one printable code point so that BPE can work on
// any byte string. Tested by tests/host/tokenizer_test.cc (ByteLevel*).
#pragma once

#include <array>
#include <string>

#include "absl/strings/string_view.h"

namespace flux2 {

// Byte b -> code point: printable Latin-1 bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) map to
// themselves; the other 68 bytes map, in increasing order, to U+0100, U+0101, ... (so ' ' is
// U+0120 'Ġ' and '\n' is U+010A 'Ċ').
const std::array<char32_t, 256>& byte_level_alphabet();

// The UTF-8 text of `bytes` mapped through byte_level_alphabet, one code point per byte.
std::string byte_level_encode(absl::string_view bytes);

}  // namespace flux2
