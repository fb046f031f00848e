// How each LoRA layout names FLUX.2's modules and how a file's keys group per module; see
// lora_key_names.h and model/README.md "LoRA adapter layouts". Tested by
// tests/host/lora_adapter_test.cc.
#include "model/lora_key_names.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "kernels/base/status.h"

namespace flux2::lora_keys {
namespace {

template <typename... Parts>
absl::Status invalid(const Parts&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

void add_bfl_double_block(int64_t i, std::map<std::string, SourceModule>* bfl) {
  const std::string p = absl::StrCat("double_blocks.", i, ".");
  const std::string m = absl::StrCat("transformer_blocks.", i, ".");
  (*bfl)[p + "img_attn.qkv"] = {Mapping::kQkv, {m + "attn.to_q", m + "attn.to_k", m + "attn.to_v"}};
  (*bfl)[p + "txt_attn.qkv"] = {
      Mapping::kQkv, {m + "attn.add_q_proj", m + "attn.add_k_proj", m + "attn.add_v_proj"}};
  (*bfl)[p + "img_attn.proj"] = {Mapping::kDirect, {m + "attn.to_out.0"}};
  (*bfl)[p + "txt_attn.proj"] = {Mapping::kDirect, {m + "attn.to_add_out"}};
  (*bfl)[p + "img_mlp.0"] = {Mapping::kDirect, {m + "ff.linear_in"}};
  (*bfl)[p + "img_mlp.2"] = {Mapping::kDirect, {m + "ff.linear_out"}};
  (*bfl)[p + "txt_mlp.0"] = {Mapping::kDirect, {m + "ff_context.linear_in"}};
  (*bfl)[p + "txt_mlp.2"] = {Mapping::kDirect, {m + "ff_context.linear_out"}};
}

// BFL's module names (diffusers' _convert_non_diffusers_flux2_lora_to_diffusers mapping).
std::map<std::string, SourceModule> bfl_names(const Flux2Config& config) {
  std::map<std::string, SourceModule> bfl;
  auto direct = [&](const std::string& name, const std::string& module, bool kohya_dropped) {
    bfl[name] = {Mapping::kDirect, {module}, kohya_dropped};
  };
  direct("img_in", "x_embedder", false);
  direct("txt_in", "context_embedder", false);
  direct("time_in.in_layer", "time_guidance_embed.timestep_embedder.linear_1", false);
  direct("time_in.out_layer", "time_guidance_embed.timestep_embedder.linear_2", false);
  if (config.guidance_embeds) {
    direct("guidance_in.in_layer", "time_guidance_embed.guidance_embedder.linear_1", true);
    direct("guidance_in.out_layer", "time_guidance_embed.guidance_embedder.linear_2", true);
  }
  direct("final_layer.linear", "proj_out", false);
  bfl["final_layer.adaLN_modulation.1"] = {Mapping::kSwapHalves, {"norm_out.linear"}, true};
  direct("single_stream_modulation.lin", "single_stream_modulation.linear", true);
  direct("double_stream_modulation_img.lin", "double_stream_modulation_img.linear", true);
  direct("double_stream_modulation_txt.lin", "double_stream_modulation_txt.linear", true);
  for (int64_t i = 0; i < config.num_layers; ++i) add_bfl_double_block(i, &bfl);
  for (int64_t j = 0; j < config.num_single_layers; ++j) {
    const std::string p = absl::StrCat("single_blocks.", j, ".");
    const std::string m = absl::StrCat("single_transformer_blocks.", j, ".attn.");
    direct(p + "linear1", m + "to_qkv_mlp_proj", false);
    direct(p + "linear2", m + "to_out", false);
  }
  return bfl;
}

enum class Part : uint8_t { kA, kB, kAlpha };

struct KeySuffix {
  const char* text;
  Part part;
  Spelling spelling;
};
constexpr KeySuffix kKeySuffixes[] = {
    {".lora_A.weight", Part::kA, Spelling::kAB},
    {".lora_B.weight", Part::kB, Spelling::kAB},
    {".lora_down.weight", Part::kA, Spelling::kDownUp},
    {".lora_up.weight", Part::kB, Spelling::kDownUp},
    {".alpha", Part::kAlpha, Spelling::kNone},
};

// " (this model has 5 double and 20 single blocks: ...)" when `name` is a block past the model's
// last (every spelling: transformer_blocks.7, double_blocks_7, ...), else "".
std::string block_count_hint(absl::string_view name, const NameTables& names) {
  constexpr std::pair<absl::string_view, bool> kBlockWords[] = {{"single_transformer_blocks", true},
                                                                {"transformer_blocks", false},
                                                                {"single_blocks", true},
                                                                {"double_blocks", false}};
  for (const auto& [word, single] : kBlockWords) {
    const size_t at = name.find(word);
    if (at == absl::string_view::npos) continue;
    absl::string_view rest = name.substr(at + word.size());
    if (rest.size() < 2 || (rest[0] != '.' && rest[0] != '_')) continue;
    size_t digits = 1;
    while (digits < rest.size() && digits <= 9 && absl::ascii_isdigit(rest[digits])) ++digits;
    int64_t index = 0;
    if (digits == 1 || !absl::SimpleAtoi(rest.substr(1, digits - 1), &index)) return "";
    if (index < (single ? names.single_blocks : names.double_blocks)) return "";
    return absl::StrCat(" (this model has ", names.double_blocks, " double and ",
                        names.single_blocks,
                        " single blocks: an adapter for another FLUX.2 variant?)");
  }
  return "";
}

// Finds the layout and modules of `group.stem` (spelled `group.spelling`); else a reason.
std::string resolve_group(const NameTables& names, KeyGroup* group) {
  absl::string_view name = group->stem;
  const bool down_up = group->spelling == Spelling::kDownUp;
  auto find = [&](const std::map<std::string, SourceModule>& table) -> const SourceModule* {
    auto it = table.find(std::string(name));
    return it == table.end() ? nullptr : &it->second;
  };
  auto no_module = [&] {
    return absl::StrCat("no FLUX.2 module '", name, "'", block_count_hint(name, names));
  };
  if (absl::ConsumePrefix(&name, kKohyaPrefix)) {
    auto it = names.kohya.find(std::string(name));
    if (it == names.kohya.end()) return no_module();
    if (!down_up) return "kohya names take lora_down / lora_up";
    group->layout = LoraLayout::kKohya;
    group->source = it->second;
    return "";
  }
  const bool bfl_prefix = absl::ConsumePrefix(&name, kBflPrefix);
  const bool fal_prefix = !bfl_prefix && absl::ConsumePrefix(&name, kFalPrefix);
  const bool diffusers_prefix =
      !bfl_prefix && !fal_prefix && absl::ConsumePrefix(&name, kDiffusersPrefix);
  std::string legacy;  // an old exporter's "sformer_blocks." for "transformer_blocks."
  if (bfl_prefix && absl::StartsWith(name, "sformer_blocks.")) {
    legacy = absl::StrCat("tran", name);
    name = legacy;
  }
  if (const SourceModule* module = find(names.diffusers); module != nullptr && !fal_prefix) {
    if (down_up) return "lora_down / lora_up are read with BFL names under 'diffusion_model.'";
    group->layout = diffusers_prefix ? LoraLayout::kDiffusers
                    : bfl_prefix     ? LoraLayout::kDiffusersNames
                                     : LoraLayout::kBareDiffusers;
    group->source = module;
    return "";
  }
  const SourceModule* module = diffusers_prefix ? nullptr : find(names.bfl);
  if (module == nullptr) return no_module();
  if (down_up && !bfl_prefix) {
    return "lora_down / lora_up are read with BFL names under 'diffusion_model.'";
  }
  group->layout = bfl_prefix   ? (down_up ? LoraLayout::kBflDownUp : LoraLayout::kBfl)
                  : fal_prefix ? LoraLayout::kFal
                               : LoraLayout::kBareBfl;
  group->source = module;
  return "";
}

// Module names of FLUX.1 (diffusers and BFL), dotted; kohya keys are compared with '_' for '.'.
constexpr const char* kFlux1Markers[] = {
    "ff.net.0.proj",    "ff.net.2",     "ff_context.net.0.proj",
    "ff_context.net.2", "norm1.linear", "norm1_context.linear",
    "norm.linear",      "proj_mlp",     "time_text_embed",
    "img_mod.lin",      "txt_mod.lin",  ".modulation.lin",
    "vector_in",
};

}  // namespace

NameTables make_name_tables(const Flux2Config& config) {
  NameTables names;
  names.targets = flux2_lora_targets(config);
  for (const auto& [module, target] : names.targets) {
    names.diffusers[module] = {Mapping::kDirect, {module}};
  }
  names.bfl = bfl_names(config);
  names.double_blocks = config.num_layers;
  names.single_blocks = config.num_single_layers;
  for (const auto& [name, source] : names.bfl) {
    names.kohya[absl::StrReplaceAll(name, {{".", "_"}})] = &source;
  }
  return names;
}

absl::Status flux1_keys_error(const std::vector<UnknownKey>& unknown) {
  std::vector<std::string> markers;
  for (const char* marker : kFlux1Markers) {
    const std::string underscored = absl::StrReplaceAll(marker, {{".", "_"}});
    for (const UnknownKey& key : unknown) {
      const bool kohya = absl::StartsWith(key.key, kKohyaPrefix);
      if (absl::StrContains(key.key, marker) ||
          (kohya && absl::StrContains(key.key, underscored) &&
           !absl::StrContains(key.key, "stream_modulation"))) {
        markers.push_back(std::string(absl::StripPrefix(marker, ".")));
        break;
      }
    }
  }
  if (markers.empty()) return absl::OkStatus();
  return invalid("keys look like FLUX.1 (", absl::StrJoin(markers, ", "),
                 "): not a FLUX.2 adapter");
}

absl::Status unknown_keys_error(const std::vector<UnknownKey>& unknown) {
  FLUX_RETURN_IF_ERROR(flux1_keys_error(unknown));
  const std::string more =
      unknown.size() > 1 ? absl::StrCat(" (and ", unknown.size() - 1, " more)") : "";
  return invalid("unknown key '", unknown[0].key, "'", more, ": ", unknown[0].reason);
}

absl::StatusOr<GroupedKeys> group_keys(const SafetensorsFile& file,
                                       const std::vector<std::string>& keys,
                                       const NameTables& names) {
  std::map<std::string, KeyGroup> by_stem;
  std::vector<UnknownKey> unknown;
  for (const std::string& key : keys) {
    const KeySuffix* suffix = nullptr;
    for (const KeySuffix& candidate : kKeySuffixes) {
      if (absl::EndsWith(key, candidate.text)) suffix = &candidate;
    }
    if (suffix == nullptr) {
      unknown.push_back({key, "not a LoRA tensor (lora_A, lora_B, lora_down, lora_up or alpha)"});
      continue;
    }
    const std::string stem = key.substr(0, key.size() - std::strlen(suffix->text));
    KeyGroup& group = by_stem[stem];
    group.stem = stem;
    const SafetensorsEntry* entry = file.find(key);
    if (suffix->spelling != Spelling::kNone) {
      if (group.spelling != Spelling::kNone && group.spelling != suffix->spelling) {
        return invalid("'", stem, "' mixes lora_A / lora_B with lora_down / lora_up");
      }
      group.spelling = suffix->spelling;
    }
    (suffix->part == Part::kA ? group.a : suffix->part == Part::kB ? group.b : group.alpha) = entry;
  }
  std::vector<KeyGroup> groups;
  for (auto& [stem, group] : by_stem) {
    if (group.spelling == Spelling::kNone) group.spelling = Spelling::kAB;  // alpha only
    std::string reason = resolve_group(names, &group);
    if (!reason.empty()) {
      for (const SafetensorsEntry* entry : {group.a, group.b, group.alpha}) {
        if (entry != nullptr) unknown.push_back({entry->name, reason});
      }
      continue;
    }
    groups.push_back(group);
  }
  std::sort(unknown.begin(), unknown.end(),
            [](const UnknownKey& x, const UnknownKey& y) { return x.key < y.key; });
  return GroupedKeys{std::move(groups), std::move(unknown)};
}

absl::Status check_one_layout(const std::vector<KeyGroup>& groups) {
  for (const KeyGroup& group : groups) {
    if (group.layout != groups[0].layout) {
      return invalid("mixes layouts: '", groups[0].stem, "' (", lora_layout_name(groups[0].layout),
                     ") and '", group.stem, "' (", lora_layout_name(group.layout), ")");
    }
  }
  return absl::OkStatus();
}

}  // namespace flux2::lora_keys
