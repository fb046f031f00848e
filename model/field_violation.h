// A refused request field: its path ("num_inference_steps", "reference_images[1]") and why. The
// pipeline reports its own refusals as these (Pipeline::check), and the server's validation adds
// its own; each front end renders them in its shape (gRPC BadRequest details, OpenAI `param`).
// Tested by tests/server/validate_test.cc.
#pragma once

#include <string>

namespace flux2 {

struct FieldViolation {
  std::string field;        // request field path, e.g. "num_inference_steps", "reference_images[1]"
  std::string description;  // why it is invalid
};

}  // namespace flux2
