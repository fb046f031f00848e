// Field violations in an absl::Status; see field_violations.h. Tested by
// tests/server/validate_test.cc.
#include "server/serving/field_violations.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flux2::server {
namespace {

// The payload's key; the value lists field, description, field, ... each as "<bytes>:<text>", so
// any byte may appear in a description (it may quote what the client sent).
constexpr char kViolationsPayload[] = "flux2/field-violations";

void append_text(std::string& out, const std::string& text) {
  absl::StrAppend(&out, text.size(), ":", text);
}

// Reads one "<bytes>:<text>" from `in` at `pos`; false when malformed.
bool read_text(const std::string& in, size_t& pos, std::string& text) {
  const size_t colon = in.find(':', pos);
  size_t length = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(in).substr(pos, colon - pos), &length) ||
      length > in.size() - colon - 1) {
    return false;
  }
  text = in.substr(colon + 1, length);
  pos = colon + 1 + length;
  return true;
}

}  // namespace

absl::Status invalid_argument_status(const std::vector<FieldViolation>& violations) {
  std::vector<std::string> parts;
  std::string payload;
  for (const FieldViolation& violation : violations) {
    parts.push_back(absl::StrCat(violation.field, ": ", violation.description));
    append_text(payload, violation.field);
    append_text(payload, violation.description);
  }
  absl::Status status = absl::InvalidArgumentError(absl::StrJoin(parts, "; "));
  status.SetPayload(kViolationsPayload, absl::Cord(payload));
  return status;
}

std::vector<FieldViolation> field_violations_of(const absl::Status& status) {
  std::vector<FieldViolation> violations;
  const absl::optional<absl::Cord> payload = status.GetPayload(kViolationsPayload);
  if (!payload) return violations;
  const std::string bytes(*payload);
  size_t pos = 0;
  FieldViolation violation;
  while (pos < bytes.size() && read_text(bytes, pos, violation.field) &&
         read_text(bytes, pos, violation.description)) {
    violations.push_back(violation);
  }
  return violations;
}

}  // namespace flux2::server
