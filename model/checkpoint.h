// A checkpoint directory in the Hugging Face layout: model_index.json plus one folder per
// component (transformer/, vae/, text_encoder/, ...) holding config.json and safetensors weights,
// either one file or shards listed by *.safetensors.index.json. Tested by
// tests/host/checkpoint_test.cc.
#pragma once

#include <map>
#include <memory>
#include <optional>
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

// How an FP8 tensor's stored values become weights (model/fp8_checkpoint.h): row r of the
// weight is float(stored[r, :]) * weight[r], or * weight[0] for every row (a per-tensor scale).
struct Fp8Scales {
  std::vector<float> weight;   // 1 value (per tensor) or one per row, each finite and > 0
  std::optional<float> input;  // the file's static activation scale (input_scale), if any
  // The file asks for a bf16 GEMM on the dequantized weight (ComfyUI's full_precision_matrix_mult,
  // or a two-element scaled_fp8 marker).
  bool full_precision = false;
};

// Where one tensor of a component lives.
struct TensorRef {
  const SafetensorsFile* file = nullptr;
  const SafetensorsEntry* entry = nullptr;
  // Set for a tensor held in host memory instead of `file` (a view's rearranged copy; `entry`
  // then gives its name, dtype and shape only).
  const void* bytes = nullptr;
  // Set for an F8_E4M3 tensor of an FP8 checkpoint: its scales (owned by the view's storage).
  const Fp8Scales* fp8 = nullptr;
  const void* data() const { return bytes != nullptr ? bytes : file->data(*entry); }
};

// All weights of one component directory, by tensor name (shards merged).
class ComponentWeights {
 public:
  // Opens `dir` (e.g. "<model>/transformer"): its config.json and its safetensors.
  static absl::StatusOr<ComponentWeights> open(const std::string& dir);

  // A view that is not one directory: `tensors` point into storage `keep_alive` owns (a Black
  // Forest Labs single file under diffusers names, model/bfl_checkpoint.h). `source` (the file)
  // stands for dir() in errors; `config_path` says where `config` came from.
  static ComponentWeights from_view(std::string source, nlohmann::json config,
                                    std::string config_path,
                                    std::map<std::string, TensorRef, std::less<>> tensors,
                                    std::shared_ptr<const void> keep_alive);

  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  std::string config_path() const { return config_path_; }
  // The tensor called `name`, or null.
  const TensorRef* find(absl::string_view name) const;
  const std::map<std::string, TensorRef, std::less<>>& tensors() const { return tensors_; }

 private:
  std::string dir_;
  std::string config_path_;  // dir_ + "/config.json" for a directory
  nlohmann::json config_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::shared_ptr<const void> view_storage_;  // from_view's keep_alive
  std::map<std::string, TensorRef, std::less<>> tensors_;
};

}  // namespace flux2
