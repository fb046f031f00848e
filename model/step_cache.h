// Step caching, cache-dit's DBCache "F1B0" (model/README.md, "Step caching"): per request, per CFG
// branch and per block list (double, single), block 0 always runs; its residual F = x1 - x0
// decides whether blocks 1..N-1 run (their residual M stored) or the list's output is x1 + M.
// Also a fixed schedule of compute/cache flags per step. Tested by tests/host/step_cache_test.cc
// (the decisions, R = 0 bytes) and `flux2 check-golden --golden tests/data/cache` (cache-dit's).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/field_violation.h"

namespace flux2 {

// A request's step-caching option (GenerateParams::cache). Off by default.
struct StepCacheOptions {
  enum class Mode : uint8_t {
    kOff,       // every block of every step runs
    kDbCache,   // DBCache F1B0: each list decides from its first block's residual
    kSchedule,  // a fixed schedule: compute where `schedule` says so, reuse M elsewhere
  };
  Mode mode = Mode::kOff;
  int64_t warmup_steps = 4;            // W: steps [0, W) always compute (sglang's default 4)
  int64_t max_consecutive_cached = 3;  // MC, cache-dit's counter; -1: no cap (sglang's 3)
  double threshold = 0.24;             // R: cache while diff < R (sglang's 0.24)
  // kSchedule: one flag per step, true = compute; step 0 computes.
  std::vector<bool> schedule;
  // TEST ONLY (kSchedule): a schedule per (branch, list), index 2 * branch + list (branch 0 cond,
  // 1 uncond; list 0 double, 1 single), replacing `schedule` where not empty: the GPU checks force
  // the decisions a golden recorded.
  std::array<std::vector<bool>, 4> forced;

  bool enabled() const { return mode != Mode::kOff; }
};

// A fixed schedule that replays recorded decision codes per "<list>.<branch>" trace
// ("double.cond", "single.uncond", ...; cached where the code is kCached, as the goldens record
// them) through StepCacheOptions::forced, for `steps` steps (tests and golden checks).
StepCacheOptions step_cache_replaying(int64_t steps,
                                      const std::map<std::string, std::vector<int>>& traces);

// The fewest steps a cached request may run: distilled runs of 8 steps or fewer have nothing to
// gain (with W = 4 they barely leave warm-up).
constexpr int64_t kStepCacheMinSteps = 9;

// The violations of `options` for a run of `steps` steps, named "cache.<field>" ("cache" for the
// option as a whole), appended to `violations`.
void check_step_cache(const StepCacheOptions& options, int64_t steps,
                      std::vector<FieldViolation>* violations);

// "compute steps 0-4 and every 4th after" (the schedule sglang's defaults produce on FLUX.2-dev,
// docs: step-caching): compute where step < 5 or step % 4 == 0.
std::vector<bool> step_cache_default_schedule(int64_t steps);
// A schedule from text: "1,1,1,0,0,1" (one flag per step) or the preset "dbcache-default"
// (step_cache_default_schedule of `steps`). InvalidArgument naming "cache.schedule" otherwise.
absl::StatusOr<std::vector<bool>> parse_step_cache_schedule(const std::string& text, int64_t steps);

// One list's decision at one step, with the codes the goldens record (tests/data/cache).
enum class StepCacheDecision : int8_t {
  kWarmup = 0,          // compute: step < W
  kNoPrevious = 1,      // compute: no F_prev yet
  kMaxConsecutive = 2,  // compute: MC reached (the counter reset)
  kAboveThreshold = 3,  // compute: diff >= R
  kCached = 4,          // cached: the list's output is x1 + M
  kThresholdOff = 5,    // compute: R <= 0
  kScheduled = 6,       // compute: the fixed schedule says so
};

// The block lists, each with its own state.
enum class StepCacheList : uint8_t {
  kDouble = 0,  // the double-stream blocks; F on the image stream, M on both streams
  kSingle = 1,  // the single-stream blocks; F and M on all tokens
};

// cache-dit's decision for one list of one branch, host only: the warm-up, the MC counter (its
// quirk copied: +2 after a cached step when it was 0, +1 after a cached step or for the first
// cached step ever, else unchanged), R's special cases and the threshold.
class StepCacheDecider {
 public:
  StepCacheDecider(const StepCacheOptions& options, const std::vector<bool>& schedule)
      : options_(options), schedule_(schedule) {}

