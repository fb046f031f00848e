// GPT-2's byte-to-unicode table and the byte-level mapping; see tokenizer_byte_level.h.
// Tested by tests/host/tokenizer_test.cc (ByteLevel*).
#include "model/tokenizer_byte_level.h"

#include "model/tokenizer_utf8.h"

namespace flux2 {
namespace {

bool is_printable_latin1(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

std::array<char32_t, 256> make_alphabet() {
  std::array<char32_t, 256> table{};
  char32_t next = 0x100;  // the first code point past Latin-1
  for (int b = 0; b < 256; ++b) {
    table[b] = is_printable_latin1(b) ? static_cast<char32_t>(b) : next++;
  }
  return table;
}

// The UTF-8 text of each mapped byte (1 or 2 bytes long), so mapping is a table lookup.
std::array<std::string, 256> make_encoded_alphabet() {
  std::array<std::string, 256> encoded;
  for (int b = 0; b < 256; ++b) utf8_append(byte_level_alphabet()[b], &encoded[b]);
  return encoded;
}

}  // namespace

const std::array<char32_t, 256>& byte_level_alphabet() {
  static const std::array<char32_t, 256> table = make_alphabet();
  return table;
}

std::string byte_level_encode(absl::string_view bytes) {
  static const std::array<std::string, 256> encoded = make_encoded_alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) out += encoded[static_cast<unsigned char>(c)];
  return out;
}

}  // namespace flux2
