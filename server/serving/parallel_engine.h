// The engine over P ranks of one host (`flux2_server --gpus N`): each rank a backend plus a
// model::Pipeline on its own persistent thread, joined with Pipeline::join_parallel over the
// backend's communicators (sequence x CFG parallelism, model/README.md "Several GPUs"); a request
// runs on every rank at once and rank 0's image is returned. Tested by
// tests/server/parallel_engine_test.cc (CPU ranks, the in-process communicator).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "kernels/backend_options.h"
#include "kernels/base/communicator.h"
#include "model/pipeline.h"
#include "server/serving/engine.h"

namespace flux2::server {

// What one rank's thread builds: its backend and the pipeline loaded on it.
struct RankParts {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Pipeline> pipeline;
};

struct ParallelEngineOptions {
  // Rank r's device ordinal (distinct; the gpu label of its metrics: Engine::device_ordinals);
  // one rank per entry, 2 or more.
  std::vector<int> devices = {0, 1};
  // The flag errors name (the layout that does not fit the heads, ...), with its value.
  std::string flag = "--gpus";
  // Runs on rank r's own thread, on every rank at once: creates its backend (on device
  // devices[r]) and loads its pipeline. Every rank must load the same model.
  std::function<absl::StatusOr<RankParts>(int rank)> load_rank;
  // The communicators of one group of ranks: `ranks` their numbers, `backends` theirs, in group
  // order (create_communicator_group with the ranks' devices, in production).
  std::function<absl::StatusOr<std::vector<std::unique_ptr<Communicator>>>(
      const std::vector<int>& ranks, const std::vector<Backend*>& backends)>
      make_group;
};

// Loads every rank (options.load_rank), lays the ranks out for the model (plan_parallel_layout:
// CFG groups for klein base models when P is even, sequence parallelism over the rest;
// InvalidArgument naming the flag and the heads when they do not divide), makes the
// communicators and joins every pipeline. How the engine runs a request:
// - generate() validates on the calling thread, then runs the request on every rank's thread and
//   returns rank 0's image once every rank returned it (the ranks' images are compared: they are
//   the same bytes, model/README.md).
// - Stopping: rank 0 alone asks hooks.check_continue at each stage boundary and its answer reaches
//   every other rank before that rank passes the boundary (StageDecisions), so a cancelled or
//   late request stops every rank at the same boundary, with no collective pending, and the next
//   request runs on the same communicators. hooks.check_between_blocks is not used: a stop inside
//   a step would leave the other ranks in a collective (cancellation waits for the step's end).
// - Progress: every other hook (on_step, on_latents, ...) is rank 0's only, but
//   hooks.on_step_collectives, which every rank calls with its rank number from its own thread
//   (device_ordinals()[rank] is its GPU).
// - device_ordinals() is options.devices; device_pci_bus_ids() and memory_stats() follow it.
// - Failures: a rank whose generation fails otherwise (an error, not the common stop) ends the
//   communicators; the engine is then broken for good: generate() returns Internal naming the
//   rank, and device_status() returns it too, so the server exits (as on a sticky CUDA error).
//   Peers blocked in a collective on a device (NCCL does not wake them) are given kPeerGraceSeconds
//   and then left behind.
// - memory_stats() has one entry per rank; inject_fault goes to the last rank (a failure away
//   from rank 0), provoked there at its next stage boundary; where its backend cannot inject
//   (the CPU), the rank fails there with that error instead: a rank failure all the same.
absl::StatusOr<std::unique_ptr<Engine>> create_parallel_engine(ParallelEngineOptions options);

// How long the other ranks get to return after one rank failed: the in-process communicator
// wakes them at once, NCCL peers blocked on the device never return.
inline constexpr double kPeerGraceSeconds = 10.0;

// The production engine of `--gpus` with 2 or more GPUs (server/common/gpus_flag.h): one rank per
// entry of `gpus`, the backends named `backend` ("cpu": ranks as threads over the in-process
// communicator, for CI, the ordinals only naming them; "cuda": rank r on CUDA device gpus[r], NCCL
// between them; "auto" as create_server_backend picks), each loading `model_dir` with `options`
// (load progress is rank 0's). FailedPrecondition naming --gpus when a listed device does not
// exist here (fewer devices than the count, or an ordinal past the last).
absl::StatusOr<std::unique_ptr<Engine>> load_parallel_engine(
    const std::vector<int>& gpus, absl::string_view backend, const BackendOptions& backend_options,
    bool model_dir_given, const std::string& model_dir, const PipelineOptions& options);

// The same engine over pipelines with random weights at `spec`'s shapes, every rank the same
// weights (`flux2 bench --concurrency --gpus`): `backend` "cpu" or "cuda" ("auto": cuda when a
// CUDA device exists); errors as load_parallel_engine's.
absl::StatusOr<std::unique_ptr<Engine>> random_parallel_engine(
    const std::vector<int>& gpus, absl::string_view backend, const BackendOptions& backend_options,
    const RandomPipelineSpec& spec);

}  // namespace flux2::server
