// exact_decimal: the shortest decimal text that reads back as a double (std::to_chars), for error
// messages that must show the value the caller gave (100.0001, not printf %g's "100"; 67108864,
// not "6.71089e+07"). Tested by tests/host/small_units_test.cc (ExactDecimal*).
#pragma once

#include <charconv>
#include <string>

namespace flux2 {

inline std::string exact_decimal(double value) {
  char text[64];
  const std::to_chars_result end = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, end.ptr);
}

}  // namespace flux2
