// PCRE2-backed split patterns with Oniguruma find_iter semantics; see tokenizer_regex.h.
// Tested by tests/host/tokenizer_test.cc (TokenizerRegex*) and the corpus in tests/tokenizer/.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/tokenizer_regex.h"

#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/tokenizer_unicode_additions.h"

namespace flux2 {
namespace {

// Unicode White_Space as bracket-class items: TAB..CR, NEL and the separators (Zs, Zl, Zp).
constexpr char kWhiteSpaceItems[] = "\\t-\\r\\x{85}\\p{Z}";
// PCRE2's JIT starts on a 32 KiB machine-stack area; a match that needs more retries on a
// dedicated stack that can grow to this size.
constexpr size_t kJitStackMaxBytes = size_t{64} << 20;

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

bool is_continuation_byte(char c) {
  return (static_cast<uint8_t>(c) & 0xC0) == 0x80;
}

// Bracket-class items ("\x{1E4F0}-\x{1E4F9}...") for the code points of `category` that PCRE2's
// tables lack (tokenizer_unicode_additions.h): a one-letter category ("L") takes every L*, a
// two-letter one only itself. Empty for other property names (scripts, "Any", ...).
std::string unicode_addition_items(absl::string_view category) {
  std::string items;
  if (category.empty() || category.size() > 2) return items;
  for (size_t k = 0; k < kUnicodeAdditionsSize; ++k) {
    const UnicodeAddition& range = kUnicodeAdditions[k];
    if (absl::string_view(range.category).substr(0, category.size()) != category) continue;
    absl::StrAppendFormat(&items, "\\x{%X}", static_cast<uint32_t>(range.first));
    if (range.last != range.first) {
      absl::StrAppendFormat(&items, "-\\x{%X}", static_cast<uint32_t>(range.last));
    }
  }
  return items;
}

}  // namespace

struct TokenizerRegex::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

TokenizerRegex::TokenizerRegex(std::unique_ptr<Compiled> compiled)
    : compiled_(std::move(compiled)) {}
TokenizerRegex::~TokenizerRegex() = default;

std::string oniguruma_compatible_pattern(absl::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  bool at_class_start = false;  // right after '[' or '[^', where ']' is a literal
  size_t i = 0;
  const size_t n = pattern.size();
  while (i < n) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < n) {
      const char escaped = pattern[i + 1];
      if (escaped == 'p' || escaped == 'P') {
        // \p{Xx} or \pX: a general category gets the code points PCRE2's tables lack. \P
        // outside a class becomes the negated class; inside one it is left as it is (a class
        // item cannot subtract), as are other property names.
        size_t stop = i + 2;
        absl::string_view name;
        if (stop < n && pattern[stop] == '{') {
          const size_t close = pattern.find('}', stop);
          if (close != absl::string_view::npos) {
            name = pattern.substr(stop + 1, close - stop - 1);
            stop = close + 1;
          }
        } else if (stop < n) {
          name = pattern.substr(stop, 1);
          stop += 1;
        }
        const absl::string_view original = pattern.substr(i, stop - i);
        const std::string items = unicode_addition_items(name);
        const bool negated = escaped == 'P';
        if (items.empty() || (negated && in_class)) {
          out.append(original.data(), original.size());
        } else {
          const std::string positive = absl::StrCat("\\p{", name, "}", items);
          out += in_class ? positive : absl::StrCat(negated ? "[^" : "[", positive, "]");
        }
        i = stop;
        at_class_start = false;
        continue;
      }
      if (escaped == 's') {
        out += in_class ? std::string(kWhiteSpaceItems) : absl::StrCat("[", kWhiteSpaceItems, "]");
      } else if (escaped == 'S' && !in_class) {
        out += absl::StrCat("[^", kWhiteSpaceItems, "]");
      } else if (escaped == 'Q') {  // \Q...\E quotes everything up to \E
        const size_t close = pattern.find("\\E", i + 2);
        const size_t stop = close == absl::string_view::npos ? n : close + 2;
        out.append(pattern.data() + i, stop - i);
        i = stop;
        at_class_start = false;
        continue;
      } else {
        out.push_back(c);
        out.push_back(escaped);
      }
      i += 2;
      at_class_start = false;
      continue;
    }
    if (in_class) {
      if (c == '[' && i + 1 < n && pattern[i + 1] == ':') {  // POSIX class [:name:]
        const size_t close = pattern.find(":]", i + 2);
        const size_t stop = close == absl::string_view::npos ? n : close + 2;
        out.append(pattern.data() + i, stop - i);
        i = stop;
        at_class_start = false;
        continue;
      }
      if (c == ']' && !at_class_start) in_class = false;
      at_class_start = false;
      out.push_back(c);
      ++i;
      continue;
    }
    out.push_back(c);
    ++i;
    if (c == '[') {
      in_class = true;
      at_class_start = true;
      if (i < n && pattern[i] == '^') {
        out.push_back('^');
        ++i;
      }
    }
  }
  return out;
}

namespace {

absl::StatusOr<pcre2_code*> compile_pcre2(absl::string_view pattern, uint32_t options,
                                          absl::string_view source) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": pattern does not compile at offset ",
                                                   error_offset, ": ",
                                                   pcre2_error_text(error_code)));
  }
  // JIT is an optimisation only: when it is unavailable pcre2_match interprets.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return code;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenizerRegex>> TokenizerRegex::compile_regex(
    absl::string_view pattern, absl::string_view source) {
  auto compiled = std::make_unique<Compiled>();
  auto code = compile_pcre2(oniguruma_compatible_pattern(pattern), PCRE2_UTF | PCRE2_UCP, source);
  if (!code.ok()) return code.status();
  compiled->code = *code;
  return std::unique_ptr<TokenizerRegex>(new TokenizerRegex(std::move(compiled)));
}

absl::StatusOr<std::unique_ptr<TokenizerRegex>> TokenizerRegex::compile_literal(
    absl::string_view text, absl::string_view source) {
  auto compiled = std::make_unique<Compiled>();
  auto code = compile_pcre2(text, PCRE2_LITERAL | PCRE2_UTF, source);
  if (!code.ok()) return code.status();
  compiled->code = *code;
  return std::unique_ptr<TokenizerRegex>(new TokenizerRegex(std::move(compiled)));
}

std::vector<TokenizerRegex::Match> TokenizerRegex::find_all(absl::string_view text) const {
  std::vector<Match> matches;
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t search_from = 0;
  bool have_previous = false;
  size_t previous_end = 0;
  while (search_from <= n) {
    int rc =
        pcre2_match(compiled_->code, subject, n, search_from, PCRE2_NO_UTF_CHECK, data, context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_stack == nullptr) {
      jit_stack = pcre2_jit_stack_create(32 << 10, kJitStackMaxBytes, nullptr);
      context = pcre2_match_context_create(nullptr);
      pcre2_jit_stack_assign(context, nullptr, jit_stack);
      rc = pcre2_match(compiled_->code, subject, n, search_from, PCRE2_NO_UTF_CHECK, data, context);
    }
    if (rc < 0) break;  // no match, or a resource limit (see the header)
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (begin == end && have_previous && previous_end == end) {
      // An empty match right after the previous match: step over one character and retry.
      if (search_from >= n) break;
      size_t step = 1;
      while (search_from + step < n && is_continuation_byte(text[search_from + step])) ++step;
      search_from += step;
      continue;
    }
    matches.push_back({begin, end});
    search_from = end;
    have_previous = true;
    previous_end = end;
  }
  if (context != nullptr) pcre2_match_context_free(context);
  if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
  pcre2_match_data_free(data);
  return matches;
}

}  // namespace flux2
