// MemoryPlan's description and the start-up check; see memory_plan.h. Tested by
// tests/host/pipeline_test.cc (MemoryPlan*).
#include "model/memory_plan.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace flux2 {

std::string MemoryPlan::describe() const {
  return absl::StrFormat(
      "text encoder %.2f GB, transformer %.2f GB, VAE %.2f GB, quality=high FP8 copies %.2f GB, "
      "prompt cache %.2f GB, LoRA cache %.2f GB, working memory %.2f GB = %.2f GB on the device "
      "(+ %.2f GB pinned host memory)",
      text_encoder_device / 1e9, transformer / 1e9, vae / 1e9, fp8 / 1e9, prompt_cache / 1e9,
      lora_cache / 1e9, working / 1e9, device_total() / 1e9, text_encoder_host / 1e9);
}

absl::Status check_memory_plan(const MemoryPlan& plan, int64_t free_device_bytes,
                               const std::string& source, bool text_encoder_streamed,
                               const std::string& streaming_flag) {
  if (free_device_bytes < 0 || plan.device_total() <= free_device_bytes) return absl::OkStatus();
  std::string message =
      absl::StrFormat("%s does not fit this device: the memory plan needs %s but %.2f GB are free",
                      source, plan.describe(), free_device_bytes / 1e9);
  if (!text_encoder_streamed) {
    absl::StrAppend(
        &message,
        absl::StrFormat("; %s keeps the text encoder in pinned host memory and streams "
                        "it layer by layer (all but two layers of its %.2f GB off the device)",
                        streaming_flag, plan.text_encoder_device / 1e9));
  }
  return absl::ResourceExhaustedError(message);
}

}  // namespace flux2
