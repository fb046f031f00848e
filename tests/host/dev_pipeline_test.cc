// FLUX.2-dev's model layer beyond the goldens: the Mistral3 text-encoder config, both hub
// tensor-name layouts and sharded checkpoints giving the same embeddings, weights streamed from
// host memory giving the resident encoder's exact bytes, the memory plan and its start-up
// refusal, the prompt-embedding cache (LRU order, same bytes with and without it) and the dev
// pipeline's request rules (no negative prompt, defaults). The goldens themselves run in
// `flux2 check-golden --golden tests/data/tiny-flux2-dev`.
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/checkpoint.h"
#include "model/memory_plan.h"
#include "model/pipeline.h"
#include "model/prompt_cache.h"
#include "model/text_encoder.h"
#include "nlohmann/json.hpp"
#include "tests/host/bfl_writer.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using ::testing::HasSubstr;

std::string dev_checkpoint() {
  return testing::test_data_dir() + "/tiny-flux2-dev/checkpoint";
}

using testing::download;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// ---- config ------------------------------------------------------------------------------------

TEST(MistralConfigTest, ReadsTheMistral3TextConfig) {
  const std::string path = dev_checkpoint() + "/text_encoder/config.json";
  auto config = TextEncoderConfig::from_json(read_json(path), path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->family, TextEncoderFamily::kMistral);
  EXPECT_EQ(config->hidden_size, 16);
  EXPECT_EQ(config->num_hidden_layers, 31);
  EXPECT_EQ(config->num_attention_heads, 4);
  EXPECT_EQ(config->num_key_value_heads, 2);
  EXPECT_EQ(config->head_dim, 16);
  EXPECT_EQ(config->vocab_size, 131072);
  EXPECT_DOUBLE_EQ(config->rope_theta, 1e9);
  EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-5);
}

TEST(MistralConfigTest, UnsupportedSettingsNameTheField) {
  const std::string path = dev_checkpoint() + "/text_encoder/config.json";
  nlohmann::json json = read_json(path);
  nlohmann::json windowed = json;
  windowed["text_config"]["sliding_window"] = 4096;
  auto status = TextEncoderConfig::from_json(windowed, "cfg").status();
  EXPECT_THAT(status.message(), HasSubstr("sliding_window"));
  nlohmann::json bare = json;
  bare.erase("text_config");
  EXPECT_THAT(TextEncoderConfig::from_json(bare, "cfg").status().message(),
              HasSubstr("text_config"));
  nlohmann::json other = json;
  other["text_config"]["model_type"] = "llama";
  EXPECT_THAT(TextEncoderConfig::from_json(other, "cfg").status().message(),
              HasSubstr("model_type"));
}

// ---- loading: layouts, shards, streaming
// ---------------------------------------------------------

class MistralEncoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = dev_checkpoint() + "/text_encoder";
    // A prompt-like id sequence: 12 real tokens, then <pad> (11) up to 16.
    ids_ = {1, 17, 1784, 4529, 1261, 18, 3, 1097, 4829, 1307, 9018, 4, 11, 11, 11, 11};
  }
  absl::StatusOr<std::vector<float>> encode(const std::string& dir,
                                            WeightResidency residency = WeightResidency::kDevice,
                                            int64_t* device_bytes = nullptr,
                                            int64_t* host_bytes = nullptr) {
    auto weights = ComponentWeights::open(dir);
    if (!weights.ok()) return weights.status();
    auto model = TextEncoder::load(backend_, *weights, {10, 20, 30}, residency);
    if (!model.ok()) return model.status();
    if (device_bytes != nullptr) *device_bytes = (*model)->device_bytes();
    if (host_bytes != nullptr) *host_bytes = (*model)->host_bytes();
    auto embeds = (*model)->encode(ids_, 12);
    if (!embeds.ok()) return embeds.status();
    return download(backend_, *embeds);
  }
  // A copy of the tiny text encoder whose tensors are renamed by `rename` and split over
  // `shards` files with a model.safetensors.index.json.
  std::string rewritten(const std::function<std::string(const std::string&)>& rename, int shards) {
    const std::string dir = temp_.path() + "/text_encoder_" + std::to_string(count_++);
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(source_ + "/config.json", dir + "/config.json");
    std::map<std::string, testing::RawTensor> tensors =
        testing::read_all_tensors(source_ + "/model.safetensors");
    std::vector<std::map<std::string, testing::RawTensor>> parts(static_cast<size_t>(shards));
    nlohmann::json index = {{"metadata", nlohmann::json::object()},
                            {"weight_map", nlohmann::json::object()}};
    int k = 0;
    for (auto& [name, tensor] : tensors) {
      const int shard = k++ % shards;
      const std::string file =
          shards == 1 ? "model.safetensors"
                      : absl::StrCat("model-0000", shard + 1, "-of-0000", shards, ".safetensors");
      index["weight_map"][rename(name)] = file;
      parts[shard][rename(name)] = tensor;
    }
    for (int s = 0; s < shards; ++s) {
      const std::string file =
          shards == 1 ? "model.safetensors"
                      : absl::StrCat("model-0000", s + 1, "-of-0000", shards, ".safetensors");
      testing::write_safetensors(dir + "/" + file, parts[s]);
    }
    if (shards > 1) std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
    return dir;
  }

  CpuBackend backend_;
  testing::TempDir temp_;
  std::string source_;
  std::vector<int32_t> ids_;
  int count_ = 0;
};

