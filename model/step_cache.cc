// DBCache F1B0 step caching: the option's checks, cache-dit's decision and the device state of
// one block list; see step_cache.h. Tested by tests/host/step_cache_test.cc and
// `flux2 check-golden --golden tests/data/cache`.
#include "model/step_cache.h"

#include <cmath>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kernels/base/decimal.h"
#include "kernels/base/status.h"

namespace flux2 {
namespace {

constexpr const char* kListNames[2] = {"double", "single"};
constexpr const char* kBranchNames[2] = {"cond", "uncond"};

// A schedule's violations: one flag per step, step 0 computing.
void check_schedule(const std::vector<bool>& schedule, int64_t steps, const std::string& field,
                    std::vector<FieldViolation>* violations) {
  if (static_cast<int64_t>(schedule.size()) != steps) {
    violations->push_back({field, absl::StrCat(schedule.size(), " flags for a run of ", steps,
                                               " steps (one per step)")});
  } else if (!schedule[0]) {
    violations->push_back(
        {absl::StrCat(field, "[0]"), "step 0 must compute (nothing is cached before it)"});
  }
}

}  // namespace

void check_step_cache(const StepCacheOptions& options, int64_t steps,
                      std::vector<FieldViolation>* violations) {
  if (!options.enabled()) return;
  if (steps < kStepCacheMinSteps) {
    violations->push_back(
        {"cache", absl::StrCat("step caching needs more than ", kStepCacheMinSteps - 1,
                               " steps; this run has ", steps,
                               " (distilled few-step runs have nothing to gain)")});
    return;
  }
  if (options.mode == StepCacheOptions::Mode::kSchedule) {
    check_schedule(options.schedule, steps, "cache.schedule", violations);
    for (size_t i = 0; i < options.forced.size(); ++i) {
      if (!options.forced[i].empty()) {
        check_schedule(options.forced[i], steps, absl::StrCat("cache.forced[", i, "]"), violations);
      }
    }
    return;
  }
  if (options.warmup_steps < 0 || options.warmup_steps > steps) {
    violations->push_back(
        {"cache.warmup_steps", absl::StrCat(options.warmup_steps, " is outside 0..", steps)});
  }
  if (options.max_consecutive_cached < -1 || options.max_consecutive_cached > steps) {
    violations->push_back(
        {"cache.max_consecutive_cached",
         absl::StrCat(options.max_consecutive_cached, " is outside -1..", steps, " (-1: no cap)")});
  }
  if (!std::isfinite(options.threshold) || options.threshold < 0.0 || options.threshold > 1.0) {
    violations->push_back({"cache.threshold", absl::StrCat(exact_decimal(options.threshold),
                                                           " is not a finite value in 0..1")});
  }
}

StepCacheOptions step_cache_replaying(int64_t steps,
                                      const std::map<std::string, std::vector<int>>& traces) {
  StepCacheOptions options;
  options.mode = StepCacheOptions::Mode::kSchedule;
  options.schedule = std::vector<bool>(static_cast<size_t>(steps), true);
  const char* names[4] = {"double.cond", "single.cond", "double.uncond", "single.uncond"};
  for (int i = 0; i < 4; ++i) {
    auto trace = traces.find(names[i]);
    if (trace == traces.end()) continue;
    for (int code : trace->second) {
      options.forced[i].push_back(code != static_cast<int>(StepCacheDecision::kCached));
    }
  }
  return options;
}

std::vector<bool> step_cache_default_schedule(int64_t steps) {
  std::vector<bool> schedule(static_cast<size_t>(std::max<int64_t>(steps, 0)));
  for (int64_t i = 0; i < steps; ++i) schedule[i] = i < 5 || i % 4 == 0;
  return schedule;
}

absl::StatusOr<std::vector<bool>> parse_step_cache_schedule(const std::string& text,
                                                            int64_t steps) {
  if (text == "dbcache-default") return step_cache_default_schedule(steps);
  std::vector<bool> schedule;
  for (absl::string_view flag : absl::StrSplit(text, ',')) {
    flag = absl::StripAsciiWhitespace(flag);
    if (flag != "0" && flag != "1") {
      return absl::InvalidArgumentError(absl::StrCat(
          "cache.schedule: \"", flag, "\" is not 1 (compute) or 0 (cache), nor dbcache-default"));
    }
    schedule.push_back(flag == "1");
  }
  return schedule;
}

bool StepCacheDecider::may_cache_later() const {
  if (options_.mode == StepCacheOptions::Mode::kDbCache) return options_.threshold > 0.0;
  for (size_t i = static_cast<size_t>(step_ + 1); i < schedule_.size(); ++i) {
    if (!schedule_[i]) return true;
  }
  return false;
}

bool StepCacheDecider::needs_diff() const {
  return options_.mode == StepCacheOptions::Mode::kDbCache && options_.threshold > 0.0 &&
         options_.threshold < 1.0;
}

void StepCacheDecider::count_cached() {
  // cache-dit's add_cached_step, copied: a cached step right after a cached one adds 2 when the
  // counter was 0 (reset by MC), else 1; the first cached step ever adds 1; a cached step after a
  // computed one adds nothing.
  if (any_cached_ && step_ - last_cached_ == 1) {
    consecutive_ += consecutive_ == 0 ? 2 : 1;
  } else if (!any_cached_) {
    consecutive_ += 1;
  }
  any_cached_ = true;
  last_cached_ = step_;
}

absl::StatusOr<StepCacheDecision> StepCacheDecider::next(
    bool have_previous, const std::function<absl::StatusOr<float>()>& diff, float* recorded_diff) {
  ++step_;
  *recorded_diff = -1.0f;
  if (options_.mode == StepCacheOptions::Mode::kSchedule) {
    const bool compute = step_ >= static_cast<int64_t>(schedule_.size()) || schedule_[step_];
    return compute || !have_previous ? StepCacheDecision::kScheduled : StepCacheDecision::kCached;
  }
  if (step_ < options_.warmup_steps) return StepCacheDecision::kWarmup;
  if (options_.max_consecutive_cached >= 0 && consecutive_ >= options_.max_consecutive_cached) {
    consecutive_ = 0;
    return StepCacheDecision::kMaxConsecutive;
  }
  if (options_.threshold <= 0.0) return StepCacheDecision::kThresholdOff;
  if (!have_previous) return StepCacheDecision::kNoPrevious;
  if (options_.threshold < 1.0) {
    FLUX_ASSIGN_OR_RETURN(*recorded_diff, diff());
    if (!(*recorded_diff < options_.threshold)) return StepCacheDecision::kAboveThreshold;
  }
  count_cached();
  return StepCacheDecision::kCached;
}

absl::Status StepCacheListState::ensure(Backend& be, Tensor& t, const Tensor& like) {
  if (t.defined() && t.rows() == like.rows() && t.cols() == like.cols()) return absl::OkStatus();
  FLUX_ASSIGN_OR_RETURN(t, be.empty(be.activation_dtype(), {like.rows(), like.cols()}));
  return absl::OkStatus();
}

absl::Status StepCacheListState::before_first(Backend& be, const Tensor& compared) {
  if (!decider_.needs_diff()) return absl::OkStatus();
  FLUX_RETURN_IF_ERROR(ensure(be, f_cur_, compared));
  return be.copy(compared, f_cur_);  // x0
}

absl::StatusOr<bool> StepCacheListState::decide(Backend& be, const Tensor& stream,
                                                const Tensor& compared) {
  const bool keep_f = decider_.needs_diff();
  if (keep_f) FLUX_RETURN_IF_ERROR(be.sub(compared, f_cur_, f_cur_));  // F = x1 - x0
  // Another row count (cache-dit: a shape mismatch) has nothing to compare with or reuse.
  if (have_f_prev_ && keep_f && f_prev_.rows() != compared.rows()) have_f_prev_ = false;
  if (have_residual_ && residual_.rows() != stream.rows()) have_residual_ = false;
  // R >= 1 and schedules compare nothing: M is what they need.
  const bool have_previous = have_residual_ && (have_f_prev_ || !keep_f);
  StepCacheRecord record;
  FLUX_ASSIGN_OR_RETURN(record.decision, decider_.next(
                                             have_previous,
                                             [&]() -> absl::StatusOr<float> {
                                               return be.mean_abs_diff_ratio(f_prev_, f_cur_);
                                             },
                                             &record.diff));
  records_.push_back(record);
  if (record.decision == StepCacheDecision::kCached) return false;
  if (keep_f) std::swap(f_prev_, f_cur_);  // F_prev = F
  have_f_prev_ = true;
  have_residual_ = false;
  keep_residual_ = decider_.may_cache_later();
  if (keep_residual_) {
    FLUX_RETURN_IF_ERROR(ensure(be, residual_, stream));
    FLUX_RETURN_IF_ERROR(be.copy(stream, residual_));  // x1, until after_rest
  }
  return true;
}

absl::Status StepCacheListState::after_rest(Backend& be, const Tensor& stream) {
  if (!keep_residual_) return absl::OkStatus();
  FLUX_RETURN_IF_ERROR(be.sub(stream, residual_, residual_));  // M = out - x1
  have_residual_ = true;
  return absl::OkStatus();
}

absl::Status StepCacheListState::apply(Backend& be, const Tensor& stream) {
  return be.add(stream, residual_, stream);  // x1 + M
}

absl::Status run_block_list(Backend& be, StepCacheListState* cache, size_t count,
                            const Tensor& stream, const Tensor& compared,
                            const std::function<absl::Status(size_t)>& block) {
  if (cache == nullptr || count == 0) {
    for (size_t i = 0; i < count; ++i) FLUX_RETURN_IF_ERROR(block(i));
    return absl::OkStatus();
  }
  FLUX_RETURN_IF_ERROR(cache->before_first(be, compared));  // x0
  FLUX_RETURN_IF_ERROR(block(0));                           // x1
  FLUX_ASSIGN_OR_RETURN(const bool run_rest, cache->decide(be, stream, compared));
  if (!run_rest) return cache->apply(be, stream);  // x1 + M
  for (size_t i = 1; i < count; ++i) FLUX_RETURN_IF_ERROR(block(i));
  return cache->after_rest(be, stream);  // M = out - x1
}

Flux2StepCache::Flux2StepCache(const StepCacheOptions& options, int branch) {
  for (int list = 0; list < 2; ++list) {
    const std::vector<bool>& forced = options.forced[2 * branch + list];
    lists.emplace_back(options, forced.empty() ? options.schedule : forced);
  }
}

void StepCacheCounts::add(const StepCacheReport& report) {
  if (!report.enabled) return;
  enabled = true;
  for (int list = 0; list < 2; ++list) {
    computed[list] += report.computed[list];
    cached[list] += report.cached[list];
  }
}

void add_step_cache_records(const Flux2StepCache& state, int branch, StepCacheReport* report) {
  report->enabled = true;
  for (int list = 0; list < 2; ++list) {
    report->traces.push_back(absl::StrCat(kListNames[list], ".", kBranchNames[branch]));
    std::vector<int>& codes = report->decisions.emplace_back();
    std::vector<float>& diffs = report->trace_diffs.emplace_back();
    for (const StepCacheRecord& record : state.lists[list].records()) {
      codes.push_back(static_cast<int>(record.decision));
      diffs.push_back(record.diff);
      if (record.decision == StepCacheDecision::kCached) {
        ++report->cached[list];
      } else {
        ++report->computed[list];
      }
      if (record.diff >= 0.0f) report->diffs.push_back(record.diff);
    }
  }
}

}  // namespace flux2
