// The engine over P ranks of one host; see parallel_engine.h.
// Tested by tests/server/parallel_engine_test.cc.
#include "server/serving/parallel_engine.h"

#include <chrono>
#include <condition_variable>
#include <latch>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/backend_factory.h"
#include "kernels/base/status.h"
#include "model/cfg_parallel.h"
#include "server/common/gpus_flag.h"
#include "server/serving/pipeline_engine.h"
#include "server/serving/rank_threads.h"
#include "server/serving/stage_decisions.h"

namespace flux2::server {
namespace {

using SteadyClock = std::chrono::steady_clock;

// One request on every rank: what each rank runs with, and what each returned.
struct RankRequest {
  RankRequest(const GenerateParams& p, const GenerateHooks& h, int ranks)
      : params(p), hooks(h), decisions(ranks), results(static_cast<size_t>(ranks)) {}

  const GenerateParams params;
  const GenerateHooks hooks;
  StageDecisions decisions;

  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::optional<absl::StatusOr<GeneratedImage>>> results;  // by rank, once returned
  int returned = 0;
  std::optional<SteadyClock::time_point> failed_at;  // the first failure other than the stop

  // Whether `status` is the stop every rank makes at rank 0's non-OK answer.
  bool common_stop(const absl::Status& status) const {
    const std::optional<absl::Status> stop = decisions.stop();
    return stop.has_value() && *stop == status;
  }
  void finish(int rank, absl::StatusOr<GeneratedImage> image) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!image.ok() && !common_stop(image.status()) && !failed_at) failed_at = SteadyClock::now();
      results[static_cast<size_t>(rank)] = std::move(image);
      ++returned;
    }
    cv.notify_all();
  }
  // Until every rank returned, or kPeerGraceSeconds after a rank failed.
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    const int ranks = static_cast<int>(results.size());
    cv.wait(lock, [&] { return returned == ranks || failed_at.has_value(); });
    const auto grace = std::chrono::duration_cast<SteadyClock::duration>(
        std::chrono::duration<double>(kPeerGraceSeconds));
    if (returned < ranks)
      cv.wait_until(lock, *failed_at + grace, [&] { return returned == ranks; });
  }
};

// The fault inject_fault asked for, provoked by `rank` at its next stage boundary.
struct PendingFault {
  int rank = 0;
  InjectedFault fault = InjectedFault::kHang;
  double hang_seconds = 0.0;
};

class ParallelEngine final : public Engine {
 public:
  explicit ParallelEngine(std::vector<int> devices)
      : devices_(std::move(devices)),
        threads_(static_cast<int>(devices_.size())),
        parts_(devices_.size()),
        comms_(devices_.size()),
        last_memory_(devices_.size()) {}
  ~ParallelEngine() override;

  absl::Status load(const ParallelEngineOptions& options);

  const PipelineInfo& info() const override { return lead().info(); }
  std::vector<FieldViolation> check(const GenerateParams& params) const override {
    return lead().check(params);
  }
  absl::StatusOr<GeneratedImage> generate(const GenerateParams& params,
                                          const GenerateHooks& hooks) override;
  std::vector<BackendMemoryStats> memory_stats() const override;
  absl::Status device_status() override;
  absl::Status inject_fault(InjectedFault fault, double hang_seconds) override;
  std::vector<std::string> device_pci_bus_ids() const override {
    std::vector<std::string> ids;
    for (const RankParts& parts : parts_) ids.push_back(parts.pipeline->info().device_pci_bus_id);
    return ids;
  }
  std::vector<int> device_ordinals() const override { return devices_; }
  const Flux2Config* transformer_config() const override { return &lead().transformer_config(); }
  const Flux2Config* lora_config() const override { return &lead().transformer_config(); }
  // Rank 0's backend makes the images: page-locked host memory every rank's device copies from.
  LoraHostImageMaker lora_host_image_maker() const override {
    return flux2::lora_host_image_maker(*parts_.front().backend, lead().transformer_config());
  }
  absl::Status pin_lora(const LoraRequest& lora) const override;
  std::optional<LoraCacheStats> lora_cache_stats() const override {
    return lead().lora_cache().stats();
  }
  bool lora_resident(const std::string& key) const override {
    return lead().lora_cache().resident(key);
  }

