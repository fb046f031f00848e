// A JSON request body parsed with the checks a DOM parse alone does not make: nesting deeper than
// max_depth is refused as the parser meets it (memory O(max_depth), whatever the body), duplicate
// object keys are refused naming the key, numbers that overflow a double (1e400) and invalid
// UTF-8 (or lone surrogate escapes) are refused naming the member, and a UTF-8 byte order mark is
// refused. Tested by tests/server/json_body_test.cc, fuzzed by tests/fuzz/fuzz_json_body.cc:
//   build-http/bin/http_transport_tests --gtest_filter='JsonBody*'
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace flux2::server::http {

// Payload type URL under which a json_body error carries its param (the top-level member the error
// is in, or "body"): the one server/openai_images.cc's openai_error_body reads for `param`.
inline constexpr char kParamPayloadUrl[] = "flux2/openai-param";

// The parsed body. Errors are InvalidArgument whose message starts with the param and a colon,
// and whose kParamPayloadUrl payload is the param alone:
//   "body: nesting deeper than 32"            (param "body")
//   "size: duplicate key 'size'"              (a top-level key twice; param "size")
//   "user: duplicate key 'user.a'"            (inside member "user"; param "user")
//   "n: 1e400 is out of range"                (a number overflowing a double; param "n")
//   "prompt: is not valid UTF-8"              (raw bytes or a lone surrogate escape)
//   "body: invalid JSON at byte 17: ..."      (any other syntax error)
// The param is the top-level member whose value holds the fault (at any depth), "body" when the
// fault is not inside one (the top level itself, a key, a top-level array).
absl::StatusOr<nlohmann::json> parse_json_body(std::string_view body, int max_depth = 32);

// The param a parse_json_body error names ("" for other statuses).
std::string json_error_param(const absl::Status& status);

}  // namespace flux2::server::http
