// JSON bodies with depth, duplicate-key, range and UTF-8 checks; see json_body.h.
// Tested by tests/server/json_body_test.cc; fuzzed by tests/fuzz/fuzz_json_body.cc.
#include "server/http/json_body.h"

#include <set>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"

namespace flux2::server::http {
namespace {

using nlohmann::json;

absl::Status body_error(const std::string& param, const std::string& detail) {
  absl::Status status = absl::InvalidArgumentError(param + ": " + detail);
  status.SetPayload(kParamPayloadUrl, absl::Cord(param));
  return status;
}

// nlohmann's SAX events, checked, then forwarded to its DOM builder. Returning false from an event
// stops the parse at once, so a body nested deeper than the limit is never built (nor its parser
// state grown past the limit).
class CheckingSax {
 public:
  CheckingSax(json* result, int max_depth)
      : dom_(*result, /*allow_exceptions=*/false), max_depth_(max_depth) {}

  bool null() { return value_done() && dom_.null(); }
  bool boolean(bool value) { return value_done() && dom_.boolean(value); }
  bool number_integer(json::number_integer_t value) {
    return value_done() && dom_.number_integer(value);
  }
  bool number_unsigned(json::number_unsigned_t value) {
    return value_done() && dom_.number_unsigned(value);
  }
  bool number_float(json::number_float_t value, const std::string& text) {
    return value_done() && dom_.number_float(value, text);
  }
  bool string(std::string& value) { return value_done() && dom_.string(value); }
  bool binary(json::binary_t& value) { return value_done() && dom_.binary(value); }
  bool start_object(std::size_t size) {
    keys_.emplace_back();
    return open() && dom_.start_object(size);
  }
  bool start_array(std::size_t size) { return open() && dom_.start_array(size); }
  bool end_object() {
    keys_.pop_back();
    return close() && dom_.end_object();
  }
  bool end_array() { return close() && dom_.end_array(); }
  bool key(std::string& key);
  bool parse_error(std::size_t position, const std::string& token,
                   const nlohmann::detail::exception& error);

  absl::Status error() const { return error_; }

 private:
  bool open();
  bool close();
  // A value ended: a top-level member's value, when at depth 1, ends the member.
  bool value_done() {
    if (depth_ == 1) member_.clear();
    return true;
  }
  std::string param() const { return member_.empty() ? "body" : member_; }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  const int max_depth_;
  int depth_ = 0;
  // The keys of each open object, innermost last.
  std::vector<std::set<std::string>> keys_;
  // (depth, key) of the members being parsed, outermost first.
  std::vector<std::pair<int, std::string>> path_;
  // The top-level member whose value is being parsed ("" between members).
  std::string member_;
  absl::Status error_;
};

bool CheckingSax::open() {
  if (++depth_ > max_depth_) {
    error_ = body_error("body", "nesting deeper than " + std::to_string(max_depth_));
    return false;
  }
  return true;
}

bool CheckingSax::close() {
  --depth_;
  return value_done();
}

bool CheckingSax::key(std::string& key) {
  while (!path_.empty() && path_.back().first >= depth_) path_.pop_back();
  path_.emplace_back(depth_, key);
  if (depth_ == 1) member_ = key;
  if (!keys_.back().insert(key).second) {
    std::string dotted;  // array indexes are left out: "user.a"
    for (const auto& [depth, part] : path_) dotted += (dotted.empty() ? "" : ".") + part;
    error_ = body_error(param(), "duplicate key '" + dotted + "'");
    return false;
  }
  return dom_.key(key);
}

bool CheckingSax::parse_error(std::size_t position, const std::string& token,
                              const nlohmann::detail::exception& error) {
  const std::string what = error.what();
  if (error.id == 406) {  // out_of_range.406: a number overflowing a double
    error_ = body_error(param(), token + " is out of range");
  } else if (what.find("ill-formed UTF-8") != std::string::npos ||
             what.find("surrogate") != std::string::npos) {
    error_ = body_error(
        param(), member_.empty() ? "a key or string is not valid UTF-8" : "is not valid UTF-8");
  } else {
    error_ = body_error("body", "invalid JSON at byte " + std::to_string(position) + ": " + what);
  }
  return false;
}

}  // namespace

absl::StatusOr<json> parse_json_body(std::string_view body, int max_depth) {
  if (body.substr(0, 3) == "\xEF\xBB\xBF") {
    return body_error("body", "starts with a UTF-8 byte order mark; send JSON without one");
  }
  json result;
  CheckingSax sax(&result, max_depth);
  bool parsed = false;
  try {
    parsed = json::sax_parse(body.begin(), body.end(), &sax);
  } catch (const json::exception& error) {  // not expected with a SAX that never throws
    return body_error("body", std::string("invalid JSON: ") + error.what());
  }
  if (!parsed) {
    if (!sax.error().ok()) return sax.error();
    return body_error("body", "invalid JSON");
  }
  return result;
}

std::string json_error_param(const absl::Status& status) {
  const absl::optional<absl::Cord> param = status.GetPayload(kParamPayloadUrl);
  return param ? std::string(*param) : std::string();
}

}  // namespace flux2::server::http
