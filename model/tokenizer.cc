// Placeholder until the byte-level BPE lands (issue 3): every entry point reports Unimplemented.
#include "model/tokenizer.h"

namespace flux2 {

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& dir) {
  return absl::UnimplementedError("tokenizer: not implemented yet");
}

std::string qwen3_chat_prompt(absl::string_view prompt) {
  return "<|im_start|>user\n" + std::string(prompt) +
         "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
}

TokenizedPrompt tokenize_prompt(const Tokenizer& tokenizer, absl::string_view prompt,
                                int64_t max_length) {
  return {};
}

}  // namespace flux2
