// Creates a backend by name ("cpu", "cuda") with its process-wide options; "cuda" exists only in
// builds with the CUDA toolkit and on machines with a GPU. Tested by
// tests/host/small_units_test.cc.
#pragma once

#include <memory>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/backend_options.h"

namespace flux2 {

// NotFound exactly when the backend cannot exist here (no CUDA device, or a build without CUDA):
// the one case GPU tests skip and `auto` picks the CPU. Any other error (a library that does not
// load, a device that fails) is a failure.
absl::StatusOr<std::unique_ptr<Backend>> create_backend(absl::string_view name,
                                                        const BackendOptions& options = {});

// True when this binary was built with the CUDA backend.
bool cuda_backend_compiled();

}  // namespace flux2
