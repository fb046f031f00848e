// The production engine: a backend (cpu or cuda) plus a model::Pipeline loaded from a checkpoint
// directory. Tested by the end-to-end tests in tests/server/ (real flux2_server binary).
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "kernels/backend_options.h"
#include "server/serving/engine.h"

namespace flux2::server {

// Creates the backend for `--backend` (cpu, cuda, or auto: cuda when the model dir was given
// explicitly and a CUDA device exists, else cpu) with the backend flags; errors name the flag. A
// CUDA device whose backend fails to start is an error, never a silent move to the CPU.
absl::StatusOr<std::unique_ptr<Backend>> create_server_backend(absl::string_view requested,
                                                               const BackendOptions& options,
                                                               bool model_dir_given);

// Loads `model_dir` onto `backend` with `options` (Pipeline::load), its errors naming the flag
// behind them as load_pipeline_engine says.
absl::StatusOr<std::unique_ptr<Pipeline>> load_server_pipeline(Backend& backend,
                                                               const std::string& model_dir,
                                                               const PipelineOptions& options);

// Creates the backend (as create_server_backend) and loads `model_dir` onto it with `options`
// (quality=high's FP8 copies, the text encoder's residency, the prompt cache, a single-file
// transformer). Errors name the flag behind them where one is (--enable-quality-high,
// --transformer-file); a memory plan that does not fit the device is ResourceExhausted with the
// plan (model/memory_plan.h).
absl::StatusOr<std::unique_ptr<Engine>> load_pipeline_engine(absl::string_view backend,
                                                             const BackendOptions& backend_options,
                                                             bool model_dir_given,
                                                             const std::string& model_dir,
                                                             const PipelineOptions& options);

// A pipeline with random weights at `spec`'s shapes on `backend` (`flux2 bench --concurrency`).
absl::StatusOr<std::unique_ptr<Engine>> random_pipeline_engine(std::unique_ptr<Backend> backend,
                                                               const RandomPipelineSpec& spec);

}  // namespace flux2::server
