// The Hugging Face tokenizer.json pipeline (added tokens -> normalizer -> pre-tokenizer -> BPE) for
// byte-level BPE files (Qwen3, Tekken), and prompt truncation and padding; see tokenizer.h.
// Tested by tests/host/tokenizer_test.cc, tests/tokenizer/ and `flux2 check-golden --only
// tokenizer`.
#include "model/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <unordered_map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "model/bpe_model.h"
#include "model/json_util.h"
#include "model/tokenizer_added_tokens.h"
#include "model/tokenizer_normalizer.h"
#include "model/tokenizer_pre_tokenizer.h"
#include "model/tokenizer_utf8.h"

namespace flux2 {
namespace {

absl::StatusOr<AddedToken> parse_added_token(const nlohmann::json& entry, int64_t id,
                                             const std::string& where) {
  if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has no \"content\" string"));
  }
  if (id < 0 || id > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has an invalid id ", id));
  }
  const auto flag = [&](const char* key, bool fallback) {
    return entry.contains(key) && entry[key].is_boolean() ? entry[key].get<bool>() : fallback;
  };
  AddedToken token;
  token.content = entry["content"].get<std::string>();
  token.id = static_cast<int32_t>(id);
  token.special = flag("special", false);
  token.single_word = flag("single_word", false);
  token.lstrip = flag("lstrip", false);
  token.rstrip = flag("rstrip", false);
  // Hugging Face's default: special tokens are not normalized, others are.
  token.normalized = flag("normalized", !token.special);
  return token;
}

class HfTokenizer final : public Tokenizer {
 public:
  // `json` is tokenizer.json, `config` tokenizer_config.json or null; `path` and `config_path`
  // name them in errors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> create(const nlohmann::json& json,
                                                           const nlohmann::json& config,
                                                           const std::string& path,
                                                           const std::string& config_path);

  std::vector<int32_t> encode(absl::string_view text) const override;
  int32_t token_id(absl::string_view token) const override;

 private:
  void encode_normalized(absl::string_view text, std::vector<int32_t>* ids) const;

  std::unique_ptr<BpeModel> bpe_;
  TokenizerNormalizer normalizer_;
  TokenizerPreTokenizer pre_tokenizer_;
  AddedTokenMatcher raw_tokens_;         // added tokens with normalized=false
  AddedTokenMatcher normalized_tokens_;  // added tokens with normalized=true (content normalized)
  std::unordered_map<std::string, int32_t> added_ids_;
};

absl::StatusOr<std::unique_ptr<Tokenizer>> HfTokenizer::create(const nlohmann::json& json,
                                                               const nlohmann::json& config,
                                                               const std::string& path,
                                                               const std::string& config_path) {
  if (!json.is_object()) return absl::InvalidArgumentError(path + ": not a JSON object");

  std::unique_ptr<HfTokenizer> tokenizer(new HfTokenizer());
  if (!json.contains("model")) return absl::InvalidArgumentError(path + ": missing \"model\"");
  auto bpe = BpeModel::from_json(json["model"], path);
  if (!bpe.ok()) return bpe.status();
  tokenizer->bpe_ = std::move(*bpe);
  const nlohmann::json null_value;
  const auto field = [&](const char* key) -> const nlohmann::json& {
    return json.contains(key) ? json[key] : null_value;
  };
  auto normalizer = TokenizerNormalizer::from_json(field("normalizer"), path);
  if (!normalizer.ok()) return normalizer.status();
  tokenizer->normalizer_ = std::move(*normalizer);
  auto pre_tokenizer = TokenizerPreTokenizer::from_json(field("pre_tokenizer"), path);
  if (!pre_tokenizer.ok()) return pre_tokenizer.status();
  tokenizer->pre_tokenizer_ = std::move(*pre_tokenizer);

  std::vector<AddedToken> added;
  const nlohmann::json& added_json = field("added_tokens");
  if (!added_json.is_null() && !added_json.is_array()) {
    return absl::InvalidArgumentError(path + ": \"added_tokens\" is not an array");
  }
  for (size_t i = 0; i < added_json.size(); ++i) {
    const nlohmann::json& entry = added_json[i];
    const std::string where = absl::StrCat(path, ": added_tokens[", i, "]");
    if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has no integer \"id\""));
    }
    auto token = parse_added_token(entry, entry["id"].get<int64_t>(), where);
    if (!token.ok()) return token.status();
    added.push_back(std::move(*token));
  }

  // transformers also reads tokenizer_config.json: tokens of its added_tokens_decoder that
  // tokenizer.json lacks are added, and split_special_tokens=true stops matching special tokens.
  bool split_special_tokens = false;
  if (!config.is_null() && !config.is_object()) {
    return absl::InvalidArgumentError(config_path + ": not a JSON object");
  }
  if (config.is_object()) {
    if (config.contains("split_special_tokens") && config["split_special_tokens"].is_boolean()) {
      split_special_tokens = config["split_special_tokens"].get<bool>();
    }
    if (config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object()) {
      for (const auto& [key, entry] : config["added_tokens_decoder"].items()) {
        const std::string where =
            absl::StrCat(config_path, ": added_tokens_decoder[\"", key, "\"]");
        int64_t id = -1;
        if (!absl::SimpleAtoi(key, &id)) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": key is not a token id"));
        }
        auto token = parse_added_token(entry, id, where);
        if (!token.ok()) return token.status();
        const bool known = std::any_of(added.begin(), added.end(), [&](const AddedToken& t) {
          return t.content == token->content;
        });
        if (!known) added.push_back(std::move(*token));
      }
    }
  }

  std::vector<AddedToken> raw;
  std::vector<AddedToken> normalized;
  for (AddedToken& token : added) {
    tokenizer->added_ids_[token.content] = token.id;
    if (split_special_tokens && token.special) continue;
    if (token.normalized) {
      token.content = tokenizer->normalizer_.apply(token.content);
      normalized.push_back(std::move(token));
    } else {
      raw.push_back(std::move(token));
    }
  }
  tokenizer->raw_tokens_ = AddedTokenMatcher(std::move(raw));
  tokenizer->normalized_tokens_ = AddedTokenMatcher(std::move(normalized));
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

