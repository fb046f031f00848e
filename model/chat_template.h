// The chat templates that turn a user prompt into the text the tokenizer encodes, as diffusers
// renders them: Qwen3's (FLUX.2-klein) and Mistral-Small-3.1's (FLUX.2-dev), with each format's
// padding token. Tested by tests/host/tokenizer_test.cc (ChatTemplate*) and
// `flux2 check-golden --only tokenizer` on tiny-klein and tiny-flux2-dev.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flux2 {

// Which text encoder's chat template a prompt is rendered with.
enum class PromptFormat : uint8_t {
  kQwen3Chat,          // FLUX.2-klein: Qwen3, one user turn, thinking disabled, <|endoftext|> pad
  kMistralSmall3Chat,  // FLUX.2-dev: Mistral-Small-3.1 with diffusers' system message, <pad> pad
};

// The Qwen3 chat template for one user turn with the generation prompt and thinking disabled:
// "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n".
std::string qwen3_chat_prompt(absl::string_view prompt);

// diffusers' SYSTEM_MESSAGE for FLUX.2-dev (pipelines/flux2/system_messages.py; 28 Tekken tokens,
// one newline inside).
extern const char kFlux2DevSystemMessage[];

// The Mistral-Small-3.1 chat template as diffusers' Flux2Pipeline renders it (format_input, no
// generation prompt): "<s>[SYSTEM_PROMPT]{kFlux2DevSystemMessage}[/SYSTEM_PROMPT][INST]{prompt}
// [/INST]" with every "[IMG]" removed from the prompt (one left-to-right pass, as Python's
// str.replace). Invalid UTF-8 in `prompt` is replaced by U+FFFD first, as decoding to a Python
// str would, so that removing "[IMG]" cannot join the bytes around it into a character.
std::string mistral_chat_prompt(absl::string_view prompt);

// The rendered template of `format`.
std::string chat_prompt(PromptFormat format, absl::string_view prompt);

// The token `format` pads with ("<|endoftext|>" or "<pad>"), and its id in the published
// tokenizer (151643 in Qwen3's, 11 in Tekken's), used when a tokenizer lacks the token.
absl::string_view prompt_pad_token(PromptFormat format);
int32_t prompt_pad_fallback_id(PromptFormat format);

// "qwen3" or "mistral" (for logs and command-line flags), and back; an unknown name is an
// InvalidArgument error listing the known ones.
absl::string_view prompt_format_name(PromptFormat format);
absl::StatusOr<PromptFormat> prompt_format_from_name(absl::string_view name);

// The format of a diffusers pipeline class (model_index.json "_class_name"): Flux2Pipeline is
// FLUX.2-dev (Mistral), Flux2KleinPipeline and Flux2KleinKVPipeline are klein (Qwen3); any other
// class is an InvalidArgument error naming it.
absl::StatusOr<PromptFormat> prompt_format_for_pipeline(absl::string_view class_name);

}  // namespace flux2
