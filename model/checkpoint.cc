// Checkpoint directory reading: model_index.json, config.json, single and sharded safetensors.
// Tested by tests/host/checkpoint_test.cc.
#include "model/checkpoint.h"

#include <filesystem>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/base/status.h"
#include "model/json_util.h"

namespace flux2 {
namespace fs = std::filesystem;

absl::StatusOr<ModelIndex> ModelIndex::read(const std::string& model_dir) {
  const std::string path = model_dir + "/model_index.json";
  FLUX_ASSIGN_OR_RETURN(nlohmann::json json, read_json_file(path));
  if (!json.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  ModelIndex index;
  JsonFields fields(json, path);
  FLUX_RETURN_IF_ERROR(fields.read("_class_name", &index.class_name, /*required=*/true));
  FLUX_RETURN_IF_ERROR(fields.read("is_distilled", &index.is_distilled));
  for (auto it = json.begin(); it != json.end(); ++it) {
    if (!it.value().is_array()) continue;
    std::vector<std::string> parts;
    for (const auto& part : it.value()) {
      if (part.is_string()) parts.push_back(part.get<std::string>());
    }
    index.components[it.key()] = std::move(parts);
  }
  return index;
}

namespace {

// The *.safetensors.index.json or the single *.safetensors of a component directory.
absl::StatusOr<std::vector<std::string>> find_weight_files(const std::string& dir,
                                                           std::string* index_path) {
  std::vector<std::string> indexes, singles;
  std::error_code error;
  for (const auto& item : fs::directory_iterator(dir, error)) {
    const std::string name = item.path().filename().string();
    if (absl::EndsWith(name, ".safetensors.index.json")) indexes.push_back(item.path().string());
    if (absl::EndsWith(name, ".safetensors")) singles.push_back(item.path().string());
  }
  if (error) return absl::NotFoundError(absl::StrCat(dir, ": cannot list: ", error.message()));
  if (indexes.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": several shard indexes: ", absl::StrJoin(indexes, ", ")));
  }
  if (indexes.size() == 1) {
    *index_path = indexes[0];
    return std::vector<std::string>{};
  }
  if (singles.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": expected one *.safetensors file or a *.safetensors.index.json, found ",
                     singles.empty() ? std::string("none") : absl::StrJoin(singles, ", ")));
  }
  return singles;
}

}  // namespace

absl::StatusOr<ComponentWeights> ComponentWeights::open(const std::string& dir) {
  if (!fs::is_directory(dir)) return absl::NotFoundError(absl::StrCat(dir, ": no such directory"));
  ComponentWeights weights;
  weights.dir_ = dir;
  weights.config_path_ = dir + "/config.json";
  FLUX_ASSIGN_OR_RETURN(weights.config_, read_json_file(weights.config_path_));

  std::string index_path;
  FLUX_ASSIGN_OR_RETURN(std::vector<std::string> files, find_weight_files(dir, &index_path));
  // For a sharded checkpoint: tensor name -> shard file name, as the index declares it.
  std::map<std::string, std::string> weight_map;
  if (!index_path.empty()) {
    FLUX_ASSIGN_OR_RETURN(nlohmann::json index, read_json_file(index_path));
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": no \"weight_map\" object"));
    }
    std::set<std::string> shards;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map entry \"", it.key(), "\" is not a file name"));
      }
      weight_map[it.key()] = it.value().get<std::string>();
      shards.insert(it.value().get<std::string>());
    }
    for (const std::string& shard : shards) files.push_back(dir + "/" + shard);
  }

  for (const std::string& path : files) {
    FLUX_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::open(path));
    std::shared_ptr<SafetensorsFile> shared = std::move(file);
    const std::string shard_name = fs::path(path).filename().string();
    for (const SafetensorsEntry& entry : shared->entries()) {
      if (!weight_map.empty()) {
        auto declared = weight_map.find(entry.name);
        if (declared == weight_map.end() || declared->second != shard_name) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ": tensor \"", entry.name, "\" is not assigned to this shard by ", index_path));
        }
      }
      auto [it, inserted] = weights.tensors_.emplace(entry.name, TensorRef{shared.get(), &entry});
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": tensor \"", entry.name, "\" also appears in ", it->second.file->path()));
      }
    }
    weights.files_.push_back(std::move(shared));
  }
  for (const auto& [name, shard] : weight_map) {
    if (weights.tensors_.find(name) == weights.tensors_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor \"", name,
                                                     "\" is listed for ", shard, " but not in it"));
    }
  }
  return weights;
}

ComponentWeights ComponentWeights::from_view(std::string source, nlohmann::json config,
                                             std::string config_path,
                                             std::map<std::string, TensorRef, std::less<>> tensors,
                                             std::shared_ptr<const void> keep_alive) {
  ComponentWeights weights;
  weights.dir_ = std::move(source);
  weights.config_path_ = std::move(config_path);
  weights.config_ = std::move(config);
  weights.tensors_ = std::move(tensors);
  weights.view_storage_ = std::move(keep_alive);
  return weights;
}

const TensorRef* ComponentWeights::find(absl::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace flux2
