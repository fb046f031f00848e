// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (Qwen3's for FLUX.2-klein,
// Tekken's for FLUX.2-dev), and prompts through a chat template (chat_template.h) with max-length
// truncation and padding.
// Tested by tests/tokenizer/ (a 200+ string corpus against Hugging Face `tokenizers`) and
// `flux2 check-golden --only tokenizer`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/chat_template.h"
#include "nlohmann/json_fwd.hpp"

namespace flux2 {

class Tokenizer {
 public:
  // Reads `dir`/tokenizer.json (and tokenizer_config.json when present).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> load(const std::string& dir);
  // From parsed files: `tokenizer_json` as tokenizer.json holds it, `tokenizer_config` as
  // tokenizer_config.json does (null when there is none). `source` names the tokenizer.json in
  // errors. For tokenizers edited in memory (tests, a replaced pre-tokenizer regex).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> from_json(
      const nlohmann::json& tokenizer_json, const nlohmann::json& tokenizer_config,
      const std::string& source);
  virtual ~Tokenizer() = default;

  // Token ids of `text` without adding special tokens; special/added tokens written in the text
  // are recognised. Invalid UTF-8 is replaced (U+FFFD), never an error.
  virtual std::vector<int32_t> encode(absl::string_view text) const = 0;
  // The id of a token string (e.g. "<|endoftext|>"), or -1.
  virtual int32_t token_id(absl::string_view token) const = 0;
};

struct TokenizedPrompt {
  std::vector<int32_t> ids;  // exactly max_length ids: the tokens, then the format's pad token
  int64_t num_tokens = 0;    // unpadded length (the attention mask is 1 for the first num_tokens)
  bool truncated = false;    // the templated prompt had more than max_length tokens
};

// chat_prompt(format, prompt) -> encode (no special tokens added: the template carries them) ->
// keep the first max_length ids (so a long prompt loses its closing tokens, e.g. [/INST], as in
// transformers) -> right-pad with prompt_pad_token(format) to max_length. max_length <= 0 gives
// no ids.
TokenizedPrompt tokenize_prompt(const Tokenizer& tokenizer, PromptFormat format,
                                absl::string_view prompt, int64_t max_length);
// The Qwen3 format (FLUX.2-klein): tokenize_prompt(tokenizer, PromptFormat::kQwen3Chat, ...).
TokenizedPrompt tokenize_prompt(const Tokenizer& tokenizer, absl::string_view prompt,
                                int64_t max_length);

}  // namespace flux2