 private:
  int size() const { return threads_.size(); }
  const Pipeline& lead() const { return *parts_[0].pipeline; }
  absl::Status broken() const {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }
  // Rank `rank`'s part of `request`, on its thread.
  void run_rank(RankRequest& request, int rank);
  // The hooks rank `rank` generates with (parallel_engine.h says which).
  GenerateHooks rank_hooks(RankRequest& request, int rank);
  // Rank `rank` at a stage boundary rank 0 let it pass: the pending fault, if it is its.
  absl::Status provoke_pending_fault(int rank);
  // generate()'s answer once the ranks returned (or the grace after a failure ran out).
  absl::StatusOr<GeneratedImage> conclude(RankRequest& request);
  // Marks the engine broken by `why` (the first reason sticks) and returns the reason.
  absl::Status break_engine(const absl::Status& why);

  const std::vector<int> devices_;        // by rank: its device ordinal
  mutable RankThreads threads_;           // run_all from const methods: the ranks' own work
  std::vector<RankParts> parts_;          // by rank, each used on its rank's thread only
  std::vector<RankCommunicators> comms_;  // by rank
  ParallelLayout layout_;
  mutable std::mutex mu_;
  absl::Status broken_;  // non-OK for good once a rank failed
  // The last memory_stats(), served once broken (zeros before any): a rank may be blocked.
  mutable std::vector<BackendMemoryStats> last_memory_;
  std::optional<PendingFault> pending_fault_;
};

ParallelEngine::~ParallelEngine() {
  // Each rank's pipeline, communicators and backend end on its own thread, in that order (the
  // pipeline holds the communicators, both hold the backend's memory), every rank at once (NCCL
  // may finalize a communicator collectively). A rank not idle within kPeerGraceSeconds is blocked
  // for good (a peer failed): its parts are left as they are, for the process to end.
  std::vector<int> idle;
  for (int r = 0; r < size(); ++r) {
    RankParts& parts = parts_[static_cast<size_t>(r)];
    RankCommunicators& comms = comms_[static_cast<size_t>(r)];
    if (threads_.wait_idle(r, kPeerGraceSeconds)) {
      idle.push_back(r);
      continue;
    }
    (void)parts.pipeline.release();
    (void)parts.backend.release();
    (void)comms.sequence.release();
    (void)comms.cfg.release();
  }
  std::latch ended(static_cast<std::ptrdiff_t>(idle.size()));
  for (int r : idle) {
    threads_.post(r, [this, r, &ended] {
      RankParts& parts = parts_[static_cast<size_t>(r)];
      parts.pipeline.reset();
      comms_[static_cast<size_t>(r)] = RankCommunicators{};
      parts.backend.reset();
      ended.count_down();
    });
  }
  ended.wait();
}

