// Creates a backend by name ("cpu", "cuda"); "cuda" exists only in builds with the CUDA toolkit
// and on machines with a GPU. Tested by tests/host/small_units_test.cc.
#pragma once

#include <memory>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace flux2 {

absl::StatusOr<std::unique_ptr<Backend>> create_backend(absl::string_view name);

// True when this binary was built with the CUDA backend.
bool cuda_backend_compiled();

}  // namespace flux2
