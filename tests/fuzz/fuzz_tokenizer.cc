// libFuzzer target: the tokenizers on arbitrary bytes: the tiny checkpoints' Qwen3 (klein) and
// Tekken (dev) tokenizer.json encode the input as a prompt; an input that is a JSON object is
// also loaded as a tokenizer.json itself (models, pre-tokenizer regexes, added tokens), and when
// that loads, encodes a fixed text. Run by tests/fuzz/run_fuzzers.sh (seeds: corpus/tokenizer).
#include <memory>
#include <vector>

#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

// The tokenizers of the test data (an absent tokenizer.json is skipped: it is installed at setup).
const std::vector<std::unique_ptr<flux2::Tokenizer>>& tokenizers() {
  static const std::vector<std::unique_ptr<flux2::Tokenizer>> loaded = [] {
    std::vector<std::unique_ptr<flux2::Tokenizer>> all;
    for (const char* dir :
         {"/tiny-klein/checkpoint/tokenizer", "/tiny-flux2-dev/checkpoint/tokenizer"}) {
      absl::StatusOr<std::unique_ptr<flux2::Tokenizer>> tokenizer =
          flux2::Tokenizer::load(std::string(FLUX2_TEST_DATA) + dir);
      if (tokenizer.ok()) all.push_back(std::move(*tokenizer));
    }
    return all;
  }();
  return loaded;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  for (const auto& tokenizer : tokenizers()) (void)tokenizer->encode(text);
  if (size > 0 && data[0] == '{') {
    const nlohmann::json json = nlohmann::json::parse(data, data + size, nullptr, false);
    if (!json.is_discarded()) {
      absl::StatusOr<std::unique_ptr<flux2::Tokenizer>> tokenizer =
          flux2::Tokenizer::from_json(json, nlohmann::json(), "tokenizer.json");
      if (tokenizer.ok()) (void)(*tokenizer)->encode("a red fox in fresh snow <|im_end|> 123");
    }
  }
  return 0;
}
