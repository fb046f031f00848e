// libFuzzer target: the multipart/form-data parser (server/http/form_data.h) on arbitrary bytes:
// the first line is the Content-Type, the rest the body. A parsed form must be consistent (named
// parts whose contents fit in the body). Run by tests/fuzz/run_fuzzers.sh (seeds:
// corpus/form_data).
#include <cstdlib>
#include <string_view>

#include "server/http/form_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t newline = input.find('\n');
  const std::string_view type = input.substr(0, newline);
  const std::string_view body =
      newline == std::string_view::npos ? std::string_view() : input.substr(newline + 1);
  flux2::server::http::FormLimits limits;
  limits.max_parts = 64;
  limits.max_part_header_bytes = 512;
  const auto parts = flux2::server::http::parse_form_data(type, body, limits);
  if (!parts.ok()) {
    if (parts.status().message().substr(0, 16) != "multipart body: ") std::abort();
    return 0;
  }
  size_t content = 0;
  for (const auto& part : *parts) {
    if (part.name.empty()) std::abort();
    content += part.content.size();
  }
  if (parts->size() > 64 || content > body.size()) std::abort();
  return 0;
}
