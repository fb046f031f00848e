// A LoRA adapter file read into one canonical form: per diffusers module of the running
// transformer, A [r, in] and B [out, r] as diffusers' Flux2LoraLoaderMixin + PEFT load them, and
// the alpha PEFT scales by. Every layout people ship for FLUX.2 (model/README.md) is read strictly:
// every key consumed, shapes checked against the model, unsupported kinds refused by name.
// Tested by tests/host/lora_adapter_test.cc against tests/data/tiny-klein/lora_converted.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/flux2_config.h"

namespace flux2 {

// How the file named its tensors (model/README.md, "LoRA adapter layouts").
enum class LoraLayout : uint8_t {
  kDiffusers,       // transformer.<module>.lora_A/lora_B (+ lora_adapter_metadata header)
  kBfl,             // diffusion_model.<BFL name>.lora_A/lora_B (ai-toolkit, ComfyUI exports)
  kFal,             // base_model.model.<BFL name>.lora_A/lora_B (fal's trainer)
  kKohya,           // lora_unet_<BFL name with underscores>.lora_down/lora_up/.alpha
  kBflDownUp,       // diffusion_model.<BFL name>.lora_down/lora_up/.alpha (diffusers loads nothing)
  kBareBfl,         // <BFL name>.lora_A/lora_B, no prefix (diffusers drops them)
  kBareDiffusers,   // <module>.lora_A/lora_B, no prefix (diffusers drops them)
  kDiffusersNames,  // diffusion_model.<diffusers module>.lora_A/lora_B
};
const char* lora_layout_name(LoraLayout layout);  // "diffusers", "bfl", ..., for logs and APIs

// One adapted Linear. The effective PEFT scaling of a request's weight w is
// (float)((w * alpha) / rank), or (float)((w * alpha) / sqrt(rank)) with rsLoRA (scaling()).
struct LoraModule {
  std::string module;  // diffusers module name without "transformer." (lora_targets.h)
  int64_t rank = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
  std::vector<float> a;  // [rank, in_features], the values diffusers loads (float32)
  std::vector<float> b;  // [out_features, rank]
  double alpha = 0.0;    // lora_alpha (kohya files: alpha baked into a and b, then alpha = rank)
  bool rslora = false;

  // PEFT's LoraLayer scaling for a request weight `weight` (set_adapters' adapter_weights).
  float scaling(double weight = 1.0) const;
};

struct LoraAdapter {
  LoraLayout layout = LoraLayout::kDiffusers;
  std::vector<LoraModule> modules;  // sorted by module name, each module once
  // Where we knowingly differ from diffusers' loader (model/README.md Q1-Q5), one phrase each, for
  // the load log line: e.g. "final_layer.adaLN_modulation.1 B halves swapped to scale|shift".
  std::vector<std::string> deviations;

  int64_t max_rank() const;
  // Values held (A and B), and their bytes at `value_bytes` per value (2 on the GPU: bf16).
  int64_t values() const;
};

struct LoraParseOptions {
  int64_t max_rank = 256;  // a module of higher rank is refused (--max-lora-rank)
  // The largest |scale| a request may give (--max-lora-scale): a module whose PEFT scaling at it
  // is not a finite float32 (lora_alpha 1e300 is valid JSON) is refused.
  double max_scale = 8.0;
};

// Parses a whole .safetensors file's bytes into the canonical form for a transformer of
// `config`. Errors are InvalidArgument with a message that names the key or module and, for shape
// mismatches, both shapes (callers prefix the adapter's name and request field), e.g.
//   unknown key 'transformer.foo.lora_A.weight' (and 12 more): no FLUX.2 module 'foo'
//   transformer_blocks.0.attn.to_q: lora_A [16, 4096] / lora_B [3072, 16] do not fit [3072, 3072]
//   DoRA (lora_magnitude_vector / dora_scale) is not supported
absl::StatusOr<LoraAdapter> parse_lora_adapter(std::span<const uint8_t> file,
                                               const Flux2Config& config,
                                               const LoraParseOptions& options = {});

}  // namespace flux2
