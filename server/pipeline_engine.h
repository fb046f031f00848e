// The production engine: a backend (cpu or cuda) plus a model::Pipeline loaded from a checkpoint
// directory. Tested by the end-to-end tests in tests/server/ (real flux2_server binary).
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "kernels/backend_options.h"
#include "server/engine.h"

namespace flux2::server {

// Creates the backend for `--backend` (cpu, cuda, or auto: cuda when the model dir was given
// explicitly and a CUDA device exists, else cpu) with the backend flags; errors name the flag. A
// CUDA device whose backend fails to start is an error, never a silent move to the CPU.
absl::StatusOr<std::unique_ptr<Backend>> create_server_backend(absl::string_view requested,
                                                               const BackendOptions& options,
                                                               bool model_dir_given);

// Creates the backend (as create_server_backend) and loads `model_dir` onto it;
// `enable_quality_high` also prepares what QUALITY_HIGH requests need (FP8 weight copies).
absl::StatusOr<std::unique_ptr<Engine>> load_pipeline_engine(absl::string_view backend,
                                                             const BackendOptions& options,
                                                             bool model_dir_given,
                                                             const std::string& model_dir,
                                                             bool enable_quality_high);

}  // namespace flux2::server
