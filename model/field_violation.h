// FieldViolation: one refusal of a request field, as the pipeline reports them (Pipeline::check)
// and the server returns them (google.rpc.BadRequest). Tested by tests/host/pipeline_test.cc.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace flux2 {

struct FieldViolation {
  std::string field;        // request field path, e.g. "num_inference_steps", "reference_images[1]"
  std::string description;  // why it is invalid
};

// "field: description; field2: description2" (a single violation: "field: description").
inline std::string describe_violations(const std::vector<FieldViolation>& violations) {
  std::string message;
  for (const FieldViolation& violation : violations) {
    absl::StrAppend(&message, message.empty() ? "" : "; ", violation.field, ": ",
                    violation.description);
  }
  return message;
}

}  // namespace flux2