TEST_F(MistralEncoderTest, BothHubLayoutsAndShardsGiveTheSameEmbeddings) {
  auto original = encode(source_);
  ASSERT_TRUE(original.ok()) << original.status();
  // transformers 4.52-4.x: model.language_model.*, model.vision_tower.*,
  // model.multi_modal_projector.*
  const std::string moved = rewritten(
      [](const std::string& name) {
        std::string out = name;
        if (absl::StartsWith(name, "language_model.model.")) {
          out = "model.language_model." + name.substr(std::string("language_model.model.").size());
        } else if (absl::StartsWith(name, "vision_tower.") ||
                   absl::StartsWith(name, "multi_modal_projector.")) {
          out = "model." + name;
        }
        return out;
      },
      3);
  auto from_moved = encode(moved);
  ASSERT_TRUE(from_moved.ok()) << from_moved.status();
  EXPECT_EQ(*from_moved, *original);
  // The original layout, sharded, with an untied lm_head (never read).
  const std::string sharded = rewritten([](const std::string& name) { return name; }, 2);
  auto from_shards = encode(sharded);
  ASSERT_TRUE(from_shards.ok()) << from_shards.status();
  EXPECT_EQ(*from_shards, *original);
}

TEST_F(MistralEncoderTest, ComfyUisSingleFileLayoutGivesTheSameEmbeddings) {
  auto original = encode(source_);
  ASSERT_TRUE(original.ok()) << original.status();
  // ComfyUI's text-encoder files (mistral_3_small_flux2_*.safetensors): the language model under
  // model.*, the image path (bf16 file) at the top level, and Mistral's tokenizer as a U8 tensor
  // `tekken_model` (ComfyUI builds its tokenizer from it); only the language model is read.
  const std::string dir = rewritten(
      [](const std::string& name) {
        const std::string lm = "language_model.";
        return absl::StartsWith(name, lm) ? name.substr(lm.size()) : name;
      },
      1);
  auto tensors = testing::read_all_tensors(dir + "/model.safetensors");
  const std::string tekken = R"({"config": {"pattern": "..."}, "vocab": []})";
  tensors["tekken_model"] = testing::RawTensor{
      "U8", {static_cast<int64_t>(tekken.size())}, {tekken.begin(), tekken.end()}};
  testing::write_safetensors(dir + "/model.safetensors", tensors);
  auto comfy = encode(dir);
  ASSERT_TRUE(comfy.ok()) << comfy.status();
  EXPECT_EQ(*comfy, *original);
}

TEST_F(MistralEncoderTest, AQkNormTensorIsUnexpected) {
  // Mistral has no q/k norm: such a tensor in a used layer is a checkpoint of another model.
  const std::string dir = rewritten([](const std::string& name) { return name; }, 1);
  auto tensors = testing::read_all_tensors(dir + "/model.safetensors");
  tensors["language_model.model.layers.3.self_attn.q_norm.weight"] =
      testing::f32_tensor({16}, std::vector<float>(16, 1.0f));
  testing::write_safetensors(dir + "/model.safetensors", tensors);
  auto result = encode(dir);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(),
              HasSubstr("unexpected tensors: language_model.model.layers.3.self_attn.q_norm"));
}

TEST_F(MistralEncoderTest, NoEmbeddingUnderAnyPrefixIsNamed) {
  const std::string dir = rewritten([](const std::string& name) { return "x." + name; }, 1);
  auto result = encode(dir);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("language_model.model.embed_tokens.weight"));
}

