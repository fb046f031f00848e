// BFL single-file FLUX.2 transformer checkpoints under diffusers names; see bfl_checkpoint.h.
// Tested by tests/host/bfl_checkpoint_test.cc.
#include "model/bfl_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/base/status.h"
#include "model/flux2_weights.h"
#include "model/fp8_checkpoint.h"
#include "model/weight_loader.h"

namespace flux2 {
namespace {

// The tensor whose presence marks BFL naming (diffusers calls it transformer_blocks.0.attn.to_q).
constexpr char kBflProbe[] = "double_blocks.0.img_attn.qkv.weight";

// A BFL tensor that is the diffusers tensors `diffusers` stacked along rows, in that order (one
// name: a rename). Suffixes are relative to the block prefixes.
struct Stacking {
  const char* bfl;
  std::vector<const char*> diffusers;
};

// Top-level tensors (diffusers' FLUX2_TRANSFORMER_KEYS_RENAME_DICT); the final adaLN is separate.
const std::vector<Stacking>& top_level_stackings() {
  static const std::vector<Stacking> kTopLevel = {
      {"img_in.weight", {"x_embedder.weight"}},
      {"txt_in.weight", {"context_embedder.weight"}},
      {"time_in.in_layer.weight", {"time_guidance_embed.timestep_embedder.linear_1.weight"}},
      {"time_in.out_layer.weight", {"time_guidance_embed.timestep_embedder.linear_2.weight"}},
      {"double_stream_modulation_img.lin.weight", {"double_stream_modulation_img.linear.weight"}},
      {"double_stream_modulation_txt.lin.weight", {"double_stream_modulation_txt.linear.weight"}},
      {"single_stream_modulation.lin.weight", {"single_stream_modulation.linear.weight"}},
      {"final_layer.linear.weight", {"proj_out.weight"}},
  };
  return kTopLevel;
}

const std::vector<Stacking>& guidance_stackings() {
  static const std::vector<Stacking> kGuidance = {
      {"guidance_in.in_layer.weight", {"time_guidance_embed.guidance_embedder.linear_1.weight"}},
      {"guidance_in.out_layer.weight", {"time_guidance_embed.guidance_embedder.linear_2.weight"}},
  };
  return kGuidance;
}

// double_blocks.{i}.* -> transformer_blocks.{i}.*: the fused qkv splits into three projections;
// the QK-norm scales become weights.
const std::vector<Stacking>& double_block_stackings() {
  static const std::vector<Stacking> kDouble = {
      {"img_attn.qkv.weight", {"attn.to_q.weight", "attn.to_k.weight", "attn.to_v.weight"}},
      {"img_attn.norm.query_norm.scale", {"attn.norm_q.weight"}},
      {"img_attn.norm.key_norm.scale", {"attn.norm_k.weight"}},
      {"img_attn.proj.weight", {"attn.to_out.0.weight"}},
      {"img_mlp.0.weight", {"ff.linear_in.weight"}},
      {"img_mlp.2.weight", {"ff.linear_out.weight"}},
      {"txt_attn.qkv.weight",
       {"attn.add_q_proj.weight", "attn.add_k_proj.weight", "attn.add_v_proj.weight"}},
      {"txt_attn.norm.query_norm.scale", {"attn.norm_added_q.weight"}},
      {"txt_attn.norm.key_norm.scale", {"attn.norm_added_k.weight"}},
      {"txt_attn.proj.weight", {"attn.to_add_out.weight"}},
      {"txt_mlp.0.weight", {"ff_context.linear_in.weight"}},
      {"txt_mlp.2.weight", {"ff_context.linear_out.weight"}},
  };
  return kDouble;
}

// single_blocks.{j}.* -> single_transformer_blocks.{j}.*: diffusers keeps linear1 fused too.
const std::vector<Stacking>& single_block_stackings() {
  static const std::vector<Stacking> kSingle = {
      {"linear1.weight", {"attn.to_qkv_mlp_proj.weight"}},
      {"linear2.weight", {"attn.to_out.weight"}},
      {"norm.query_norm.scale", {"attn.norm_q.weight"}},
      {"norm.key_norm.scale", {"attn.norm_k.weight"}},
  };
  return kSingle;
}

// What a view keeps alive: the mapped file, the diffusers-named entries pointing into it, and
// the rearranged copies. Deques: elements keep their addresses as more are added.
struct BflViewStorage {
  std::unique_ptr<SafetensorsFile> file;
  std::deque<SafetensorsEntry> entries;
  std::deque<std::vector<char>> copies;
  std::deque<Fp8Scales> scales;  // of the FP8 views
};

// One run of rows of a diffusers tensor found in the file.
struct FoundRows {
  const SafetensorsEntry* bfl;
  const BflRows* rows;
};

}  // namespace

std::vector<BflTensor> bfl_transformer_tensors(const Flux2Config& config) {
  Flux2Weights weights;
  std::map<std::string, Shape> shapes;  // diffusers name -> shape, from the tensor table
  for (const WeightSpec& spec : weights.table(config)) shapes[spec.name] = spec.shape;

  std::vector<BflTensor> tensors;
  auto stack = [&](const std::string& bfl_prefix, const std::string& diffusers_prefix,
                   const Stacking& stacking) {
    BflTensor tensor{bfl_prefix + stacking.bfl, {}, {}};
    for (const char* suffix : stacking.diffusers) {
      const std::string name = diffusers_prefix + suffix;
      auto it = shapes.find(name);
      FLUX_CHECK(it != shapes.end() && !it->second.empty() && it->second[0] > 0);
      const Shape& shape = it->second;
      const int64_t row = tensor.shape.empty() ? 0 : tensor.shape[0];
      if (tensor.shape.empty()) {
        tensor.shape = shape;
      } else {
        FLUX_CHECK(std::equal(shape.begin() + 1, shape.end(), tensor.shape.begin() + 1,
                              tensor.shape.end()));
        tensor.shape[0] += shape[0];
      }
      tensor.parts.push_back(BflRows{name, row, 0, shape[0]});
    }
    tensors.push_back(std::move(tensor));
  };

  for (const Stacking& s : top_level_stackings()) stack("", "", s);
  if (config.guidance_embeds) {
    for (const Stacking& s : guidance_stackings()) stack("", "", s);
  }
  // BFL's LastLayer chunks its adaLN output as (shift, scale); diffusers' AdaLayerNormContinuous
  // as (scale, shift): the two halves of the rows trade places.
  const std::string norm_out = "norm_out.linear.weight";
  const Shape& norm_shape = shapes.at(norm_out);
  const int64_t half = norm_shape[0] / 2;
  tensors.push_back(
      BflTensor{"final_layer.adaLN_modulation.1.weight",
                norm_shape,
                {BflRows{norm_out, 0, half, half}, BflRows{norm_out, half, 0, half}}});

  for (int64_t i = 0; i < config.num_layers; ++i) {
    for (const Stacking& s : double_block_stackings()) {
      stack(absl::StrCat("double_blocks.", i, "."), absl::StrCat("transformer_blocks.", i, "."), s);
    }
  }
  for (int64_t j = 0; j < config.num_single_layers; ++j) {
    for (const Stacking& s : single_block_stackings()) {
      stack(absl::StrCat("single_blocks.", j, "."),
            absl::StrCat("single_transformer_blocks.", j, "."), s);
    }
  }
  return tensors;
}

bool is_bfl_transformer(const SafetensorsFile& file) {
  return file.find(kBflProbe) != nullptr ||
         file.find(absl::StrCat(kBflModelPrefix, kBflProbe)) != nullptr;
}

absl::StatusOr<bool> is_bfl_transformer_file(const std::string& path) {
  FLUX_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::open(path));
  return is_bfl_transformer(*file);
}

