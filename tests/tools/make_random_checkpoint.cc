// flux2_make_random_checkpoint: writes a FLUX.2-klein checkpoint directory in the Hugging Face
// layout (model_index.json, scheduler/, tokenizer/, text_encoder/ and transformer/ sharded with
// *.safetensors.index.json, vae/) with random bf16 weights at a published model's shapes, so the
// server and pipeline can be tested at real sizes without downloading weights. The tensor names
// and shapes come from the models' own tensor tables (the VAE's decoder and encoder, as published
// checkpoints have both). Used by tests/gpu/run_on_device.sh.
//   flux2_make_random_checkpoint --model klein-4b --out DIR [--tokenizer DIR] [--shard-gb 5]
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/base/dtype.h"
#include "kernels/base/parallel.h"
#include "kernels/base/uniform_hash.h"
#include "model/flux2_weights.h"
#include "model/pipeline_presets.h"
#include "model/text_encoder_weights.h"
#include "model/vae_weights.h"
#include "nlohmann/json.hpp"
#include "server/common/command_line.h"

namespace flux2 {
namespace {
namespace fs = std::filesystem;

struct TensorToWrite {
  std::string name;
  Shape shape;
  float scale;  // uniform in [-scale, scale]; 0 means ones (positive variances)
};

std::vector<TensorToWrite> from_table(const std::vector<WeightSpec>& table) {
  std::vector<TensorToWrite> out;
  for (const WeightSpec& spec : table) {
    const int64_t fan_in = spec.shape.size() >= 2 ? shape_numel(spec.shape) / spec.shape[0] : 0;
    out.push_back(
        {spec.name, spec.shape, fan_in > 0 ? 1.0f / std::sqrt(static_cast<float>(fan_in)) : 1.0f});
  }
  return out;
}

// Writes tensors into shards of at most `shard_bytes` (an index file when there are several).
void write_component(const std::string& dir, const std::string& stem,
                     const std::vector<TensorToWrite>& tensors, int64_t shard_bytes,
                     uint64_t seed) {
  std::vector<std::vector<const TensorToWrite*>> shards(1);
  int64_t current = 0;
  for (const TensorToWrite& t : tensors) {
    const int64_t bytes = shape_numel(t.shape) * 2;
    if (current > 0 && current + bytes > shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(&t);
    current += bytes;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  int64_t total = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1 ? stem + ".safetensors"
                                                : absl::StrFormat("%s-%05d-of-%05d.safetensors",
                                                                  stem, s + 1, shards.size());
    nlohmann::json header = nlohmann::json::object();
    uint64_t offset = 0;
    for (const TensorToWrite* t : shards[s]) {
      const uint64_t bytes = static_cast<uint64_t>(shape_numel(t->shape)) * 2;
      header[t->name] = {{"dtype", "BF16"},
                         {"shape", std::vector<int64_t>(t->shape.begin(), t->shape.end())},
                         {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
      weight_map[t->name] = file;
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // 8-byte aligned data, as the hub files are
    std::ofstream out(dir + "/" + file, std::ios::binary);
    const uint64_t length = text.size();
    out.write(reinterpret_cast<const char*>(&length), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    std::vector<uint16_t> values;
    for (const TensorToWrite* t : shards[s]) {
      values.resize(static_cast<size_t>(shape_numel(t->shape)));
      const uint64_t tensor_seed = seed + std::hash<std::string>{}(t->name);
      parallel_for(static_cast<int64_t>(values.size()), 1 << 16, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const float v =
              t->scale == 0.0f ? 1.0f : (2.0f * uniform_hash(tensor_seed, i) - 1.0f) * t->scale;
          values[i] = f32_to_bf16_bits(v);
        }
      });
      out.write(reinterpret_cast<const char*>(values.data()),
                static_cast<std::streamsize>(values.size() * 2));
      total += static_cast<int64_t>(values.size() * 2);
    }
  }
  if (shards.size() > 1) {
    std::ofstream(dir + "/" + stem + ".safetensors.index.json")
        << nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(
               1);
  }
  std::printf("%s: %zu tensors, %.2f GB in %zu file(s)\n", dir.c_str(), tensors.size(), total / 1e9,
              shards.size());
}

int run(int argc, char** argv) {
  CommandLine app("flux2_make_random_checkpoint");
  std::string model = "klein-4b", out;
  std::string tokenizer = std::string(FLUX2_TINY_CHECKPOINT_DIR) + "/tokenizer";
  double shard_gb = 5.0;
  app.add_option("--model", model);
  app.add_option("--out", out)->required();
  app.add_option("--tokenizer", tokenizer);
  app.add_option("--shard-gb", shard_gb);
  if (absl::Status parsed = app.parse_flags(argc, argv, 1); !parsed.ok()) {
    std::fprintf(stderr,
                 "%s\nusage: flux2_make_random_checkpoint --model klein-4b|klein-9b --out DIR "
                 "[--tokenizer DIR] [--shard-gb 5]\n",
                 std::string(parsed.message()).c_str());
    return 2;
  }
  const int64_t shard_bytes = static_cast<int64_t>(shard_gb * 1e9);
  auto spec = random_pipeline_spec(model, tokenizer);
  if (!spec.ok() || model == "dev") {
    std::fprintf(
        stderr, "--model: %s\n",
        spec.ok() ? "dev is not a klein pipeline" : std::string(spec.status().message()).c_str());
    return 2;
  }
  for (const char* sub : {"scheduler", "tokenizer", "text_encoder", "transformer", "vae"})
    fs::create_directories(out + "/" + sub);
  std::ofstream(out + "/model_index.json") << nlohmann::json{
      {"_class_name", "Flux2KleinPipeline"},
      {"_diffusers_version", "0.37.0.dev0"},
      {"is_distilled", true},
      {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
      {"text_encoder", {"transformers", "Qwen3ForCausalLM"}},
      {"tokenizer", {"transformers", "Qwen2TokenizerFast"}},
      {"transformer", {"diffusers", "Flux2Transformer2DModel"}},
      {"vae",
       {"diffusers", "AutoencoderKLFlux2"}}}.dump(1);
  fs::copy_file(std::string(FLUX2_TINY_CHECKPOINT_DIR) + "/scheduler/scheduler_config.json",
                out + "/scheduler/scheduler_config.json", fs::copy_options::overwrite_existing);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(tokenizer + "/" + file, out + "/tokenizer/" + file,
                  fs::copy_options::overwrite_existing);
  }

  const Flux2Config& f = spec->transformer;
  std::ofstream(out + "/transformer/config.json") << nlohmann::json{
      {"_class_name", "Flux2Transformer2DModel"},
      {"attention_head_dim", f.attention_head_dim},
      {"axes_dims_rope", f.axes_dims_rope},
      {"eps", f.eps},
      {"guidance_embeds", f.guidance_embeds},
      {"in_channels", f.in_channels},
      {"joint_attention_dim", f.joint_attention_dim},
      {"mlp_ratio", f.mlp_ratio},
      {"num_attention_heads", f.num_attention_heads},
      {"num_layers", f.num_layers},
      {"num_single_layers", f.num_single_layers},
      {"out_channels", nullptr},
      {"patch_size", 1},
      {"rope_theta", f.rope_theta},
      {"timestep_guidance_channels",
       f.timestep_guidance_channels}}.dump(1);
  Flux2Weights flux_weights;
  write_component(out + "/transformer", "diffusion_pytorch_model",
                  from_table(flux_weights.table(f)), shard_bytes, 1);

  const TextEncoderConfig& q = spec->text_encoder;
  std::ofstream(out + "/text_encoder/config.json") << nlohmann::json{
      {"architectures", {"Qwen3ForCausalLM"}},
      {"model_type", "qwen3"},
      {"hidden_size", q.hidden_size},
      {"num_hidden_layers", q.num_hidden_layers},
      {"num_attention_heads", q.num_attention_heads},
      {"num_key_value_heads", q.num_key_value_heads},
      {"head_dim", q.head_dim},
      {"intermediate_size", q.intermediate_size},
      {"vocab_size", q.vocab_size},
      {"rms_norm_eps", q.rms_norm_eps},
      {"rope_theta", q.rope_theta},
      {"tie_word_embeddings", true},
      {"attention_bias", false},
      {"hidden_act", "silu"},
      {"max_position_embeddings", 40960},
      {"torch_dtype", "bfloat16"}}.dump(1);
  TextEncoderWeights text_weights;
  std::vector<TensorToWrite> text =
      from_table(text_weights.table(q, q.num_hidden_layers));  // every layer
  text.push_back({"model.norm.weight", {q.hidden_size}, 1.0f});
  write_component(out + "/text_encoder", "model", text, shard_bytes, 2);

  const VaeConfig vae = published_vae_config();
  std::ofstream(out + "/vae/config.json")
      << nlohmann::json{{"_class_name", "AutoencoderKLFlux2"},
                        {"act_fn", "silu"},
                        {"batch_norm_eps", 1e-4},
                        {"batch_norm_momentum", 0.1},
                        {"block_out_channels", vae.block_out_channels},
                        {"in_channels", 3},
                        {"latent_channels", vae.latent_channels},
                        {"layers_per_block", vae.layers_per_block},
                        {"mid_block_add_attention", true},
                        {"norm_num_groups", vae.norm_num_groups},
                        {"out_channels", 3},
                        {"patch_size", {2, 2}},
                        {"sample_size", 1024},
                        {"use_post_quant_conv", true},
                        {"use_quant_conv", true},
                        {"force_upcast", true},
                        {"down_block_types", std::vector<std::string>(4, "DownEncoderBlock2D")},
                        {"up_block_types", std::vector<std::string>(4, "UpDecoderBlock2D")}}
             .dump(1);
  VaeWeights vae_weights;
  VaeEncoderWeights encoder_weights;
  std::vector<TensorToWrite> vae_tensors = from_table(vae_weights.table(vae));
  for (TensorToWrite& t : from_table(encoder_weights.table(vae))) {
    if (!t.name.starts_with("bn.")) vae_tensors.push_back(std::move(t));  // bn.* written once
  }
  for (TensorToWrite& t : vae_tensors) {
    if (t.name == "bn.running_var") t.scale = 0.0f;  // ones: variances must be positive
  }
  write_component(out + "/vae", "diffusion_pytorch_model", vae_tensors, shard_bytes, 3);
  return 0;
}

}  // namespace
}  // namespace flux2

int main(int argc, char** argv) {
  return flux2::run(argc, argv);
}
