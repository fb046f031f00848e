// The engine worker thread; see engine_worker.h. Tested by tests/server/engine_worker_test.cc.
#include "server/serving/engine_worker.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/elapsed.h"
#include "kernels/base/fast_path_registry.h"
#include "server/common/log.h"

namespace flux2::server {
namespace {

// Fast-path activity between two registry snapshots, active paths only.
std::vector<FastPathCounters> fast_path_delta(const std::vector<FastPathCounters>& before,
                                              const std::vector<FastPathCounters>& after) {
  std::map<std::string, const FastPathCounters*> earlier;
  for (const FastPathCounters& path : before) earlier[path.path] = &path;
  std::vector<FastPathCounters> delta;
  for (const FastPathCounters& path : after) {
    FastPathCounters d;
    d.path = path.path;
    d.disabled = path.disabled;
    d.invocations = path.invocations;
    d.fallbacks = path.fallbacks;
    if (auto it = earlier.find(path.path); it != earlier.end()) {
      d.invocations -= it->second->invocations;
      for (const auto& [reason, count] : it->second->fallbacks) d.fallbacks[reason] -= count;
    }
    bool active = d.invocations != 0;
    for (auto it = d.fallbacks.begin(); it != d.fallbacks.end();) {
      if (it->second == 0) {
        it = d.fallbacks.erase(it);
      } else {
        active = true;
        ++it;
      }
    }
    if (active) delta.push_back(std::move(d));
  }
  return delta;
}

}  // namespace

EngineWorker::EngineWorker(EngineFactory factory, JobQueue& queue, EncodeStage& encoder,
                           Metrics& metrics, WorkerOptions options,
                           std::function<void(WorkerPhase, const absl::Status&)> on_phase,
                           StallWatchdog* watchdog)
    : factory_(std::move(factory)),
      queue_(queue),
      encoder_(encoder),
      metrics_(metrics),
      options_(options),
      on_phase_(std::move(on_phase)),
      watchdog_(watchdog) {}

EngineWorker::~EngineWorker() {
  if (thread_.joinable()) thread_.join();
}

void EngineWorker::start() {
  thread_ = std::thread([this] { run(); });
}

bool EngineWorker::join_until(Clock::time_point deadline) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!ended_cv_.wait_until(lock, deadline, [this] { return ended_; })) return false;
  }
  if (thread_.joinable()) thread_.join();
  return true;
}

void EngineWorker::cancel_running(const absl::Status& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_) running_->cancel(reason);
}

void EngineWorker::set_phase(WorkerPhase phase, const absl::Status& status) {
  phase_.store(phase);
  if (on_phase_) on_phase_(phase, status);
}

void EngineWorker::run() {
  const absl::Status loaded = load_and_warm_up();
  if (loaded.ok()) {
    set_phase(WorkerPhase::kServing);
    absl::Status broken;
    while (std::shared_ptr<Job> job = queue_.pop()) {
      if (broken.ok()) {
        broken = run_job(job);
        if (!broken.ok()) set_phase(WorkerPhase::kBroken, broken);
      } else {
        // Every job still queued, at once (the pop does not wait while the queue holds any).
        job->finish(absl::UnavailableError(
            absl::StrCat("the GPU failed and this server is restarting; retry on another replica (",
                         broken.message(), ")")));
      }
    }
  } else {
    log_line(LogLevel::kError, absl::StrCat("model load failed: ", loaded.ToString()));
    set_phase(WorkerPhase::kFailed, loaded);
    // Nothing is admitted before the model serves, but answer anything that raced in.
    while (std::shared_ptr<Job> job = queue_.pop()) {
      job->finish(
          absl::UnavailableError(absl::StrCat("the model failed to load: ", loaded.message())));
    }
  }
  set_phase(WorkerPhase::kStopped);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
  }
  ended_cv_.notify_all();
}

