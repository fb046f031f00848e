// The Qwen3 and Mistral-Small-3.1 chat templates and their padding tokens; see chat_template.h.
// Tested by tests/host/tokenizer_test.cc (ChatTemplate*) and `flux2 check-golden --only tokenizer`.
#include "model/chat_template.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "model/tokenizer_utf8.h"

namespace flux2 {

const char kFlux2DevSystemMessage[] =
    "You are an AI that reasons about image descriptions. You give structured responses focusing "
    "on object relationships, object\nattribution and actions without speculation.";

std::string qwen3_chat_prompt(absl::string_view prompt) {
  return "<|im_start|>user\n" + std::string(prompt) +
         "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
}

std::string mistral_chat_prompt(absl::string_view prompt) {
  // diffusers' format_input strips "[IMG]" so that the Pixtral processor's image-token count
  // stays valid; the processor's template then adds BOS and the system turn.
  const std::string cleaned = absl::StrReplaceAll(utf8_replace_invalid(prompt), {{"[IMG]", ""}});
  return absl::StrCat("<s>[SYSTEM_PROMPT]", kFlux2DevSystemMessage, "[/SYSTEM_PROMPT][INST]",
                      cleaned, "[/INST]");
}

std::string chat_prompt(PromptFormat format, absl::string_view prompt) {
  switch (format) {
    case PromptFormat::kQwen3Chat:
      return qwen3_chat_prompt(prompt);
    case PromptFormat::kMistralSmall3Chat:
      return mistral_chat_prompt(prompt);
  }
  return qwen3_chat_prompt(prompt);
}

absl::string_view prompt_pad_token(PromptFormat format) {
  return format == PromptFormat::kMistralSmall3Chat ? "<pad>" : "<|endoftext|>";
}

int32_t prompt_pad_fallback_id(PromptFormat format) {
  // The tokenizers' own pad tokens: Tekken's <pad> is id 11, Qwen3's <|endoftext|> id 151643.
  return format == PromptFormat::kMistralSmall3Chat ? 11 : 151643;
}

absl::string_view prompt_format_name(PromptFormat format) {
  return format == PromptFormat::kMistralSmall3Chat ? "mistral" : "qwen3";
}

absl::StatusOr<PromptFormat> prompt_format_from_name(absl::string_view name) {
  if (name == "qwen3") return PromptFormat::kQwen3Chat;
  if (name == "mistral") return PromptFormat::kMistralSmall3Chat;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown prompt format \"", name, "\" (known: qwen3, mistral)"));
}

absl::StatusOr<PromptFormat> prompt_format_for_pipeline(absl::string_view class_name) {
  if (class_name == "Flux2Pipeline") return PromptFormat::kMistralSmall3Chat;
  if (class_name == "Flux2KleinPipeline" || class_name == "Flux2KleinKVPipeline") {
    return PromptFormat::kQwen3Chat;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("pipeline class \"", class_name,
                   "\" has no known prompt format (Flux2Pipeline: mistral; Flux2KleinPipeline, "
                   "Flux2KleinKVPipeline: qwen3)"));
}

}  // namespace flux2
