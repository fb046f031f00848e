// `flux2 tokenize --tokenizer DIR [--format qwen3|mistral [--max-length N]]`: one JSON string per
// line on stdin -> one JSON array of token ids per line on stdout (no special tokens added; special
// tokens written in the text are recognised), so that the tokenizer can be compared with other
// implementations. With --format each line is a prompt rendered through that chat template first,
// and with --max-length also truncated and padded as the pipeline does (tokenize_prompt).
// Tested by tests/tokenizer/ (the corpora against Hugging Face tokenizers, and bad input lines).
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "model/tokenizer.h"
#include "model/tokenizer_utf8.h"
#include "server/cli/commands.h"
#include "server/common/command_line.h"

namespace flux2 {
namespace {

bool is_json_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Reads the 4 hex digits of a \u escape at line[pos].
absl::StatusOr<char32_t> read_hex4(const std::string& line, size_t pos) {
  if (pos + 4 > line.size()) return absl::InvalidArgumentError("truncated \\u escape");
  char32_t value = 0;
  for (size_t k = 0; k < 4; ++k) {
    const int digit = hex_value(line[pos + k]);
    if (digit < 0) return absl::InvalidArgumentError("\\u escape needs 4 hex digits");
    value = value * 16 + static_cast<char32_t>(digit);
  }
  return value;
}

// The bytes of the JSON string that `line` holds (whitespace around it allowed). Raw bytes that
// are not valid UTF-8 are kept as they are, so invalid input reaches the tokenizer, which
// replaces it; an unpaired surrogate escape becomes U+FFFD, as in JavaScript -> Rust conversion.
absl::StatusOr<std::string> parse_json_string_line(const std::string& line) {
  size_t pos = 0;
  while (pos < line.size() && is_json_space(line[pos])) ++pos;
  if (pos == line.size())
    return absl::InvalidArgumentError("expected a JSON string, got an empty line");
  if (line[pos] != '"')
    return absl::InvalidArgumentError("expected a JSON string (starting with '\"')");
  ++pos;
  std::string out;
  while (true) {
    if (pos >= line.size()) return absl::InvalidArgumentError("unterminated JSON string");
    const char c = line[pos];
    if (c == '"') {
      ++pos;
      break;
    }
    if (static_cast<unsigned char>(c) < 0x20) {
      return absl::InvalidArgumentError(absl::StrCat("control character 0x",
                                                     absl::Hex(static_cast<unsigned char>(c)),
                                                     " must be escaped in a JSON string"));
    }
    if (c != '\\') {
      out.push_back(c);
      ++pos;
      continue;
    }
    if (pos + 1 >= line.size()) return absl::InvalidArgumentError("unterminated escape");
    const char escaped = line[pos + 1];
    pos += 2;
    switch (escaped) {
      case '"':
        out.push_back('"');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '/':
        out.push_back('/');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'u': {
        auto unit = read_hex4(line, pos);
        if (!unit.ok()) return unit.status();
        pos += 4;
        char32_t code_point = *unit;
        if (code_point >= 0xD800 && code_point <= 0xDBFF) {
          // A high surrogate pairs with an immediately following \u low surrogate.
          if (pos + 6 <= line.size() && line[pos] == '\\' && line[pos + 1] == 'u') {
            auto low = read_hex4(line, pos + 2);
            if (!low.ok()) return low.status();
            if (*low >= 0xDC00 && *low <= 0xDFFF) {
              code_point = 0x10000 + ((code_point - 0xD800) << 10) + (*low - 0xDC00);
              pos += 6;
            } else {
              code_point = kReplacementCharacter;
            }
          } else {
            code_point = kReplacementCharacter;
          }
        } else if (code_point >= 0xDC00 && code_point <= 0xDFFF) {
          code_point = kReplacementCharacter;
        }
        utf8_append(code_point, &out);
        break;
      }
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("invalid escape \\", std::string(1, escaped)));
    }
  }
  while (pos < line.size() && is_json_space(line[pos])) ++pos;
  if (pos != line.size()) return absl::InvalidArgumentError("text after the closing '\"'");
  return out;
}

}  // namespace

int run_tokenize(int argc, char** argv, int first) {
  CommandLine app("flux2 tokenize");
  std::string tokenizer_dir, format_name;
  int64_t max_length = -1;  // absent: no truncation or padding
  app.add_option("--tokenizer", tokenizer_dir);
  app.add_option("--format", format_name);
  app.add_option("--max-length", max_length);
  absl::StatusOr<std::vector<std::string>> words = app.parse_words(argc, argv, first);
  if (!words.ok()) {
    std::fprintf(stderr, "flux2 tokenize: %s\n", std::string(words.status().message()).c_str());
    return 2;
  }
  if (!app.count("--tokenizer") || !words->empty() ||
      (app.count("--max-length") && !app.count("--format"))) {
    std::fprintf(
        stderr,
        "usage: flux2 tokenize --tokenizer DIR [--format qwen3|mistral [--max-length N]]"
        " < lines.jsonl\n"
        "  DIR holds tokenizer.json; each stdin line is one JSON string, each stdout line\n"
        "  the JSON array of its token ids (no special tokens added). --format renders each\n"
        "  line through that chat template first; --max-length then truncates and pads\n"
        "  to N ids as the pipeline does\n");
    return 2;
  }
  std::optional<PromptFormat> format;
  if (app.count("--format")) {
    auto parsed = prompt_format_from_name(format_name);
    if (!parsed.ok()) {
      std::fprintf(stderr, "flux2 tokenize: --format: %s\n",
                   std::string(parsed.status().message()).c_str());
      return 2;
    }
    format = *parsed;
  }
  if (app.count("--max-length") && max_length < 0) {
    std::fprintf(stderr, "flux2 tokenize: --max-length needs a non-negative integer\n");
    return 2;
  }
  auto tokenizer = Tokenizer::load(tokenizer_dir);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "flux2 tokenize: %s\n", std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  std::ios::sync_with_stdio(false);
  std::string line;
  int64_t line_number = 0;
  while (std::getline(std::cin, line)) {
    ++line_number;
    auto text = parse_json_string_line(line);
    if (!text.ok()) {
      std::fflush(stdout);
      std::cout.flush();
      std::fprintf(stderr, "flux2 tokenize: stdin line %lld: %s\n",
                   static_cast<long long>(line_number),
                   std::string(text.status().message()).c_str());
      return 1;
    }
    std::string out = "[";
    bool first_id = true;
    std::vector<int32_t> ids;
    if (!format.has_value()) {
      ids = (*tokenizer)->encode(*text);
    } else if (max_length < 0) {
      ids = (*tokenizer)->encode(chat_prompt(*format, *text));
    } else {
      ids = tokenize_prompt(**tokenizer, *format, *text, max_length).ids;
    }
    for (const int32_t id : ids) {
      if (!first_id) out.push_back(',');
      absl::StrAppend(&out, id);
      first_id = false;
    }
    out += "]\n";
    std::cout << out;
    std::cout.flush();  // one answer per line, so the command can serve as a co-process
  }
  return 0;
}

}  // namespace flux2
