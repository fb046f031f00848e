// How each LoRA layout names FLUX.2's modules, and an adapter file's keys grouped per module with
// their layout: the first step of parse_lora_adapter (lora_adapter.h). Tested by
// tests/host/lora_adapter_test.cc.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/flux2_config.h"
#include "model/lora_adapter.h"
#include "model/lora_targets.h"
#include "model/safetensors.h"

namespace flux2::lora_keys {

// How a file's module becomes diffusers modules.
enum class Mapping : uint8_t {
  kDirect,      // one module, A and B as they are
  kQkv,         // BFL's fused qkv: to_q/to_k/to_v share A, B's row thirds (q, k, v)
  kSwapHalves,  // BFL's final adaLN: B's two row halves swapped (shift|scale -> scale|shift)
};

struct SourceModule {
  Mapping mapping = Mapping::kDirect;
  std::vector<std::string> modules;  // diffusers names: one, or q, k, v for kQkv
  bool kohya_dropped = false;        // diffusers' kohya converter drops this module (Q5)
};

// Move-only: `kohya` points into `bfl` (a moved map keeps its nodes; a copy would not).
struct NameTables {
  NameTables() = default;
  NameTables(NameTables&&) = default;
  NameTables& operator=(NameTables&&) = default;
  NameTables(const NameTables&) = delete;
  NameTables& operator=(const NameTables&) = delete;

  std::map<std::string, LoraTarget> targets;         // diffusers module -> shape
  std::map<std::string, SourceModule> diffusers;     // diffusers module -> itself
  std::map<std::string, SourceModule> bfl;           // BFL name ("double_blocks.0.img_attn.qkv")
  std::map<std::string, const SourceModule*> kohya;  // BFL name with '_' for '.' -> bfl entry
  int64_t double_blocks = 0;                         // the running model's block counts
  int64_t single_blocks = 0;
};
NameTables make_name_tables(const Flux2Config& config);

// The prefixes that tell layouts apart (lora_adapter.h's LoraLayout).
constexpr absl::string_view kDiffusersPrefix = "transformer.";
constexpr absl::string_view kBflPrefix = "diffusion_model.";
constexpr absl::string_view kFalPrefix = "base_model.model.";
constexpr absl::string_view kKohyaPrefix = "lora_unet_";

enum class Spelling : uint8_t { kNone, kAB, kDownUp };  // kNone: only an .alpha

// The keys of one module of the file: "<stem>.lora_A.weight", "<stem>.lora_B.weight", ...
struct KeyGroup {
  std::string stem;
  const SafetensorsEntry* a = nullptr;
  const SafetensorsEntry* b = nullptr;
  const SafetensorsEntry* alpha = nullptr;
  Spelling spelling = Spelling::kNone;
  LoraLayout layout = LoraLayout::kDiffusers;
  const SourceModule* source = nullptr;
};

struct UnknownKey {
  std::string key;
  std::string reason;
};

struct GroupedKeys {
  std::vector<KeyGroup> groups;     // modules of the running model, by stem
  std::vector<UnknownKey> unknown;  // keys that are none of them, sorted
};

// Splits every key into its module's group (refusing a stem spelled both lora_A/B and
// lora_down/up); keys that name no module of the model are returned, not refused, so that the
// caller can first check the shapes of those that do (an adapter for a larger variant has both).
absl::StatusOr<GroupedKeys> group_keys(const SafetensorsFile& file,
                                       const std::vector<std::string>& keys,
                                       const NameTables& names);

// The refusal for unknown keys: "keys look like FLUX.1 (...)" when they do (flux1_keys_error, OK
// otherwise), else the first key with its reason and how many more.
absl::Status flux1_keys_error(const std::vector<UnknownKey>& unknown);
absl::Status unknown_keys_error(const std::vector<UnknownKey>& unknown);

// Refuses groups of more than one layout, naming a stem of each.
absl::Status check_one_layout(const std::vector<KeyGroup>& groups);

}  // namespace flux2::lora_keys