std::string bfl_prefix(const SafetensorsFile& file) {
  return file.find(kBflProbe) != nullptr ? "" : kBflModelPrefix;
}

absl::StatusOr<Fp8Layers> bfl_fp8_layers(const SafetensorsFile& file) {
  std::map<std::string, TensorRef, std::less<>> tensors;
  for (const SafetensorsEntry& entry : file.entries())
    tensors.emplace(entry.name, TensorRef{&file, &entry});
  return collect_fp8_layers(
      Fp8Source{&tensors, &file.metadata(), bfl_prefix(file), file.path(), /*modelopt=*/false});
}

namespace {

absl::Status not_bfl(const std::string& path) {
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": not a FLUX.2 transformer in Black Forest Labs naming (no tensor ", kBflProbe,
      ", bare or after ", kBflModelPrefix, "); a diffusers transformer/ directory opens as one"));
}

// Matches `file` against the BFL tensors of `config`: the runs of rows of each diffusers tensor,
// or one error naming every missing, mis-shaped and unexpected tensor (FP8 side tensors, the
// scales and markers of `fp8`, are expected).
absl::StatusOr<std::map<std::string, std::vector<FoundRows>>> match_bfl_layout(
    const SafetensorsFile& file, const std::vector<BflTensor>& layout, const Fp8Layers& fp8,
    const std::string& config_path) {
  const std::string prefix = bfl_prefix(file);
  std::vector<std::string> missing, misshaped, unexpected;
  std::set<const SafetensorsEntry*> matched;
  std::map<std::string, std::vector<FoundRows>> pieces;  // diffusers name -> its rows
  for (const BflTensor& tensor : layout) {
    const SafetensorsEntry* entry = file.find(prefix + tensor.name);
    if (entry == nullptr) {
      std::vector<std::string> gives;
      for (const BflRows& part : tensor.parts) {
        if (gives.empty() || gives.back() != part.diffusers_name)
          gives.push_back(part.diffusers_name);
      }
      missing.push_back(absl::StrCat(prefix, tensor.name, " (", absl::StrJoin(gives, ", "), ")"));
      continue;
    }
    matched.insert(entry);
    if (entry->shape != tensor.shape) {
      misshaped.push_back(absl::StrCat(entry->name, " is ", shape_string(entry->shape),
                                       ", expected ", shape_string(tensor.shape)));
      continue;
    }
    for (const BflRows& part : tensor.parts)
      pieces[part.diffusers_name].push_back(FoundRows{entry, &part});
  }
  for (const SafetensorsEntry& entry : file.entries()) {
    if (!matched.count(&entry) && !fp8.side_tensors.count(entry.name))
      unexpected.push_back(entry.name);
  }
  if (missing.empty() && misshaped.empty() && unexpected.empty()) return pieces;
  std::string message =
      absl::StrCat(file.path(), ": Black Forest Labs checkpoint does not match ", config_path);
  if (!missing.empty())
    absl::StrAppend(&message, "; missing tensors (diffusers names): ", list_names(missing));
  if (!misshaped.empty()) absl::StrAppend(&message, "; wrong shape: ", list_names(misshaped));
  if (!unexpected.empty())
    absl::StrAppend(&message, "; tensors with no diffusers counterpart: ", list_names(unexpected));
  return absl::InvalidArgumentError(message);
}