absl::Status ParallelEngine::load(const ParallelEngineOptions& options) {
  std::vector<absl::Status> loaded(static_cast<size_t>(size()));
  threads_.run_all([&](int r) {
    absl::StatusOr<RankParts> parts = options.load_rank(r);
    if (parts.ok()) {
      parts_[static_cast<size_t>(r)] = std::move(*parts);
    } else {
      loaded[static_cast<size_t>(r)] = parts.status();
    }
  });
  const std::string flag = absl::StrCat(options.flag, " ", gpus_flag_text(devices_));
  for (int r = 0; r < size(); ++r) {
    const absl::Status& status = loaded[static_cast<size_t>(r)];
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat(flag, ": rank ", r, " (device ", devices_[r],
                                                      "): ", status.message()));
    }
  }
  // Its errors read "--gpus 2 (...)", or "--gpus 2,3: rank count 2 (...)" for listed devices.
  const bool listed = gpus_flag_text(devices_) != absl::StrCat(size());
  const std::string what = listed ? absl::StrCat(flag, ": rank count") : options.flag;
  FLUX_ASSIGN_OR_RETURN(layout_, plan_parallel_layout(lead().transformer_config(), size(),
                                                      lead().info().uses_cfg, what.c_str()));
  auto make_group = [&](const std::vector<int>& ranks) {
    std::vector<Backend*> backends;
    for (int r : ranks) backends.push_back(parts_[static_cast<size_t>(r)].backend.get());
    return options.make_group(ranks, backends);
  };
  FLUX_ASSIGN_OR_RETURN(comms_, make_rank_communicators(layout_, make_group));
  for (int r = 0; r < size(); ++r) {
    RankCommunicators& comms = comms_[static_cast<size_t>(r)];
    const absl::Status joined = parts_[static_cast<size_t>(r)].pipeline->join_parallel(
        ParallelRank{layout_, r, comms.sequence.get(), comms.cfg.get()});
    if (!joined.ok()) {  // klein-KV over sequence ranks, ...
      return absl::Status(joined.code(), absl::StrCat(flag, ": ", joined.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<GeneratedImage> ParallelEngine::generate(const GenerateParams& params,
                                                        const GenerateHooks& hooks) {
  FLUX_RETURN_IF_ERROR(broken());
  // Refused here, once, before any rank starts (every rank would refuse it alike).
  FLUX_RETURN_IF_ERROR(lead().validate(params));
  // Shared with the rank threads: a rank left behind after a failure may still hold it.
  auto request = std::make_shared<RankRequest>(params, hooks, size());
  for (int r = 0; r < size(); ++r) {
    threads_.post(r, [this, request, r] { run_rank(*request, r); });
  }
  request->wait();
  return conclude(*request);
}

GenerateHooks ParallelEngine::rank_hooks(RankRequest& request, int rank) {
  GenerateHooks hooks;
  if (rank == 0) {
    hooks = request.hooks;
    hooks.check_between_blocks = nullptr;  // a stop inside a step would strand the peers
    hooks.check_continue = [&request] {
      return request.decisions.decide(request.hooks.check_continue);
    };
  } else {
    hooks.check_continue = [this, &request, rank] {
      FLUX_RETURN_IF_ERROR(request.decisions.await(rank));
      return provoke_pending_fault(rank);
    };
    hooks.on_step_collectives = request.hooks.on_step_collectives;  // every rank's own
  }
  return hooks;
}

void ParallelEngine::run_rank(RankRequest& request, int rank) {
  RankParts& parts = parts_[static_cast<size_t>(rank)];
  absl::StatusOr<GeneratedImage> image =
      parts.pipeline->generate(request.params, rank_hooks(request, rank));
  if (rank == 0) request.decisions.end(image.status());
  if (!image.ok() && !request.common_stop(image.status())) {
    // The pipeline ends its group after its own failures; a failure at a boundary (a provoked
    // fault) it takes for the common stop, so end the group here too, and the peers stop.
    RankCommunicators& comms = comms_[static_cast<size_t>(rank)];
    comms.sequence->abort(image.status());
    comms.cfg->abort(image.status());
  }
  request.finish(rank, std::move(image));
}

absl::Status ParallelEngine::provoke_pending_fault(int rank) {
  std::optional<PendingFault> fault;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pending_fault_ || pending_fault_->rank != rank) return absl::OkStatus();
    fault = pending_fault_;
    pending_fault_.reset();
  }
  const absl::Status status =
      parts_[static_cast<size_t>(rank)].backend->inject_fault(fault->fault, fault->hang_seconds);
  if (status.ok()) return status;
  return absl::InternalError(
      absl::StrCat("the injected fault failed this rank (", status.message(), ")"));
}

// The failed rank to name (the first whose error is not a peer's abort), or -1 when every rank
// that returned succeeded or made the common stop. Under request.mu.
int failed_rank(const RankRequest& request) {
  int cause = -1;
  for (size_t r = 0; r < request.results.size(); ++r) {
    const auto& result = request.results[r];
    if (!result.has_value() || result->ok() || request.common_stop(result->status())) continue;
    const bool peer_abort = absl::IsAborted(result->status());
    if (cause < 0 ||
        (!peer_abort && absl::IsAborted(request.results[static_cast<size_t>(cause)]->status()))) {
      cause = static_cast<int>(r);
    }
  }
  return cause;
}

absl::StatusOr<GeneratedImage> ParallelEngine::conclude(RankRequest& request) {
  std::lock_guard<std::mutex> lock(request.mu);
  const int ranks = size();
  const int cause = failed_rank(request);
  if (cause >= 0 || request.returned < ranks) {
    std::string left_behind;
    for (int r = 0; r < ranks; ++r) {
      if (!request.results[static_cast<size_t>(r)].has_value()) {
        absl::StrAppend(&left_behind, " ", r);
      }
    }
    const std::string why =
        cause >= 0 ? absl::StrCat("rank ", cause, " of ", ranks, " failed: ",
                                  request.results[static_cast<size_t>(cause)]->status().message())
                   : absl::StrCat("ranks of ", ranks, " did not return");
    return break_engine(absl::InternalError(absl::StrCat(
        why, left_behind.empty() ? "" : absl::StrCat("; ranks", left_behind, " never returned"),
        "; the ranks' communicators are ended, so this engine cannot serve again")));
  }
  // Every rank returned: all the common stop, or all the same image.
  absl::StatusOr<GeneratedImage>& image = *request.results[0];
  for (int r = 1; r < ranks; ++r) {
    const absl::StatusOr<GeneratedImage>& other = *request.results[static_cast<size_t>(r)];
    if (image.ok() != other.ok()) {
      return absl::InternalError(absl::StrCat("rank ", r, " and rank 0 ended differently (",
                                              other.status().ToString(), "; ",
                                              image.status().ToString(), ")"));
    }
    if (image.ok() && other->rgb != image->rgb) {
      return absl::InternalError(absl::StrCat("rank ", r, "'s image differs from rank 0's: the ",
                                              ranks, " ranks did not compute the same request"));
    }
  }
  return std::move(image);
}

absl::Status ParallelEngine::break_engine(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_.ok()) broken_ = why;
  return broken_;
}

std::vector<BackendMemoryStats> ParallelEngine::memory_stats() const {
  if (!broken().ok()) return last_memory_;  // a rank may be blocked for good
  std::vector<BackendMemoryStats> stats(static_cast<size_t>(size()));
  threads_.run_all(
      [&](int r) { stats[static_cast<size_t>(r)] = parts_[r].backend->memory_stats(); });
  last_memory_ = stats;
  return stats;
}

absl::Status ParallelEngine::device_status() {
  FLUX_RETURN_IF_ERROR(broken());
  std::vector<absl::Status> statuses(static_cast<size_t>(size()));
  threads_.run_all(
      [&](int r) { statuses[static_cast<size_t>(r)] = parts_[r].backend->device_status(); });
  for (int r = 0; r < size(); ++r) {
    const absl::Status& status = statuses[static_cast<size_t>(r)];
    if (!status.ok()) {
      return break_engine(absl::Status(
          status.code(), absl::StrCat("rank ", r, " of ", size(), ": ", status.message())));
    }
  }
  return absl::OkStatus();
}

absl::Status ParallelEngine::inject_fault(InjectedFault fault, double hang_seconds) {
  // Called from rank 0's thread inside check_continue (the worker's hook) while the last rank
  // waits for rank 0's answer: it cannot run there now, so that rank provokes it itself next.
  std::lock_guard<std::mutex> lock(mu_);
  pending_fault_ = PendingFault{size() - 1, fault, hang_seconds};
  return absl::OkStatus();
}

absl::Status ParallelEngine::pin_lora(const LoraRequest& lora) const {
  std::vector<absl::Status> statuses(static_cast<size_t>(size()));
  threads_.run_all([&](int r) {
    const RankParts& parts = parts_[static_cast<size_t>(r)];
    statuses[static_cast<size_t>(r)] = parts.pipeline->lora_cache().pin(
        *parts.backend, parts.pipeline->transformer_config(), lora);
  });
  for (const absl::Status& status : statuses) FLUX_RETURN_IF_ERROR(status);
  return absl::OkStatus();
}

// `requested` (--backend) for N ranks: auto takes CUDA when the model dir was given and a CUDA
// device exists, as create_server_backend does.
absl::StatusOr<std::string> parallel_backend_name(absl::string_view requested,
                                                  bool model_dir_given) {
  if (requested == "auto") {
    return std::string(model_dir_given && backend_device_count("cuda") > 0 ? "cuda" : "cpu");
  }
  if (requested != "cpu" && requested != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend: \"", requested, "\" is not auto, cpu or cuda"));
  }
  if (requested == "cuda" && !cuda_backend_compiled()) {
    return absl::NotFoundError(
        "--backend cuda: this build has no CUDA backend (configured without a CUDA toolkit)");
  }
  return std::string(requested);
}