  // The decision for the next forward (its step is step() after the call). `diff` is this step's
  // mean|F_prev - F| / mean|F_prev|, asked for only when the threshold decides; -1 is recorded
  // where none was computed.
  absl::StatusOr<StepCacheDecision> next(bool have_previous,
                                         const std::function<absl::StatusOr<float>()>& diff,
                                         float* recorded_diff);
  int64_t step() const { return step_; }
  // Whether a later step of the schedule reuses M (kSchedule), or any may (kDbCache, R > 0).
  bool may_cache_later() const;
  // Whether the threshold may decide some step (kDbCache, 0 < R < 1): F is kept.
  bool needs_diff() const;

 private:
  StepCacheDecision scheduled() const;
  void count_cached();

  StepCacheOptions options_;
  std::vector<bool> schedule_;
  int64_t step_ = -1;
  int64_t consecutive_ = 0;  // k
  int64_t last_cached_ = -1;
  bool any_cached_ = false;
};

// What one list did at one step.
struct StepCacheRecord {
  StepCacheDecision decision = StepCacheDecision::kWarmup;
  float diff = -1.0f;  // -1: not computed
};

// The device state of one list in one CFG branch: F_prev, this step's x0 then F, and M.
class StepCacheListState {
 public:
  StepCacheListState(const StepCacheOptions& options, const std::vector<bool>& schedule)
      : decider_(options, schedule) {}

  // Before block 0: keeps `compared`'s rows (x0) when a diff may be needed.
  absl::Status before_first(Backend& be, const Tensor& compared);
  // After block 0 (`stream`: the list's rows, x1; `compared`: its F rows): decides; on a
  // computed step stores F as F_prev and keeps x1. Returns whether blocks 1..N-1 run.
  absl::StatusOr<bool> decide(Backend& be, const Tensor& stream, const Tensor& compared);
  // After blocks 1..N-1 of a computed step: M = out - x1.
  absl::Status after_rest(Backend& be, const Tensor& stream);
  // On a cached step: stream = x1 + M (in place).
  absl::Status apply(Backend& be, const Tensor& stream);

  const std::vector<StepCacheRecord>& records() const { return records_; }

 private:
  // Tensors of `shape`, reallocated when the shape changed.
  static absl::Status ensure(Backend& be, Tensor& t, const Tensor& like);

  StepCacheDecider decider_;
  Tensor f_prev_, f_cur_, residual_;
  bool have_f_prev_ = false, have_residual_ = false, keep_residual_ = false;
  std::vector<StepCacheRecord> records_;
};

// Runs the `count` blocks of one list through block(i): all of them without `cache`; with it,
// block 0, then blocks 1..count-1 or the cached residual, as the list's state decides. `stream`:
// the list's rows (x0, then its output, in place); `compared`: the rows F is taken on.
absl::Status run_block_list(Backend& be, StepCacheListState* cache, size_t count,
                            const Tensor& stream, const Tensor& compared,
                            const std::function<absl::Status(size_t)>& block);

// The step-cache state of one CFG branch's forwards (Flux2Conditioning::step_cache).
struct Flux2StepCache {
  Flux2StepCache(const StepCacheOptions& options, int branch);
  StepCacheListState& list(StepCacheList which) { return lists[static_cast<int>(which)]; }
  std::vector<StepCacheListState> lists;  // double, single
};

// A request's step caching as reported (GeneratedImage::cache): counts per list over its
// forwards (with CFG a step has two, cond and uncond), the diffs computed, and per
// "<list>.<branch>" ("double.cond") the decision codes and diffs of every step (-1: none).
struct StepCacheReport {
  bool enabled = false;
  int64_t computed[2] = {0, 0};  // by StepCacheList
  int64_t cached[2] = {0, 0};
  std::vector<float> diffs;
  std::vector<std::string> traces;              // "double.cond", ...
  std::vector<std::vector<int>> decisions;      // per trace
  std::vector<std::vector<float>> trace_diffs;  // per trace
};
// A report's counts alone (the server's timings, progress events and metrics), summable over the
// images of a request.
struct StepCacheCounts {
  bool enabled = false;
  int64_t computed[2] = {0, 0};  // by StepCacheList
  int64_t cached[2] = {0, 0};
  void add(const StepCacheReport& report);  // adds its counts (nothing when it is not enabled)
};

// Adds `state`'s records (branch 0 cond, 1 uncond) to `report`.
void add_step_cache_records(const Flux2StepCache& state, int branch, StepCacheReport* report);

}  // namespace flux2
