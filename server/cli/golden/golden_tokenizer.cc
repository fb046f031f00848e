// check-golden part "tokenizer": for every case of tokenizer_cases.json, exactly
// (tests/data/README.md: token ids equal), in the prompt format of the checkpoint's pipeline class
// (klein: Qwen3, Flux2Pipeline: Mistral): `templated` against chat_prompt,
// `input_ids`/`attention_mask` against tokenize_prompt, and where the case has them `messages`
// (diffusers' format_input), `ids_unpadded` (the whole templated string) and
// `ids_unpadded_tekken_regex` (the same tokenizer.json with Tekken's own split regex). See
// golden_check.h; run by tests/tokenizer/ (ctest label "tokenizer").
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "model/checkpoint.h"
#include "model/json_util.h"
#include "model/tokenizer.h"
#include "server/cli/golden/golden_check.h"

namespace flux2 {
namespace {

constexpr char kFile[] = "tokenizer_cases.json";

// The split regex of Mistral's tekken.json (mistral-common; transformers' fix_mistral_regex puts
// it in place of a tokenizer.json's). The published Mistral-Small-3.1 tokenizer.json carries Llama
// 3's regex instead, and diffusers keeps it; the two differ where combining marks follow letters.
// tests/tokenizer/CMakeLists.txt runs the corpus with it as well.
constexpr char kTekkenSplitRegex[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// The integer array at item[key], or false when it is missing or not all integers.
bool read_int_array(const nlohmann::json& item, const char* key, std::vector<int64_t>* out) {
  if (!item.contains(key) || !item[key].is_array()) return false;
  out->clear();
  for (const nlohmann::json& value : item[key]) {
    if (!value.is_number_integer()) return false;
    out->push_back(value.get<int64_t>());
  }
  return true;
}

// "equal (n values)" or where the first difference is.
std::string compare_ids(const std::vector<int64_t>& ours, const std::vector<int64_t>& reference,
                        bool* equal) {
  *equal = ours == reference;
  if (*equal) return absl::StrCat("equal (", ours.size(), " values)");
  if (ours.size() != reference.size()) {
    return absl::StrCat("length ", ours.size(), " vs reference ", reference.size());
  }
  size_t i = 0;
  while (ours[i] == reference[i]) ++i;
  return absl::StrCat("first difference at ", i, ": ", ours[i], " vs reference ", reference[i]);
}

// Records the comparison of `ours` with the integer array item[key].
void check_ids(GoldenReport& report, const std::string& label, const nlohmann::json& item,
               const char* key, const std::vector<int32_t>& ours) {
  std::vector<int64_t> reference;
  if (!read_int_array(item, key, &reference)) {
    return report.record(false, kFile, label, key, "missing or not an integer array");
  }
  bool equal = false;
  const std::string detail =
      compare_ids(std::vector<int64_t>(ours.begin(), ours.end()), reference, &equal);
  report.record(equal, kFile, label, key, detail);
}

// The text of a message whose content is a string or a list of {"type": "text"} blocks, or an
// empty string with *ok = false for any other shape.
std::string message_text(const nlohmann::json& message, bool* ok) {
  *ok = false;
  if (!message.is_object() || !message.contains("content")) return "";
  const nlohmann::json& content = message["content"];
  if (content.is_string()) {
    *ok = true;
    return content.get<std::string>();
  }
  if (!content.is_array()) return "";
  std::string text;
  for (const nlohmann::json& block : content) {
    if (!block.is_object() || block.value("type", "") != "text" || !block.contains("text") ||
        !block["text"].is_string()) {
      return "";
    }
    text += block["text"].get<std::string>();
  }
  *ok = true;
  return text;
}

// diffusers' format_input for FLUX.2-dev: [system: kFlux2DevSystemMessage, user: the prompt
// without "[IMG]"].
std::string check_messages(const nlohmann::json& messages, const std::string& prompt) {
  if (!messages.is_array() || messages.size() != 2) return "not an array of 2 messages";
  const char* roles[2] = {"system", "user"};
  const std::string texts[2] = {kFlux2DevSystemMessage,
                                absl::StrReplaceAll(prompt, {{"[IMG]", ""}})};
  for (size_t i = 0; i < 2; ++i) {
    if (!messages[i].is_object() || messages[i].value("role", "") != roles[i]) {
      return absl::StrCat("message ", i, " is not the ", roles[i], " turn");
    }
    bool ok = false;
    const std::string text = message_text(messages[i], &ok);
    if (!ok) return absl::StrCat("message ", i, ": content is not text");
    if (text != texts[i]) return absl::StrCat("the ", roles[i], " text differs");
  }
  return "";
}

// `tokenizer_json` with the regex of its first Split pre-tokenizer replaced by `regex` (as
// transformers' fix_mistral_regex does); false when it has no Split with a regex.
bool replace_split_regex(nlohmann::json& tokenizer_json, const std::string& regex) {
  if (!tokenizer_json.is_object() || !tokenizer_json.contains("pre_tokenizer")) return false;
  nlohmann::json& pre_tokenizer = tokenizer_json["pre_tokenizer"];
  std::vector<nlohmann::json*> candidates = {&pre_tokenizer};
  if (pre_tokenizer.is_object() && pre_tokenizer.value("type", "") == "Sequence" &&
      pre_tokenizer.contains("pretokenizers") && pre_tokenizer["pretokenizers"].is_array()) {
    candidates.clear();
    for (nlohmann::json& step : pre_tokenizer["pretokenizers"]) candidates.push_back(&step);
  }
  for (nlohmann::json* step : candidates) {
    if (step->is_object() && step->value("type", "") == "Split" && step->contains("pattern") &&
        (*step)["pattern"].is_object() && (*step)["pattern"].contains("Regex")) {
      (*step)["pattern"]["Regex"] = regex;
      return true;
    }
  }
  return false;
}

// The checkpoint's tokenizer with kTekkenSplitRegex as its split regex.
absl::StatusOr<std::unique_ptr<Tokenizer>> load_with_tekken_regex(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  auto json = read_json_file(path);
  if (!json.ok()) return json.status();
  if (!replace_split_regex(*json, kTekkenSplitRegex)) {
    return absl::InvalidArgumentError(path + ": no Split pre-tokenizer with a regex to replace");
  }
  auto config = read_json_file(dir + "/tokenizer_config.json");
  if (!config.ok()) return config.status();
  return Tokenizer::from_json(*json, *config, path + " (Tekken regex)");
}

}  // namespace

void check_golden_tokenizer(const GoldenContext& context, GoldenReport& report) {
  auto cases = read_json_file(context.dir + "/" + kFile);
  if (!cases.ok()) return report.fail(kFile, "-", cases.status().message());
  if (!cases->is_array() || cases->empty()) return report.fail(kFile, "-", "no cases");
  auto index = ModelIndex::read(context.checkpoint_dir());
  if (!index.ok()) return report.fail(kFile, "-", index.status().message());
  auto format = prompt_format_for_pipeline(index->class_name);
  if (!format.ok()) return report.fail(kFile, "-", format.status().message());
  const std::string tokenizer_dir = context.checkpoint_dir() + "/tokenizer";
  auto tokenizer = Tokenizer::load(tokenizer_dir);
  if (!tokenizer.ok()) return report.fail(kFile, "-", tokenizer.status().message());
  std::unique_ptr<Tokenizer> tekken_regex;  // loaded for the first case that needs it

  for (size_t k = 0; k < cases->size(); ++k) {
    const nlohmann::json& item = (*cases)[k];
    const std::string name = absl::StrCat("case", k);
    if (!item.is_object() || !item.contains("prompt") || !item["prompt"].is_string() ||
        !item.contains("max_length") || !item["max_length"].is_number_integer()) {
      report.fail(kFile, name, "missing prompt (string) or max_length (integer)");
      continue;
    }
    const std::string prompt = item["prompt"].get<std::string>();
    const int64_t max_length = item["max_length"].get<int64_t>();
    const std::string label =
        absl::StrCat(name, "(", prompt_format_name(*format), ", max_length=", max_length, ")");

    if (item.contains("messages")) {
      const std::string problem = *format == PromptFormat::kMistralSmall3Chat
                                      ? check_messages(item["messages"], prompt)
                                      : "messages are only known for the Mistral format";
      report.record(problem.empty(), kFile, label, "messages", problem.empty() ? "equal" : problem);
    }
    const std::string templated = chat_prompt(*format, prompt);
    if (item.contains("templated") && item["templated"].is_string()) {
      const bool equal = templated == item["templated"].get<std::string>();
      report.record(equal, kFile, label, "templated", equal ? "equal" : "strings differ");
    } else {
      report.record(false, kFile, label, "templated", "missing from the case");
    }

    const TokenizedPrompt tokens = tokenize_prompt(**tokenizer, *format, prompt, max_length);
    std::vector<int32_t> mask(tokens.ids.size(), 0);
    for (int64_t i = 0; i < tokens.num_tokens; ++i) mask[i] = 1;
    check_ids(report, label, item, "input_ids", tokens.ids);
    check_ids(report, label, item, "attention_mask", mask);
    if (item.contains("ids_unpadded")) {
      check_ids(report, label, item, "ids_unpadded", (*tokenizer)->encode(templated));
    }
    if (item.contains("ids_unpadded_tekken_regex")) {
      if (tekken_regex == nullptr) {
        auto loaded = load_with_tekken_regex(tokenizer_dir);
        if (!loaded.ok()) {
          report.record(false, kFile, label, "ids_unpadded_tekken_regex",
                        loaded.status().message());
          continue;
        }
        tekken_regex = std::move(*loaded);
      }
      check_ids(report, label, item, "ids_unpadded_tekken_regex", tekken_regex->encode(templated));
    }
  }
}

}  // namespace flux2