// FailedPrecondition naming --gpus when a device of `gpus` is not among the `devices` ordinals
// this process sees of backend `name` (-1: any number, the CPU's threads).
absl::Status check_devices_exist(const std::vector<int>& gpus, int devices,
                                 const std::string& name) {
  if (devices < 0) return absl::OkStatus();
  const std::string flag = gpus_flag_text(gpus);
  const std::string sees = absl::StrCat(": this process sees ", devices, " ", name,
                                        " device(s) (CUDA_VISIBLE_DEVICES may hide some)");
  if (flag == absl::StrCat(gpus.size())) {  // a count
    if (devices >= static_cast<int>(gpus.size())) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("--gpus ", flag, sees, "; run with --gpus ", devices, " or fewer"));
  }
  if (devices == 0) return absl::FailedPreconditionError(absl::StrCat("--gpus ", flag, sees));
  for (int gpu : gpus) {
    if (gpu >= devices) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--gpus ", flag, sees, ": device ", gpu, " is not one of ordinals 0..", devices - 1));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> create_parallel_engine(ParallelEngineOptions options) {
  if (options.devices.size() < 2 || !options.load_rank || !options.make_group) {
    return absl::InvalidArgumentError(absl::StrCat(options.flag, " ",
                                                   gpus_flag_text(options.devices),
                                                   ": a multi-rank engine needs 2 ranks or more"));
  }
  FLUX_RETURN_IF_ERROR(check_gpus(options.devices));
  auto engine = std::make_unique<ParallelEngine>(options.devices);
  FLUX_RETURN_IF_ERROR(engine->load(options));
  return std::unique_ptr<Engine>(std::move(engine));
}

