// A checkpoint directory in the Hugging Face layout: model_index.json plus one folder per
// component (transformer/, vae/, text_encoder/, ...) holding config.json and safetensors weights,
// either one file or shards listed by *.safetensors.index.json. Tested by
// tests/host/checkpoint_test.cc.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace flux2 {

// model_index.json: the pipeline class and its components.
struct ModelIndex {
  std::string class_name;     // "Flux2KleinPipeline" or "Flux2Pipeline"
  bool is_distilled = false;  // klein distilled (4 steps, no CFG) vs base (CFG); absent = false
  // component name -> [library, class], e.g. "vae" -> ["diffusers", "AutoencoderKLFlux2"]
  std::map<std::string, std::vector<std::string>> components;

  static absl::StatusOr<ModelIndex> read(const std::string& model_dir);
};

// Where one tensor of a component lives.
struct TensorRef {
  const SafetensorsFile* file = nullptr;
  const SafetensorsEntry* entry = nullptr;
  const void* data() const { return file->data(*entry); }
};

// All weights of one component directory, by tensor name (shards merged).
class ComponentWeights {
 public:
  // Opens `dir` (e.g. "<model>/transformer"): its config.json and its safetensors.
  static absl::StatusOr<ComponentWeights> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  std::string config_path() const { return dir_ + "/config.json"; }
  // The tensor called `name`, or null.
  const TensorRef* find(absl::string_view name) const;
  const std::map<std::string, TensorRef, std::less<>>& tensors() const { return tensors_; }

 private:
  std::string dir_;
  nlohmann::json config_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorRef, std::less<>> tensors_;
};

}  // namespace flux2
