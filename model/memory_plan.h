// MemoryPlan: the device (and page-locked host) bytes a pipeline will hold, computed from the
// checkpoint's tensor shapes before anything is allocated, so a server refuses at start-up, with
// the plan in the message, a model that cannot fit the device's free memory. Tested by
// tests/host/pipeline_test.cc (MemoryPlan*).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace flux2 {

struct MemoryPlan {
  int64_t text_encoder_device = 0;  // resident: every loaded layer; streamed: two layer buffers
  int64_t text_encoder_host = 0;    // streamed: the layers and the embedding in pinned host memory
  int64_t transformer = 0;
  int64_t vae = 0;           // decoder + encoder
  int64_t fp8 = 0;           // quality=high's low-precision copies (estimated: half the blocks)
  int64_t prompt_cache = 0;  // the prompt-embedding cache's capacity
  int64_t lora_cache = 0;    // the LoRA adapters' device cache budget (--lora-cache-bytes)
  // Activations and library workspaces at the largest request (1024x1024 default, 512 tokens,
  // 4 references): kWorkingBytes.
  int64_t working = 0;

  int64_t device_total() const {
    return text_encoder_device + transformer + vae + fp8 + prompt_cache + lora_cache + working;
  }
  // "text encoder 34.6 GB, transformer 64.4 GB, ... = 99.9 GB on the device (+ 0 GB pinned host)".
  std::string describe() const;
};

// The working memory reserved beside the weights: FLUX.2-dev at 1024x1024 with 512 text tokens
// peaked 1.36 GB above its 97.96 GB of weights on the H200 (activations, attention and GEMM
// workspaces; the transformer's workspace is released before the VAE decode at full resolution);
// 3 GiB leaves room for references and library workspaces outside the pool.
inline constexpr int64_t kWorkingBytes = int64_t{3} << 30;

// OK when `plan` fits `free_device_bytes` (or that is negative: no separate device memory);
// otherwise ResourceExhausted saying the plan, the free bytes and, when the text encoder is
// resident, that streaming it from host memory (`streaming_flag`) needs less.
absl::Status check_memory_plan(const MemoryPlan& plan, int64_t free_device_bytes,
                               const std::string& source, bool text_encoder_streamed,
                               const std::string& streaming_flag);

}  // namespace flux2