TEST_F(MistralEncoderTest, StreamedWeightsGiveTheResidentBytes) {
  int64_t resident_device = 0, resident_host = 0, streamed_device = 0, streamed_host = 0;
  auto resident = encode(source_, WeightResidency::kDevice, &resident_device, &resident_host);
  auto streamed = encode(source_, WeightResidency::kStreamed, &streamed_device, &streamed_host);
  ASSERT_TRUE(resident.ok()) << resident.status();
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(*streamed, *resident);
  EXPECT_EQ(resident_host, 131072 * 16 * 4);  // the embedding, whose rows are gathered on the host
  EXPECT_EQ(streamed_host, resident_device + resident_host);  // everything in host memory
  // Two layer buffers: (input and post norms + qkv + o + gate_up + down) x 4 bytes each.
  const int64_t layer = (16 + 16 + (64 + 32 + 32) * 16 + 16 * 64 + 96 * 16 + 16 * 48) * 4;
  EXPECT_EQ(streamed_device, 2 * layer);
  // The memory plan predicts both from the config alone.
  auto weights = ComponentWeights::open(source_);
  ASSERT_TRUE(weights.ok());
  auto planned = TextEncoder::planned_bytes(*weights, {10, 20, 30}, WeightResidency::kDevice, 4);
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_EQ(planned->first, resident_device);
  EXPECT_EQ(planned->second, resident_host);
  planned = TextEncoder::planned_bytes(*weights, {10, 20, 30}, WeightResidency::kStreamed, 4);
  ASSERT_TRUE(planned.ok());
  EXPECT_EQ(planned->first, streamed_device);
  EXPECT_EQ(planned->second, streamed_host);
}

// ---- memory plan
// ---------------------------------------------------------------------------------