absl::Status EngineWorker::load_and_warm_up() {
  const Clock::time_point start = Clock::now();
  absl::StatusOr<std::unique_ptr<Engine>> engine = factory_();
  if (!engine.ok()) return engine.status();
  engine_ = std::move(*engine);
  const PipelineInfo& info = engine_->info();
  log_line(LogLevel::kInfo, info.load_summary());
  if (options_.max_sequence_length > info.max_sequence_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-sequence-length: ", options_.max_sequence_length,
                     " exceeds the model's limit of ", info.max_sequence_length));
  }
  if (options_.warmup_steps > 0) {
    // A generation touches every stage once (allocations, GEMM / attention / convolution plans,
    // kernel loading) so the first request does not pay for it. On the GPU plans are per shape,
    // so it runs at the API's default 1024 x 1024 (and at quality=high too when served); on the
    // CPU 16 x 16 latent tokens keep it cheap.
    GenerateParams params;
    params.prompt = "warm-up";
    params.width = params.height = info.backend == "cuda" ? 1024 : 16 * info.pixel_multiple;
    params.num_inference_steps = options_.warmup_steps;
    params.seed = 0;
    params.fast_paths = options_.fast_paths;
    params.max_sequence_length = options_.max_sequence_length;
    std::vector<Quality> qualities = {Quality::kLossless};
    if (info.quality_high && info.backend == "cuda")
      qualities.push_back(Quality::kHigh);  // FP8 plans
    // With editing on, each quality also runs with one mid-gray reference of the output size
    // (already prepared: sides multiples of 16, at most kReferenceMaxArea pixels).
    std::vector<std::vector<RgbImage>> reference_sets = {{}};
    if (options_.warmup_reference) {
      RgbImage gray{params.width, params.height,
                    std::vector<uint8_t>(static_cast<size_t>(params.width * params.height * 3),
                                         uint8_t{128})};
      reference_sets.push_back({std::move(gray)});
    }
    for (Quality quality : qualities) {
      for (const std::vector<RgbImage>& references : reference_sets) {
        params.quality = quality;
        params.references = references;
        // Its steps are the watchdog's first expected step time (first calls build plans, so
        // the estimate errs long).
        GenerateHooks hooks;
        hooks.on_step = [&](int64_t, int64_t, double seconds) {
          last_step_seconds_ = seconds;
          last_step_pixels_ = static_cast<double>(params.width) * params.height;
        };
        absl::StatusOr<GeneratedImage> image = engine_->generate(params, hooks);
        if (!image.ok()) {
          return absl::Status(image.status().code(), absl::StrCat("warm-up generation failed: ",
                                                                  image.status().message()));
        }
      }
    }
    log_line(
        LogLevel::kInfo,
        absl::StrCat("warm-up (", options_.warmup_steps, " steps at ", params.width, "x",
                     params.height, ", ", qualities.size(), " qualities",
                     options_.warmup_reference ? ", with and without a reference" : "", ") done"));
  }
  metrics_.set_model_load_seconds(seconds_since(start));
  metrics_.set_prompt_cache_capacity(info.prompt_cache_bytes);
  if (info.backend == "cuda") {
    metrics_.set_gpu_memory(engine_->device_ordinals(), engine_->memory_stats());
  }
  engine_ready_.store(true);
  return absl::OkStatus();
}

void EngineWorker::stage_started(const Job& job, double pixels, double longest_step_seconds) {
  if (watchdog_ == nullptr) return;
  double expected = longest_step_seconds;
  if (expected == 0.0 && last_step_pixels_ > 0.0) {
    const double ratio = std::max(1.0, pixels / last_step_pixels_);
    expected = last_step_seconds_ * ratio * ratio;
  }
  watchdog_->stage_started(job.spec().request_id, expected);
}

void EngineWorker::maybe_inject_fault(const Job& job, int64_t steps_done) {
  if (!options_.test_fault || fault_injected_ || steps_done != options_.test_fault->step) return;
  fault_injected_ = true;
  const absl::Status status =
      engine_->inject_fault(options_.test_fault->fault, options_.test_fault->hang_seconds);
  log_line(status.ok() ? LogLevel::kWarning : LogLevel::kError,
           absl::StrCat("request_id=", job.spec().request_id,
                        ": --test-inject-fault: ", status.ok() ? "injected" : status.ToString()));
}

absl::Status EngineWorker::device_failed(const Job& job, absl::Status& status) {
  if (status.ok() || absl::IsCancelled(status) || absl::IsDeadlineExceeded(status)) {
    return absl::OkStatus();
  }
  const std::string& id = job.spec().request_id;
  // The engine's only RESOURCE_EXHAUSTED is an allocation the device could not serve; the
  // request's tensors are freed as it unwinds, so the next request starts from the same memory.
  if (absl::IsResourceExhausted(status)) {
    metrics_.count_resource_exhausted(kDeviceMemory);
    metrics_.count_engine_fault(kFaultDeviceMemory);
    log_line(LogLevel::kError, absl::StrCat("request_id=", id, ": ", status.message(),
                                            "; the request failed, serving goes on"));
    return absl::OkStatus();
  }
  absl::Status device = engine_->device_status();
  if (device.ok()) return device;  // the request's own failure; the device still works
  metrics_.count_engine_fault(kFaultDeviceError);
  log_line(LogLevel::kError, absl::StrCat("request_id=", id, ": the GPU failed: ", status.message(),
                                          "; ", device.message(), "; exiting to be restarted"));
  status = absl::InternalError(
      absl::StrCat(status.message(), " (the GPU is unusable: this server exits to be restarted)"));
  return device;
}

std::function<void(int, int64_t, const CollectiveSeconds&)> EngineWorker::step_collectives_hook()
    const {
  // Called from the ranks' threads, possibly at once: Metrics is thread-safe, the ordinals a copy.
  return [this, gpus = engine_->device_ordinals()](int rank, int64_t,
                                                   const CollectiveSeconds& seconds) {
    if (rank >= 0 && rank < static_cast<int>(gpus.size())) {
      metrics_.observe_step_collectives(gpus[static_cast<size_t>(rank)], seconds);
    }
  };
}

