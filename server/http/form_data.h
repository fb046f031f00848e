// multipart/form-data (RFC 7578 over RFC 2046's multipart syntax) parsed from a whole body: the
// boundary from Content-Type (quoted or not), preamble and epilogue skipped, CRLF delimiters only
// ("CRLF--boundary" ends a part, so boundary text inside the data without the CRLF is data), each
// part's Content-Disposition: form-data with its (quoted) name and filename. Errors are
// InvalidArgument saying what is wrong and where ("multipart body: part 3 has no name").
// Tested by tests/server/form_data_test.cc and fuzzed by tests/fuzz/fuzz_form_data.cc:
//   build-http/bin/http_transport_tests --gtest_filter='FormData*'
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace flux2::server::http {

// One field of a form. (server/openai_images.h has a FormPart of the same shape in
// flux2::server; this one is the transport-side parser's.)
struct FormPart {
  std::string name;      // the Content-Disposition name (required)
  std::string filename;  // empty for a text field
  std::string content;   // the part's bytes, as sent
};

struct FormLimits {
  int max_parts = 1024;                     // more parts: InvalidArgument
  int64_t max_part_header_bytes = 8 << 10;  // one part's header lines together
};

// The parts of `body`, in order. `content_type` is the request's Content-Type value
// ("multipart/form-data; boundary=..."). The boundary may be 1..200 characters of RFC 2046's
// bchars (70 is the RFC's limit; some clients send longer ones).
absl::StatusOr<std::vector<FormPart>> parse_form_data(std::string_view content_type,
                                                      std::string_view body,
                                                      const FormLimits& limits = {});

}  // namespace flux2::server::http