// The scales of diffusers tensor `rows` rows long put together from `found` (FP8 pieces), each
// piece's rows taking their own scale; one value when every row has the same.
Fp8Scales join_scales(const std::vector<FoundRows>& found, const Fp8Layers& fp8, int64_t rows) {
  const Fp8Scales& first = fp8.scales.at(found.front().bfl->name);
  Fp8Scales joined{{}, first.input, first.full_precision};
  joined.weight.resize(static_cast<size_t>(rows));
  for (const FoundRows& piece : found) {
    const std::vector<float>& weight = fp8.scales.at(piece.bfl->name).weight;
    for (int64_t r = 0; r < piece.rows->rows; ++r) {
      joined.weight[static_cast<size_t>(piece.rows->diffusers_row + r)] =
          weight.size() == 1 ? weight[0] : weight[static_cast<size_t>(piece.rows->bfl_row + r)];
    }
  }
  const bool per_tensor = std::all_of(found.begin(), found.end(), [&](const FoundRows& piece) {
    return fp8.scales.at(piece.bfl->name).weight.size() == 1;
  });
  if (per_tensor && std::all_of(joined.weight.begin(), joined.weight.end(),
                                [&](float s) { return s == joined.weight[0]; }))
    joined.weight.resize(1);
  return joined;
}

