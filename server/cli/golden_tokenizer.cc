// check-golden part "tokenizer": for every case of tokenizer_cases.json, `templated` against
// qwen3_chat_prompt and `input_ids`/`attention_mask` against tokenize_prompt, exactly (golden/
// README.md: token ids equal). See golden_check.h; run by tests/tokenizer/ (ctest label
// "tokenizer").
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/json_util.h"
#include "model/tokenizer.h"
#include "server/cli/golden_check.h"

namespace flux2 {
namespace {

constexpr char kFile[] = "tokenizer_cases.json";

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

}  // namespace

void check_golden_tokenizer(const GoldenContext& context, GoldenReport& report) {
  auto cases = read_json_file(context.dir + "/" + kFile);
  if (!cases.ok()) return report.fail(kFile, "-", cases.status().message());
  if (!cases->is_array() || cases->empty()) return report.fail(kFile, "-", "no cases");
  auto tokenizer = Tokenizer::load(context.checkpoint_dir() + "/tokenizer");
  if (!tokenizer.ok()) return report.fail(kFile, "-", tokenizer.status().message());

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
    const std::string label = absl::StrCat(name, "(max_length=", max_length, ")");

    if (item.contains("templated") && item["templated"].is_string()) {
      const bool equal = qwen3_chat_prompt(prompt) == item["templated"].get<std::string>();
      report.record(equal, kFile, label, "templated", equal ? "equal" : "strings differ");
    } else {
      report.record(false, kFile, label, "templated", "missing from the case");
    }

    const TokenizedPrompt tokens = tokenize_prompt(**tokenizer, prompt, max_length);
    const std::vector<int64_t> ids(tokens.ids.begin(), tokens.ids.end());
    std::vector<int64_t> mask(tokens.ids.size(), 0);
    for (int64_t i = 0; i < tokens.num_tokens; ++i) mask[i] = 1;

    std::vector<int64_t> reference;
    bool equal = false;
    if (read_int_array(item, "input_ids", &reference)) {
      const std::string detail = compare_ids(ids, reference, &equal);
      report.record(equal, kFile, label, "input_ids", detail);
    } else {
      report.record(false, kFile, label, "input_ids", "missing or not an integer array");
    }
    if (read_int_array(item, "attention_mask", &reference)) {
      const std::string detail = compare_ids(mask, reference, &equal);
      report.record(equal, kFile, label, "attention_mask", detail);
    } else {
      report.record(false, kFile, label, "attention_mask", "missing or not an integer array");
    }
  }
}

}  // namespace flux2
