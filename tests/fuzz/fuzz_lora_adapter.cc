// libFuzzer target: a LoRA adapter file (model/lora_adapter.h) of any layout, parsed for a tiny
// transformer (hidden 8, one double and one single block). A parsed adapter must hold, per module,
// finite A [r, in] and B [out, r] of the target's shape; a refusal must be InvalidArgument. Run by
// tests/fuzz/run_fuzzers.sh (seeds: corpus/lora_adapter, one small file per layout family).
#include <cmath>
#include <cstdlib>
#include <span>

#include "model/lora_adapter.h"
#include "model/lora_targets.h"
#include "tests/fuzz/fuzz_configs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const flux2::Flux2Config config = flux2::fuzzing::lora_fuzz_config();
  static const auto targets = flux2::flux2_lora_targets(config);
  const absl::StatusOr<flux2::LoraAdapter> adapter =
      flux2::parse_lora_adapter(std::span<const uint8_t>(data, size), config, {.max_rank = 16});
  if (!adapter.ok()) {
    if (!absl::IsInvalidArgument(adapter.status())) std::abort();
    return 0;
  }
  for (const flux2::LoraModule& m : adapter->modules) {
    const auto target = targets.find(m.module);
    if (target == targets.end() || m.in_features != target->second.in_features ||
        m.out_features != target->second.out_features || m.rank < 1 || m.rank > 16 ||
        m.a.size() != static_cast<size_t>(m.rank * m.in_features) ||
        m.b.size() != static_cast<size_t>(m.out_features * m.rank)) {
      std::abort();
    }
    for (float v : m.a)
      if (!std::isfinite(v)) std::abort();
    for (float v : m.b)
      if (!std::isfinite(v)) std::abort();
  }
  return 0;
}