absl::Status EngineWorker::run_job(const std::shared_ptr<Job>& job) {
  if (!job->start_running()) return absl::OkStatus();  // finished while queued (cancelled, drained)
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = job;
  }
  metrics_.add_in_flight(1);
  const JobSpec& spec = job->spec();
  WorkerReport report;
  report.queue_seconds = seconds_since(job->arrival());
  metrics_.observe_queue(report.queue_seconds);

  const std::vector<FastPathCounters> before = fast_path_snapshot();
  const double pixels = static_cast<double>(spec.params.width) * spec.params.height;
  double longest_step = 0.0;                    // of this request
  absl::Status status = job->check_continue();  // the deadline may have passed while queued
  for (int i = 0; status.ok() && i < spec.num_images; ++i) {
    GenerateParams params = spec.params;
    params.seed = spec.params.seed + static_cast<uint64_t>(i);  // documented: seed + i, mod 2^64
    int64_t steps_done = 0;                                     // of this image
    GenerateHooks hooks;
    hooks.check_continue = [&] {
      maybe_inject_fault(*job, steps_done);
      stage_started(*job, pixels, longest_step);
      return job->check_continue();
    };
    // Inside a step too, where the backend allows it (the CPU: a step at 2048 x 2048 takes
    // minutes), so a client that left or a passed deadline frees the worker within a block.
    hooks.check_between_blocks = [&] { return job->check_continue(); };
    StepCacheCounts image_cache;  // this image's step caching so far
    hooks.on_step_cache = [&](const StepCacheReport& so_far) {
      image_cache = StepCacheCounts{};
      image_cache.add(so_far);
    };
    hooks.on_step_collectives = step_collectives_hook();
    hooks.on_step = [&](int64_t step, int64_t steps, double seconds) {
      steps_done = step + 1;
      longest_step = std::max(longest_step, seconds);
      last_step_seconds_ = seconds;
      last_step_pixels_ = pixels;
      metrics_.observe_step(params.quality, seconds);
      ProgressEvent event;
      event.step_index = static_cast<int>(step);
      event.step_count = static_cast<int>(steps);
      event.step_seconds = seconds;
      event.elapsed_seconds = seconds_since(job->arrival());
      event.image_index = i;
      event.num_images = spec.num_images;
      event.cache = image_cache;
      if (i == 0 && step == 0) metrics_.observe_first_step(event.elapsed_seconds);
      job->report_progress(event);
      if (options_.test_step_delay_s > 0.0) {
        std::this_thread::sleep_for(std::chrono::duration<double>(options_.test_step_delay_s));
      }
    };
    absl::StatusOr<GeneratedImage> image = engine_->generate(params, hooks);
    if (!image.ok()) {
      status = image.status();
      break;
    }
    const StageTimings& t = image->timings;
    report.tokenize_seconds += t.tokenize;
    report.text_encode_seconds += t.text_encode;
    report.reference_encode_seconds += t.reference_encode;
    report.denoise_seconds += t.denoise;
    report.decode_seconds += t.decode;
    report.step_seconds.insert(report.step_seconds.end(), t.steps.begin(), t.steps.end());
    if (i == 0) report.prompt_cache_hit = image->prompt_cache_hit;
    report.cache.add(image->cache);
    report.cache_diffs.insert(report.cache_diffs.end(), image->cache.diffs.begin(),
                              image->cache.diffs.end());
    image->seed = params.seed;
    encoder_.encode(job, std::move(*image));
  }
  if (watchdog_ != nullptr) watchdog_->idle();
  const absl::Status device = device_failed(*job, status);
  report.fast_paths = fast_path_delta(before, fast_path_snapshot());
  if (status.ok()) {
    metrics_.observe_stage(Stage::kTokenize, report.tokenize_seconds);
    metrics_.observe_stage(Stage::kTextEncode, report.text_encode_seconds);
    if (!spec.params.references.empty()) {
      metrics_.observe_stage(Stage::kReferenceEncode, report.reference_encode_seconds);
    }
    metrics_.observe_stage(Stage::kDenoise, report.denoise_seconds);
    metrics_.observe_stage(Stage::kDecode, report.decode_seconds);
    metrics_.count_prompt_cache(report.prompt_cache_hit);
    if (report.cache.enabled) metrics_.observe_step_cache(report.cache, report.cache_diffs);
  }
  if (engine_->info().backend == "cuda" && device.ok()) {
    metrics_.set_gpu_memory(engine_->device_ordinals(), engine_->memory_stats());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = nullptr;
  }
  metrics_.add_in_flight(-1);
  encoder_.finish(job, std::move(status), std::move(report));
  return device;
}

}  // namespace flux2::server
