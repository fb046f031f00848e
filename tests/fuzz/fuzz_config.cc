// libFuzzer target: the checkpoint's JSON readers on arbitrary bytes: model_index.json
// (ModelIndex::read) and, when the bytes are JSON, the transformer, VAE, text-encoder and scheduler
// configs. Run by tests/fuzz/run_fuzzers.sh (seeds: corpus/config, the tiny checkpoints' files).
#include "model/checkpoint.h"
#include "model/flux2_config.h"
#include "model/scheduler.h"
#include "model/text_encoder.h"
#include "model/vae_decoder.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = flux2::fuzz::scratch_dir();
  flux2::fuzz::write_file(dir + "/model_index.json", data, size);
  (void)flux2::ModelIndex::read(dir);
  const nlohmann::json json = nlohmann::json::parse(data, data + size, nullptr, false);
  if (json.is_discarded()) return 0;
  (void)flux2::Flux2Config::from_json(json, "config.json");
  (void)flux2::VaeConfig::from_json(json, "vae/config.json");
  (void)flux2::TextEncoderConfig::from_json(json, "text_encoder/config.json");
  (void)flux2::SchedulerConfig::from_json(json, "scheduler/scheduler_config.json");
  return 0;
}