std::vector<int32_t> HfTokenizer::encode(absl::string_view text) const {
  const std::string valid = utf8_replace_invalid(text);
  const absl::string_view input(valid);
  std::vector<int32_t> ids;
  ids.reserve(input.size() / 3 + 8);
  // Added tokens in the raw text first; the rest is normalized, searched for normalized added
  // tokens, pre-tokenized and merged (Hugging Face's AddedVocabulary::extract_and_normalize).
  for (const TextPiece& piece : raw_tokens_.split(input)) {
    if (piece.id >= 0) {
      ids.push_back(piece.id);
      continue;
    }
    const std::string normalized =
        normalizer_.apply(input.substr(piece.begin, piece.end - piece.begin));
    for (const TextPiece& inner : normalized_tokens_.split(normalized)) {
      if (inner.id >= 0) {
        ids.push_back(inner.id);
      } else {
        encode_normalized(
            absl::string_view(normalized).substr(inner.begin, inner.end - inner.begin), &ids);
      }
    }
  }
  return ids;
}

void HfTokenizer::encode_normalized(absl::string_view text, std::vector<int32_t>* ids) const {
  if (text.empty()) return;
  for (const std::string& word : pre_tokenizer_.split(text)) bpe_->encode_word(word, ids);
}

int32_t HfTokenizer::token_id(absl::string_view token) const {
  if (const auto it = added_ids_.find(std::string(token)); it != added_ids_.end()) {
    return it->second;
  }
  return bpe_->token_id(token);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  auto json = read_json_file(path);
  if (!json.ok()) return json.status();
  // transformers also reads tokenizer_config.json when it is there.
  const std::string config_path = dir + "/tokenizer_config.json";
  nlohmann::json config;
  if (std::filesystem::exists(config_path)) {
    auto read = read_json_file(config_path);
    if (!read.ok()) return read.status();
    config = std::move(*read);
  }
  return HfTokenizer::create(*json, config, path, config_path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::from_json(
    const nlohmann::json& tokenizer_json, const nlohmann::json& tokenizer_config,
    const std::string& source) {
  return HfTokenizer::create(tokenizer_json, tokenizer_config, source,
                             absl::StrCat(source, " (tokenizer_config)"));
}

TokenizedPrompt tokenize_prompt(const Tokenizer& tokenizer, absl::string_view prompt,
                                int64_t max_length) {
  return tokenize_prompt(tokenizer, PromptFormat::kQwen3Chat, prompt, max_length);
}

TokenizedPrompt tokenize_prompt(const Tokenizer& tokenizer, PromptFormat format,
                                absl::string_view prompt, int64_t max_length) {
  TokenizedPrompt result;
  std::vector<int32_t> ids = tokenizer.encode(chat_prompt(format, prompt));
  const size_t limit = static_cast<size_t>(std::max<int64_t>(max_length, 0));
  result.truncated = ids.size() > limit;
  if (result.truncated) ids.resize(limit);  // keep the first tokens, as transformers does
  result.num_tokens = static_cast<int64_t>(ids.size());
  const int32_t found = tokenizer.token_id(prompt_pad_token(format));
  const int32_t pad_id = found >= 0 ? found : prompt_pad_fallback_id(format);
  ids.resize(limit, pad_id);
  result.ids = std::move(ids);
  return result;
}

}  // namespace flux2
