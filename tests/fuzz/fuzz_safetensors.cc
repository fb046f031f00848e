// libFuzzer target: a safetensors file (header JSON, offsets, dtypes, shapes, data section at any
// alignment) opened and every tensor read as f32; and the same bytes as a component's
// model.safetensors.index.json. Run by tests/fuzz/run_fuzzers.sh (seeds: corpus/safetensors).
#include <filesystem>

#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = flux2::fuzz::scratch_dir();
  const std::string file = dir + "/input.safetensors";
  flux2::fuzz::write_file(file, data, size);
  absl::StatusOr<std::unique_ptr<flux2::SafetensorsFile>> opened =
      flux2::SafetensorsFile::open(file);
  if (opened.ok()) {
    for (const flux2::SafetensorsEntry& entry : (*opened)->entries()) {
      (void)flux2::read_f32(**opened, entry.name);
    }
  }
  // The index of a sharded component: the input as model.safetensors.index.json beside an empty
  // config, naming shards that do not exist (or the file above, renamed).
  const std::string component = dir + "/component";
  std::filesystem::create_directories(component);
  const uint8_t config[] = "{}";
  flux2::fuzz::write_file(component + "/config.json", config, sizeof(config) - 1);
  flux2::fuzz::write_file(component + "/diffusion_pytorch_model.safetensors.index.json", data,
                          size);
  (void)flux2::ComponentWeights::open(component);
  return 0;
}
