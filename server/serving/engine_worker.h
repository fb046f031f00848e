// The one worker thread that owns the engine (and through it the backend and its stream): loads
// the model, runs the warm-up generation, then takes jobs from the admission queue one at a time,
// checking deadline and cancellation at every stage boundary, reporting the boundaries to the
// stall watchdog, and hands the images to the encoder thread; a device broken for good ends the
// serving. Tested by tests/server/engine_worker_test.cc and fault_test.cc (fake engine).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "server/ops/metrics.h"
#include "server/serving/encode_stage.h"
#include "server/serving/engine.h"
#include "server/serving/job_queue.h"
#include "server/serving/stall_watchdog.h"

namespace flux2::server {

struct WorkerOptions {
  int warmup_steps = 1;            // steps of the warm-up generation; 0 skips it
  double test_step_delay_s = 0.0;  // TEST ONLY: sleep after every denoising step
  bool fast_paths = true;          // --fast-paths: the warm-up runs as the requests will
  // --max-sequence-length: every request's, so the warm-up's too; loading fails when it exceeds
  // the model's limit. 0: the model default.
  int64_t max_sequence_length = 0;
  // Editing is on (--max-reference-images > 0): the warm-up also runs a generation with one
  // reference, so the VAE encoder's plans and the longer attention exist before readiness.
  bool warmup_reference = false;
  std::optional<TestFault> test_fault;  // TEST ONLY: --test-inject-fault
};

// Where the worker is in its life.
enum class WorkerPhase : uint8_t {
  kLoading,  // creating the engine and running the warm-up
  kServing,  // taking jobs from the queue
  kFailed,   // loading or warm-up failed; the process should exit
  kBroken,   // the device failed for good (a sticky error): jobs get UNAVAILABLE; exit non-zero
  kStopped,  // the queue closed and drained; the thread has ended
};

class EngineWorker {
 public:
  // `on_phase` is called on the worker thread at every phase change (health, metrics, exit).
  // `watchdog` (may be null) hears every stage boundary of every request.
  EngineWorker(EngineFactory factory, JobQueue& queue, EncodeStage& encoder, Metrics& metrics,
               WorkerOptions options,
               std::function<void(WorkerPhase, const absl::Status&)> on_phase,
               StallWatchdog* watchdog = nullptr);
  ~EngineWorker();  // joins; close the queue first

  void start();
  // Waits for the thread to end (after JobQueue::close and the queue drained) until `deadline`;
  // true when it ended.
  bool join_until(Clock::time_point deadline);
  // Asks the running job (if any) to stop with `reason` at its next step boundary.
  void cancel_running(const absl::Status& reason);

  WorkerPhase phase() const { return phase_.load(); }
  // The loaded engine; valid (and immutable) once phase() left kLoading successfully.
  const Engine* engine() const { return engine_ready_.load() ? engine_.get() : nullptr; }

 private:
  void run();
  absl::Status load_and_warm_up();
  // Runs one job; returns the device's status when the job failed because the device broke.
  absl::Status run_job(const std::shared_ptr<Job>& job);
  // A stage of `job` begins: tells the watchdog what it should take (a step: the longest of the
  // request's steps so far; before any, the last step measured, scaled up quadratically by the
  // pixel count as attention is).
  void stage_started(const Job& job, double pixels, double longest_step_seconds);
  // GenerateHooks::on_step_collectives of every request: each rank's collective time per step into
  // flux2_denoise_step_collective_seconds, labelled with the rank's device ordinal.
  std::function<void(int, int64_t, const CollectiveSeconds&)> step_collectives_hook() const;
  // Provokes options_.test_fault once, when `steps_done` steps of an image have run.
  void maybe_inject_fault(const Job& job, int64_t steps_done);
  // After a request: counts and logs a device fault (out of memory, a broken device) and returns
  // the device's status when it is broken for good (then `status` becomes INTERNAL, saying so).
  absl::Status device_failed(const Job& job, absl::Status& status);
  void set_phase(WorkerPhase phase, const absl::Status& status = absl::OkStatus());

  EngineFactory factory_;
  JobQueue& queue_;
  EncodeStage& encoder_;
  Metrics& metrics_;
  const WorkerOptions options_;
  std::function<void(WorkerPhase, const absl::Status&)> on_phase_;
  StallWatchdog* const watchdog_;
  // The last step measured (worker thread only) and its image's pixels: the expected step time
  // of a request's stages before its own first step.
  double last_step_seconds_ = 0.0;
  double last_step_pixels_ = 0.0;
  bool fault_injected_ = false;  // worker thread only

  std::unique_ptr<Engine> engine_;
  std::atomic<bool> engine_ready_{false};
  std::atomic<WorkerPhase> phase_{WorkerPhase::kLoading};

  std::mutex mu_;
  std::condition_variable ended_cv_;
  bool ended_ = false;            // guarded by mu_
  std::shared_ptr<Job> running_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace flux2::server
