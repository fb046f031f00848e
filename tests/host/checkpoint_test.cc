// Loading the golden checkpoint through the tensor table, and the errors for a deleted, renamed,
// truncated or re-shaped tensor, a sharded layout and a config that disagrees with the weights.
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "model/checkpoint.h"
#include "model/flux2_transformer.h"
#include "model/json_util.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

constexpr char kWeights[] = "diffusion_pytorch_model.safetensors";

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    transformer_dir_ = dir_.path() + "/transformer";
    testing::copy_tree(testing::test_data_dir() + "/tiny-klein/checkpoint/transformer",
                       transformer_dir_);
    weights_path_ = transformer_dir_ + "/" + kWeights;
    tensors_ = testing::read_all_tensors(weights_path_);
  }
  absl::Status load() {
    auto weights = ComponentWeights::open(transformer_dir_);
    if (!weights.ok()) return weights.status();
    auto model = Flux2Transformer::load(backend_, *weights);
    return model.ok() ? absl::OkStatus() : model.status();
  }
  void rewrite() { testing::write_safetensors(weights_path_, tensors_); }

  testing::TempDir dir_;
  std::string transformer_dir_, weights_path_;
  std::map<std::string, testing::RawTensor> tensors_;
  CpuBackend backend_;
};

TEST_F(CheckpointTest, LoadsTinyKlein) {
  auto weights = ComponentWeights::open(transformer_dir_);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto model = Flux2Transformer::load(backend_, *weights);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().num_layers, 2);
  EXPECT_EQ((*model)->config().num_single_layers, 3);
  EXPECT_FALSE((*model)->config().guidance_embeds);
  // 9 top-level + 2 x 16 + 3 x 4 tensors (model/README.md's counting rule).
  EXPECT_EQ((*model)->load_report().tensors, 9 + 2 * 16 + 3 * 4);
  EXPECT_GT((*model)->load_report().device_bytes, 0);
}

TEST_F(CheckpointTest, DeletedTensorIsNamed) {
  tensors_.erase("transformer_blocks.1.attn.to_q.weight");
  rewrite();
  const absl::Status status = load();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("missing tensors: transformer_blocks.1.attn.to_q.weight"));
}

TEST_F(CheckpointTest, RenamedTensorIsMissingAndUnexpected) {
  auto node = tensors_.extract("x_embedder.weight");
  node.key() = "x_embedder.weights";
  tensors_.insert(std::move(node));
  rewrite();
  const absl::Status status = load();
  EXPECT_THAT(status.message(), HasSubstr("missing tensors: x_embedder.weight"));
  EXPECT_THAT(status.message(), HasSubstr("unexpected tensors: x_embedder.weights"));
}

TEST_F(CheckpointTest, ReshapedTensorIsNamed) {
  tensors_["proj_out.weight"].shape = {96, 128};
  rewrite();
  const absl::Status status = load();
  EXPECT_THAT(status.message(),
              HasSubstr("wrong shape: proj_out.weight is [96, 128], expected [128, 96]"));
}

TEST_F(CheckpointTest, TruncatedFileNamesFileAndTensor) {
  const auto size = fs::file_size(weights_path_);
  fs::resize_file(weights_path_, size - 100);
  const absl::Status status = load();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(weights_path_));
  EXPECT_THAT(status.message(), HasSubstr("tensor \""));
  EXPECT_THAT(status.message(), HasSubstr("outside the data section"));
}

TEST_F(CheckpointTest, ConfigDisagreeingWithWeightsListsMissingBlocks) {
  auto config = read_json_file(transformer_dir_ + "/config.json");
  ASSERT_TRUE(config.ok());
  (*config)["num_layers"] = 3;
  std::ofstream(transformer_dir_ + "/config.json") << config->dump();
  const absl::Status status = load();
  EXPECT_THAT(status.message(), HasSubstr("transformer_blocks.2.attn.to_q.weight"));
}

TEST_F(CheckpointTest, LoadsShardedCheckpoint) {
  std::map<std::string, testing::RawTensor> first, second;
  nlohmann::json weight_map = nlohmann::json::object();
  for (auto& [name, tensor] : tensors_) {
    const bool in_first = name.rfind("single_", 0) != 0;
    (in_first ? first : second)[name] = tensor;
    weight_map[name] =
        in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  fs::remove(weights_path_);
  testing::write_safetensors(transformer_dir_ + "/model-00001-of-00002.safetensors", first);
  testing::write_safetensors(transformer_dir_ + "/model-00002-of-00002.safetensors", second);
  std::ofstream(transformer_dir_ + "/model.safetensors.index.json")
      << nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump();
  EXPECT_TRUE(load().ok()) << load();
}

TEST_F(CheckpointTest, ShardIndexPointingAtWrongShardIsAnError) {
  std::map<std::string, testing::RawTensor> first, second;
  nlohmann::json weight_map = nlohmann::json::object();
  for (auto& [name, tensor] : tensors_) {
    const bool in_first = name != "proj_out.weight";
    (in_first ? first : second)[name] = tensor;
    weight_map[name] = "a.safetensors";  // proj_out.weight is really in b
  }
  fs::remove(weights_path_);
  testing::write_safetensors(transformer_dir_ + "/a.safetensors", first);
  testing::write_safetensors(transformer_dir_ + "/b.safetensors", second);
  std::ofstream(transformer_dir_ + "/x.safetensors.index.json")
      << nlohmann::json{{"weight_map", weight_map}}.dump();
  const absl::Status status = load();
  EXPECT_THAT(status.message(), HasSubstr("proj_out.weight"));
}

TEST_F(CheckpointTest, MissingComponentDirectoryIsNotFound) {
  auto weights = ComponentWeights::open(dir_.path() + "/vae");
  EXPECT_EQ(weights.status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelIndexTest, ReadsTinyKlein) {
  auto index = ModelIndex::read(testing::test_data_dir() + "/tiny-klein/checkpoint");
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->class_name, "Flux2KleinPipeline");
  EXPECT_TRUE(index->is_distilled);
  EXPECT_EQ(index->components.at("vae")[1], "AutoencoderKLFlux2");
}

}  // namespace
}  // namespace flux2