TEST(MemoryPlanTest, RefusesAPlanLargerThanTheFreeMemoryAndNamesTheOffloadFlag) {
  MemoryPlan plan;
  plan.text_encoder_device = 34'600'000'000;
  plan.transformer = 64'400'000'000;
  plan.vae = 200'000'000;
  plan.working = kWorkingBytes;
  EXPECT_TRUE(check_memory_plan(plan, -1, "dev", false, "--text-encoder-offload").ok());
  EXPECT_TRUE(check_memory_plan(plan, 141'000'000'000, "dev", false, "--flag").ok());
  const absl::Status refused = check_memory_plan(plan, 79'000'000'000, "dev", false, "--flag");
  EXPECT_TRUE(absl::IsResourceExhausted(refused));
  EXPECT_THAT(refused.message(), HasSubstr("79.00 GB are free"));
  EXPECT_THAT(refused.message(), HasSubstr("transformer 64.40 GB"));
  EXPECT_THAT(refused.message(), HasSubstr("--flag keeps the text encoder in pinned host memory"));
  const absl::Status streamed = check_memory_plan(plan, 79'000'000'000, "dev", true, "--flag");
  EXPECT_FALSE(absl::StrContains(streamed.message(), "--flag"));
  // The LoRA adapters' device budget (--lora-cache-bytes) is part of the plan.
  plan.lora_cache = 45'000'000'000;
  const absl::Status lora = check_memory_plan(plan, 141'000'000'000, "dev", false, "--flag");
  EXPECT_TRUE(absl::IsResourceExhausted(lora));
  EXPECT_THAT(lora.message(), HasSubstr("LoRA cache 45.00 GB"));
}

// ---- prompt cache
// --------------------------------------------------------------------------------

Tensor host_tensor(int64_t values) {
  auto storage =
      std::shared_ptr<void>(new float[values], [](void* p) { delete[] static_cast<float*>(p); });
  return Tensor(storage, storage.get(), DType::kF32, Device::kCpu, {values}, values);
}

TEST(PromptCacheTest, EvictsTheLeastRecentlyUsedToStayWithinItsBytes) {
  PromptCache cache(3 * 400);  // three 100-float entries
  for (int32_t k = 0; k < 3; ++k) cache.insert({{k}, 1}, host_tensor(100));
  EXPECT_EQ(cache.size(), 3);
  EXPECT_TRUE(cache.find({{0}, 1}).has_value());  // 0 is now the most recent
  cache.insert({{3}, 1}, host_tensor(100));       // evicts 1, the least recently used
  EXPECT_FALSE(cache.find({{1}, 1}).has_value());
  EXPECT_TRUE(cache.find({{0}, 1}).has_value());
  EXPECT_TRUE(cache.find({{2}, 1}).has_value());
  EXPECT_TRUE(cache.find({{3}, 1}).has_value());
  EXPECT_EQ(cache.bytes(), 1200);
  // The unpadded length is part of the key; an entry over the capacity is not kept.
  EXPECT_FALSE(cache.find({{0}, 2}).has_value());
  cache.insert({{9}, 1}, host_tensor(1000));
  EXPECT_FALSE(cache.find({{9}, 1}).has_value());
  PromptCache off(0);
  off.insert({{0}, 1}, host_tensor(1));
  EXPECT_EQ(off.size(), 0);
}

// ---- the dev pipeline
// ----------------------------------------------------------------------------

class DevPipelineTest : public ::testing::Test {
 protected:
  std::unique_ptr<Pipeline> load(int64_t cache_bytes) {
    PipelineOptions options;
    options.prompt_cache_bytes = cache_bytes;
    auto pipeline = Pipeline::load(backend_, dev_checkpoint(), options);
    EXPECT_TRUE(pipeline.ok()) << pipeline.status();
    return pipeline.ok() ? std::move(*pipeline) : nullptr;
  }
  GenerateParams params() const {
    GenerateParams p;
    p.prompt = "a red fox in the snow, watercolor";
    p.width = 32;
    p.height = 32;
    p.num_inference_steps = 2;
    p.max_sequence_length = 64;
    p.seed = 7;
    return p;
  }
  CpuBackend backend_;
};

TEST_F(DevPipelineTest, DescribesTheDevModel) {
  auto pipeline = load(kDefaultPromptCacheBytes);
  ASSERT_NE(pipeline, nullptr);
  const PipelineInfo& info = pipeline->info();
  EXPECT_EQ(info.variant, "dev");
  EXPECT_EQ(info.pipeline_class, "Flux2Pipeline");
  EXPECT_TRUE(info.guidance_embedded);
  EXPECT_FALSE(info.uses_cfg);
  EXPECT_EQ(info.default_steps, 50);
  EXPECT_DOUBLE_EQ(info.default_guidance, 4.0);
  EXPECT_EQ(info.prompt_cache_bytes, kDefaultPromptCacheBytes);
  EXPECT_FALSE(info.text_encoder_streamed);
}

TEST_F(DevPipelineTest, ANegativePromptIsRefusedByName) {
  auto pipeline = load(0);
  ASSERT_NE(pipeline, nullptr);
  GenerateParams p = params();
  p.negative_prompt = "blurry";
  const absl::Status status = pipeline->validate(p);
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_THAT(status.message(), HasSubstr("negative_prompt: "));
}

TEST_F(DevPipelineTest, ThePromptCacheServesRepeatsWithTheSameBytes) {
  auto cached = load(kDefaultPromptCacheBytes);
  auto uncached = load(0);
  ASSERT_NE(cached, nullptr);
  ASSERT_NE(uncached, nullptr);
  auto first = cached->generate(params());
  auto second = cached->generate(params());
  auto plain = uncached->generate(params());
  auto plain_again = uncached->generate(params());
  ASSERT_TRUE(first.ok() && second.ok() && plain.ok() && plain_again.ok());
  EXPECT_FALSE(first->prompt_cache_hit);
  EXPECT_TRUE(second->prompt_cache_hit);
  EXPECT_FALSE(plain_again->prompt_cache_hit);
  EXPECT_EQ(second->rgb, first->rgb);
  EXPECT_EQ(plain->rgb, first->rgb);
  // Guidance is embedded: another guidance scale changes the image.
  GenerateParams other = params();
  other.guidance_scale = 2.5;
  auto guided = cached->generate(other);
  ASSERT_TRUE(guided.ok());
  EXPECT_NE(guided->rgb, first->rgb);
}

TEST_F(DevPipelineTest, ABflSingleFileTransformerGivesTheSameImage) {
  testing::TempDir dir;
  auto diffusers = ComponentWeights::open(dev_checkpoint() + "/transformer");
  ASSERT_TRUE(diffusers.ok()) << diffusers.status();
  const std::string file = dir.path() + "/flux2-dev.safetensors";
  ASSERT_TRUE(testing::write_bfl_transformer(*diffusers, file).ok());
  PipelineOptions options;
  options.transformer_file = file;
  auto from_file = Pipeline::load(backend_, dev_checkpoint(), options);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  auto from_dir = load(0);
  ASSERT_NE(from_dir, nullptr);
  auto a = (*from_file)->generate(params());
  auto b = from_dir->generate(params());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->rgb, b->rgb);
  // A diffusers-named file is not what --transformer-file takes.
  options.transformer_file = dev_checkpoint() + "/transformer/diffusion_pytorch_model.safetensors";
  auto wrong = Pipeline::load(backend_, dev_checkpoint(), options);
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("not a Black Forest Labs"));
}

}  // namespace
}  // namespace flux2
