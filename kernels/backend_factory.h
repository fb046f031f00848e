// Creates a backend by name ("cpu", "cuda") with its process-wide options; "cuda" exists only in
// builds with the CUDA toolkit and on machines with a GPU. Also the ranks of a multi-rank engine:
// a backend per device and the communicators between them. Tested by
// tests/host/small_units_test.cc and tests/server/parallel_engine_test.cc.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "kernels/backend_options.h"
#include "kernels/base/communicator.h"

namespace flux2 {

// NotFound exactly when the backend cannot exist here (no CUDA device, or a build without CUDA):
// the one case GPU tests skip and `auto` picks the CPU. Any other error (a library that does not
// load, a device that fails) is a failure.
absl::StatusOr<std::unique_ptr<Backend>> create_backend(absl::string_view name,
                                                        const BackendOptions& options = {});

// True when this binary was built with the CUDA backend.
bool cuda_backend_compiled();

// How many ranks of backend `name` one process can drive, one per device: the CUDA devices it
// sees (0 without any, or in a build without CUDA); -1 for the CPU (ranks are threads sharing the
// host: any number, none faster than one).
int backend_device_count(absl::string_view name);

// create_backend for the rank on device ordinal `device`, called on the thread that will drive it:
// CUDA makes `device` current on the calling thread first, so that thread (and only it) must make
// every later call of the backend; the CPU ignores `device`.
absl::StatusOr<std::unique_ptr<Backend>> create_backend_on_device(absl::string_view name,
                                                                  const BackendOptions& options,
                                                                  int device);

// The communicators of one group of ranks, communicator i for backends[i] (on device ordinal
// devices[i]; all backends of one name): the in-process group on the CPU, NCCL on CUDA (made
// from the calling thread at once; each is then used by its rank's thread only).
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> create_communicator_group(
    const std::vector<Backend*>& backends, const std::vector<int>& devices);

}  // namespace flux2