// The view of diffusers tensor `name`: its rows when they are one run of the file, else a copy put
// together; an FP8 piece brings its scales.
absl::StatusOr<TensorRef> make_view(BflViewStorage& storage, const std::string& name,
                                    const std::vector<FoundRows>& found, const Fp8Layers& fp8) {
  const SafetensorsFile& file = *storage.file;
  const SafetensorsEntry& first = *found.front().bfl;
  const int64_t row_bytes = first.bytes() / first.shape[0];
  int64_t rows = 0;
  for (const FoundRows& piece : found) {
    if (piece.bfl->dtype != first.dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": tensor \"", name, "\" would join ", dtype_name(first.dtype),
                       " rows of \"", first.name, "\" and ", dtype_name(piece.bfl->dtype),
                       " rows of \"", piece.bfl->name, "\""));
    }
    rows += piece.rows->rows;
  }
  SafetensorsEntry& view = storage.entries.emplace_back();
  view.name = name;
  view.dtype = first.dtype;
  view.shape = first.shape;
  view.shape[0] = rows;
  TensorRef ref{&file, &view};
  if (fp8.scales.count(first.name))
    ref.fp8 = &storage.scales.emplace_back(join_scales(found, fp8, rows));
  if (found.size() == 1) {
    view.begin = first.begin + found.front().rows->bfl_row * row_bytes;
    view.end = view.begin + rows * row_bytes;
    return ref;
  }
  // Not a range of the file: begin/end span the copy, which `ref.bytes` points to.
  std::vector<char>& copy = storage.copies.emplace_back(static_cast<size_t>(rows * row_bytes));
  for (const FoundRows& piece : found) {
    std::memcpy(copy.data() + piece.rows->diffusers_row * row_bytes,
                static_cast<const char*>(file.data(*piece.bfl)) + piece.rows->bfl_row * row_bytes,
                static_cast<size_t>(piece.rows->rows * row_bytes));
  }
  view.begin = 0;
  view.end = rows * row_bytes;
  ref.bytes = copy.data();
  return ref;
}

}  // namespace

absl::StatusOr<ComponentWeights> open_bfl_transformer(const std::string& path,
                                                      nlohmann::json config,
                                                      const std::string& config_path) {
  FLUX_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::open(path));
  if (!is_bfl_transformer(*file)) return not_bfl(path);
  FLUX_ASSIGN_OR_RETURN(const Fp8Layers fp8, bfl_fp8_layers(*file));
  return open_bfl_transformer(std::move(file), std::move(config), config_path, fp8);
}

absl::StatusOr<ComponentWeights> open_bfl_transformer(std::unique_ptr<SafetensorsFile> file,
                                                      nlohmann::json config,
                                                      const std::string& config_path,
                                                      const Fp8Layers& fp8) {
  FLUX_ASSIGN_OR_RETURN(const Flux2Config parsed, Flux2Config::from_json(config, config_path));
  if (!is_bfl_transformer(*file)) return not_bfl(file->path());
  auto storage = std::make_shared<BflViewStorage>();
  storage->file = std::move(file);
  const std::vector<BflTensor> layout = bfl_transformer_tensors(parsed);  // `pieces` points into it
  FLUX_ASSIGN_OR_RETURN(const auto pieces,
                        match_bfl_layout(*storage->file, layout, fp8, config_path));
  std::map<std::string, TensorRef, std::less<>> tensors;
  for (const auto& [name, found] : pieces) {
    FLUX_ASSIGN_OR_RETURN(TensorRef ref, make_view(*storage, name, found, fp8));
    tensors.emplace(name, ref);
  }
  const std::string path = storage->file->path();
  return ComponentWeights::from_view(path, std::move(config), config_path, std::move(tensors),
                                     std::move(storage));
}

nlohmann::json flux2_config_json(const Flux2Config& config) {
  return nlohmann::json{{"_class_name", "Flux2Transformer2DModel"},
                        {"attention_head_dim", config.attention_head_dim},
                        {"axes_dims_rope", config.axes_dims_rope},
                        {"eps", config.eps},
                        {"guidance_embeds", config.guidance_embeds},
                        {"in_channels", config.in_channels},
                        {"joint_attention_dim", config.joint_attention_dim},
                        {"mlp_ratio", config.mlp_ratio},
                        {"num_attention_heads", config.num_attention_heads},
                        {"num_layers", config.num_layers},
                        {"num_single_layers", config.num_single_layers},
                        {"out_channels", config.out_channels},
                        {"patch_size", config.patch_size},
                        {"rope_theta", config.rope_theta},
                        {"timestep_guidance_channels", config.timestep_guidance_channels}};
}

}  // namespace flux2
