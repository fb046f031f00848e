// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (Qwen2/Qwen3 family), the
// Qwen3 chat template FLUX.2-klein uses, and max-length padding/truncation.
// Tested by tests/tokenizer/ (a 200+ string corpus against Hugging Face `tokenizers`) and
// `flux2 check-golden --only tokenizer`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flux2 {

class Tokenizer {
 public:
  // Reads `dir`/tokenizer.json (and tokenizer_config.json when present).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> load(const std::string& dir);
  virtual ~Tokenizer() = default;

  // Token ids of `text` without adding special tokens; special/added tokens written in the text
  // are recognised. Invalid UTF-8 is replaced (U+FFFD), never an error.
  virtual std::vector<int32_t> encode(absl::string_view text) const = 0;
  // The id of a token string (e.g. "<|endoftext|>"), or -1.
  virtual int32_t token_id(absl::string_view token) const = 0;
};

// The Qwen3 chat template for one user turn with the generation prompt and thinking disabled:
// "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n".
std::string qwen3_chat_prompt(absl::string_view prompt);

struct TokenizedPrompt {
  std::vector<int32_t> ids;  // exactly max_length ids: the tokens, then <|endoftext|> padding
  int64_t num_tokens = 0;    // unpadded length (the attention mask is 1 for the first num_tokens)
  bool truncated = false;    // the templated prompt had more than max_length tokens
};

// qwen3_chat_prompt -> encode -> truncate to max_length -> right-pad with <|endoftext|>.
TokenizedPrompt tokenize_prompt(const Tokenizer& tokenizer, absl::string_view prompt,
                                int64_t max_length);

}  // namespace flux2