namespace {

// The engine over `gpus` (checked, and present here as check_devices_exist says) on backends
// named `name`: rank r creates its backend on device gpus[r] and load(backend, rank) its pipeline.
absl::StatusOr<std::unique_ptr<Engine>> parallel_engine_over(
    const std::vector<int>& gpus, const std::string& name, const BackendOptions& backend_options,
    std::function<absl::StatusOr<std::unique_ptr<Pipeline>>(Backend&, int rank)> load) {
  FLUX_RETURN_IF_ERROR(check_gpus(gpus));
  FLUX_RETURN_IF_ERROR(check_devices_exist(gpus, backend_device_count(name), name));
  ParallelEngineOptions parallel;
  parallel.devices = gpus;
  parallel.load_rank = [=](int rank) -> absl::StatusOr<RankParts> {
    RankParts parts;
    FLUX_ASSIGN_OR_RETURN(parts.backend,
                          create_backend_on_device(name, backend_options, gpus[rank]));
    FLUX_ASSIGN_OR_RETURN(parts.pipeline, load(*parts.backend, rank));
    return parts;
  };
  parallel.make_group = [gpus](const std::vector<int>& ranks,
                               const std::vector<Backend*>& backends) {
    std::vector<int> devices;
    for (int rank : ranks) devices.push_back(gpus[static_cast<size_t>(rank)]);
    return create_communicator_group(backends, devices);
  };
  return create_parallel_engine(std::move(parallel));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> load_parallel_engine(
    const std::vector<int>& gpus, absl::string_view backend, const BackendOptions& backend_options,
    bool model_dir_given, const std::string& model_dir, const PipelineOptions& options) {
  FLUX_RETURN_IF_ERROR(check_gpus(gpus));
  FLUX_ASSIGN_OR_RETURN(const std::string name, parallel_backend_name(backend, model_dir_given));
  return parallel_engine_over(gpus, name, backend_options, [=](Backend& be, int rank) {
    PipelineOptions rank_options = options;
    // One rank's progress says it all.
    if (rank != 0) rank_options.on_progress = nullptr;
    return load_server_pipeline(be, model_dir, rank_options);
  });
}

absl::StatusOr<std::unique_ptr<Engine>> random_parallel_engine(
    const std::vector<int>& gpus, absl::string_view backend, const BackendOptions& backend_options,
    const RandomPipelineSpec& spec) {
  FLUX_RETURN_IF_ERROR(check_gpus(gpus));
  FLUX_ASSIGN_OR_RETURN(const std::string name, parallel_backend_name(backend, true));
  return parallel_engine_over(gpus, name, backend_options, [spec](Backend& be, int rank) {
    RandomPipelineSpec rank_spec = spec;  // the same seed: the same weights on every rank
    if (rank != 0) rank_spec.on_progress = nullptr;
    return Pipeline::create_random(be, rank_spec);
  });
}

}  // namespace flux2::server
