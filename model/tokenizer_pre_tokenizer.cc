// Pre-tokenization (Split, ByteLevel, Sequence) as Hugging Face tokenizers does it; see
// tokenizer_pre_tokenizer.h. Tested by tests/host/tokenizer_test.cc and tests/tokenizer/.
#include "model/tokenizer_pre_tokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/tokenizer_byte_level.h"

namespace flux2 {
namespace {

// The pattern ByteLevel splits with when "use_regex" is true (GPT-2's).
constexpr char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// A span of a word and whether the pattern matched it.
struct Span {
  size_t begin;
  size_t end;
  bool is_match;
};

bool read_bool(const nlohmann::json& object, const char* key, bool fallback) {
  return object.contains(key) && object[key].is_boolean() ? object[key].get<bool>() : fallback;
}

}  // namespace

absl::Status TokenizerPreTokenizer::append_steps(const nlohmann::json& pre_tokenizer,
                                                 absl::string_view source,
                                                 std::vector<Step>* steps) {
  if (pre_tokenizer.is_null()) return absl::OkStatus();
  if (!pre_tokenizer.is_object() || !pre_tokenizer.contains("type") ||
      !pre_tokenizer["type"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": pre_tokenizer has no \"type\""));
  }
  const std::string type = pre_tokenizer["type"].get<std::string>();
  if (type == "Sequence") {
    if (!pre_tokenizer.contains("pretokenizers") || !pre_tokenizer["pretokenizers"].is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": pre_tokenizer Sequence has no \"pretokenizers\" array"));
    }
    for (const nlohmann::json& inner : pre_tokenizer["pretokenizers"]) {
      if (absl::Status status = append_steps(inner, source, steps); !status.ok()) return status;
    }
    return absl::OkStatus();
  }
  Step step;
  if (type == "ByteLevel") {
    step.add_prefix_space = read_bool(pre_tokenizer, "add_prefix_space", true);
    step.use_regex = read_bool(pre_tokenizer, "use_regex", true);
    steps->push_back(std::move(step));
    return absl::OkStatus();
  }
  if (type != "Split") {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": unsupported pre_tokenizer type \"", type, "\""));
  }
  const std::string where = absl::StrCat(source, ": pre_tokenizer Split");
  const nlohmann::json* pattern =
      pre_tokenizer.contains("pattern") ? &pre_tokenizer["pattern"] : nullptr;
  if (pattern != nullptr && pattern->is_object() && pattern->contains("Regex") &&
      (*pattern)["Regex"].is_string()) {
    auto regex = TokenizerRegex::compile_regex((*pattern)["Regex"].get<std::string>(),
                                               absl::StrCat(where, " pattern.Regex"));
    if (!regex.ok()) return regex.status();
    step.pattern = std::move(*regex);
  } else if (pattern != nullptr && pattern->is_object() && pattern->contains("String") &&
             (*pattern)["String"].is_string()) {
    auto literal = TokenizerRegex::compile_literal((*pattern)["String"].get<std::string>(),
                                                   absl::StrCat(where, " pattern.String"));
    if (!literal.ok()) return literal.status();
    step.pattern = std::move(*literal);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"pattern\" must be {\"Regex\": ...} or {\"String\": ...}"));
  }
  const std::string behavior =
      pre_tokenizer.contains("behavior") && pre_tokenizer["behavior"].is_string()
          ? pre_tokenizer["behavior"].get<std::string>()
          : "";
  if (behavior == "Removed") {
    step.behavior = Behavior::kRemoved;
  } else if (behavior == "Isolated") {
    step.behavior = Behavior::kIsolated;
  } else if (behavior == "MergedWithPrevious") {
    step.behavior = Behavior::kMergedWithPrevious;
  } else if (behavior == "MergedWithNext") {
    step.behavior = Behavior::kMergedWithNext;
  } else if (behavior == "Contiguous") {
    step.behavior = Behavior::kContiguous;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unknown \"behavior\" \"", behavior, "\""));
  }
  step.invert = read_bool(pre_tokenizer, "invert", false);
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

absl::StatusOr<TokenizerPreTokenizer> TokenizerPreTokenizer::from_json(
    const nlohmann::json& pre_tokenizer, absl::string_view source) {
  TokenizerPreTokenizer result;
  if (absl::Status status = append_steps(pre_tokenizer, source, &result.steps_); !status.ok()) {
    return status;
  }
  for (const Step& step : result.steps_) {
    if (step.pattern == nullptr && step.use_regex && result.gpt2_pattern_ == nullptr) {
      auto gpt2 = TokenizerRegex::compile_regex(kGpt2Pattern, "ByteLevel pattern");
      if (!gpt2.ok()) return gpt2.status();
      result.gpt2_pattern_ = std::move(*gpt2);
    }
  }
  return result;
}

void TokenizerPreTokenizer::split_by_pattern(const TokenizerRegex& pattern, Behavior behavior,
                                             bool invert, absl::string_view word,
                                             std::vector<std::string>* out) {
  // Matches and the gaps between them cover the word (Hugging Face's Pattern::find_matches).
  std::vector<Span> spans;
  size_t previous = 0;
  for (const TokenizerRegex::Match& match : pattern.find_all(word)) {
    if (match.begin != previous) spans.push_back({previous, match.begin, invert});
    spans.push_back({match.begin, match.end, !invert});
    previous = match.end;
  }
  if (previous != word.size()) spans.push_back({previous, word.size(), invert});

  // Which spans become words (begin, end, keep), following SplitDelimiterBehavior.
  std::vector<Span> words;  // is_match here means "remove"
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Span& span : spans) words.push_back({span.begin, span.end, false});
      break;
    case Behavior::kRemoved:
      words = spans;
      break;
    case Behavior::kContiguous:
      for (const Span& span : spans) {
        if (span.is_match == previous_match && !words.empty()) {
          words.back().end = span.end;
        } else {
          words.push_back({span.begin, span.end, false});
        }
        previous_match = span.is_match;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Span& span : spans) {
        if (span.is_match && !previous_match && !words.empty()) {
          words.back().end = span.end;
        } else {
          words.push_back({span.begin, span.end, false});
        }
        previous_match = span.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !words.empty()) {
          words.back().begin = it->begin;
        } else {
          words.push_back({it->begin, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(words.begin(), words.end());
      break;
  }
  for (const Span& span : words) {
    if (span.is_match || span.end == span.begin) continue;
    out->emplace_back(word.substr(span.begin, span.end - span.begin));
  }
}

std::vector<std::string> TokenizerPreTokenizer::split(absl::string_view piece) const {
  std::vector<std::string> words;
  if (!piece.empty()) words.emplace_back(piece);
  for (const Step& step : steps_) {
    std::vector<std::string> next;
    next.reserve(words.size());
    for (std::string& word : words) {
      if (step.pattern != nullptr) {
        split_by_pattern(*step.pattern, step.behavior, step.invert, word, &next);
        continue;
      }
      // ByteLevel: optional prefix space and GPT-2 split, then every byte becomes one character.
      if (step.add_prefix_space && word[0] != ' ') word.insert(word.begin(), ' ');
      std::vector<std::string> parts;
      if (step.use_regex) {
        split_by_pattern(*gpt2_pattern_, Behavior::kIsolated, false, word, &parts);
      } else {
        parts.push_back(std::move(word));
      }
      for (const std::string& part : parts) next.push_back(byte_level_encode(part));
    }
    words = std::move(next);
  }
  return words;
}

}  // namespace flux2
