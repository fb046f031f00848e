// UTF-8 repair, decoding and Unicode character classes for the tokenizer; see tokenizer_utf8.h.
// Tested by tests/host/tokenizer_test.cc (Utf8*) and the corpus in tests/tokenizer/.
#include "model/tokenizer_utf8.h"

#include <cstdint>

#include "utf8proc.h"

namespace flux2 {
namespace {

// The valid range of the second byte after lead byte `lead` (Unicode Table 3-7), or {1, 0}
// (empty) when `lead` cannot start a sequence.
struct ByteRange {
  uint8_t low;
  uint8_t high;
};

ByteRange second_byte_range(uint8_t lead) {
  if (lead >= 0xC2 && lead <= 0xDF) return {0x80, 0xBF};
  if (lead == 0xE0) return {0xA0, 0xBF};  // no overlongs
  if (lead == 0xED) return {0x80, 0x9F};  // no surrogates
  if (lead >= 0xE1 && lead <= 0xEF) return {0x80, 0xBF};
  if (lead == 0xF0) return {0x90, 0xBF};  // no overlongs
  if (lead >= 0xF1 && lead <= 0xF3) return {0x80, 0xBF};
  if (lead == 0xF4) return {0x80, 0x8F};  // nothing above U+10FFFF
  return {1, 0};
}

int sequence_length(uint8_t lead) {
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

void append_replacement(std::string* out) {
  out->append("\xEF\xBF\xBD");
}

}  // namespace

std::string utf8_replace_invalid(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t lead = static_cast<uint8_t>(bytes[i]);
    if (lead < 0x80) {
      out.push_back(static_cast<char>(lead));
      ++i;
      continue;
    }
    const ByteRange second = second_byte_range(lead);
    if (second.low > second.high) {  // a continuation byte or C0, C1, F5..FF: never valid
      append_replacement(&out);
      ++i;
      continue;
    }
    const int length = sequence_length(lead);
    // Consume the longest valid prefix (the maximal subpart); one U+FFFD replaces it if the
    // sequence is cut short, and decoding resumes at the first byte that did not fit.
    int consumed = 1;
    while (consumed < length && i + consumed < n) {
      const uint8_t byte = static_cast<uint8_t>(bytes[i + consumed]);
      const uint8_t low = consumed == 1 ? second.low : 0x80;
      const uint8_t high = consumed == 1 ? second.high : 0xBF;
      if (byte < low || byte > high) break;
      ++consumed;
    }
    if (consumed == length) {
      out.append(bytes.data() + i, length);
    } else {
      append_replacement(&out);
    }
    i += consumed;
  }
  return out;
}

char32_t utf8_decode(absl::string_view text, size_t pos, int* length) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[pos + k]); };
  const uint8_t lead = byte(0);
  if (lead < 0x80) {
    *length = 1;
    return lead;
  }
  if (lead < 0xE0) {
    *length = 2;
    return (char32_t{lead & 0x1Fu} << 6) | (byte(1) & 0x3Fu);
  }
  if (lead < 0xF0) {
    *length = 3;
    return (char32_t{lead & 0x0Fu} << 12) | (char32_t{byte(1) & 0x3Fu} << 6) | (byte(2) & 0x3Fu);
  }
  *length = 4;
  return (char32_t{lead & 0x07u} << 18) | (char32_t{byte(1) & 0x3Fu} << 12) |
         (char32_t{byte(2) & 0x3Fu} << 6) | (byte(3) & 0x3Fu);
}

void utf8_append(char32_t code_point, std::string* out) {
  if (code_point < 0x80) {
    out->push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

bool unicode_is_white_space(char32_t c) {
  // The White_Space property (PropList.txt), stable since Unicode 6.3.
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool unicode_is_word_character(char32_t c) {
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  // Other_Alphabetic symbols (circled and squared Latin letters).
  if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
      (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189)) {
    return true;
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace flux2
