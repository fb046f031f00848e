// libFuzzer target: the JSON body parser (server/http/json_body.h) on arbitrary bytes, with a
// small depth limit. A parsed body must be no deeper than the limit and dump as JSON again
// (valid UTF-8); an error must be InvalidArgument whose message starts with its param. Run by
// tests/fuzz/run_fuzzers.sh (seeds: corpus/json_body).
#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/http/json_body.h"

namespace {

constexpr int kMaxDepth = 8;

int depth_of(const nlohmann::json& value) {
  int deepest = 0;
  if (value.is_structured()) {
    for (const auto& element : value) deepest = std::max(deepest, depth_of(element));
    return deepest + 1;
  }
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const auto parsed = flux2::server::http::parse_json_body(body, kMaxDepth);
  if (!parsed.ok()) {
    const std::string param = flux2::server::http::json_error_param(parsed.status());
    const std::string message(parsed.status().message());
    if (!absl::IsInvalidArgument(parsed.status()) || param.empty() ||
        message.compare(0, param.size() + 2, param + ": ") != 0) {
      std::abort();
    }
    return 0;
  }
  if (depth_of(*parsed) > kMaxDepth) std::abort();
  (void)parsed->dump();  // throws (and so crashes the fuzzer) on invalid UTF-8
  return 0;
}
