// check-golden part "cache": cache-dit's DBCache F1B0 generations (cache_cases.json +
// cache.safetensors, run by golden_pipeline.cc like every generation) and, here, their
// step-cache decisions: each "<list>.<branch>" trace's codes equal, its diffs within the float32
// bar (tests/data/README.md, "Step caching"). Run by `flux2 check-golden --golden
// tests/data/cache`.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/cli/golden/golden_check.h"

namespace flux2 {
namespace {

constexpr double kDiffBar = 1e-4;  // the float32 bar, relative (tests/data/README.md)

// Where the produced trace `name` is in `produced`, or -1.
int find_trace(const StepCacheReport& produced, const std::string& name) {
  for (size_t i = 0; i < produced.traces.size(); ++i) {
    if (produced.traces[i] == name) return static_cast<int>(i);
  }
  return -1;
}

// The diffs of one trace: -1 exactly where the golden has -1, else within kDiffBar relative.
void compare_diffs(absl::string_view file, absl::string_view case_name, const std::string& trace,
                   const std::vector<float>& golden, const std::vector<float>& ours,
                   GoldenReport& report) {
  double worst = 0.0;
  bool same_places = golden.size() == ours.size();
  for (size_t s = 0; same_places && s < golden.size(); ++s) {
    if ((golden[s] < 0.0f) != (ours[s] < 0.0f)) {
      same_places = false;
    } else if (golden[s] >= 0.0f) {
      worst = std::max(worst, std::fabs(static_cast<double>(ours[s]) - golden[s]) /
                                  std::max(1e-30, static_cast<double>(golden[s])));
    }
  }
  report.record(same_places && worst <= kDiffBar, file, case_name, absl::StrCat("diffs.", trace),
                same_places
                    ? absl::StrFormat("max_rel_err=%.3e tol=%.2e", worst, kDiffBar)
                    : absl::StrCat("computed at other steps: [", absl::StrJoin(ours, ", "), "]"));
}

}  // namespace

StepCacheOptions golden_step_cache_options(const nlohmann::json& item) {
  StepCacheOptions options;
  options.mode = StepCacheOptions::Mode::kDbCache;
  options.warmup_steps = item.at("W").get<int64_t>();
  options.max_consecutive_cached = item.at("MC").get<int64_t>();
  options.threshold = item.at("R").get<double>();
  return options;
}

StepCacheOptions golden_forced_step_cache_options(const nlohmann::json& item) {
  return step_cache_replaying(item.at("steps").get<int64_t>(),
                              item.at("decisions").get<std::map<std::string, std::vector<int>>>());
}

void check_golden_step_cache(absl::string_view file, absl::string_view case_name,
                             const nlohmann::json& item, const StepCacheReport& produced,
                             GoldenReport& report) {
  const nlohmann::json& decisions = item.at("decisions");
  if (static_cast<size_t>(decisions.size()) != produced.traces.size()) {
    report.record(false, file, case_name, "decisions",
                  absl::StrCat(produced.traces.size(), " traces, expected ", decisions.size()));
  }
  for (auto it = decisions.begin(); it != decisions.end(); ++it) {
    const int index = find_trace(produced, it.key());
    if (index < 0) {
      report.record(false, file, case_name, absl::StrCat("decisions.", it.key()), "not produced");
      continue;
    }
    const std::vector<int> golden = it.value().get<std::vector<int>>();
    const std::vector<int>& ours = produced.decisions[index];
    report.record(golden == ours, file, case_name, absl::StrCat("decisions.", it.key()),
                  golden == ours ? absl::StrCat("equal (", absl::StrJoin(ours, ""), ")")
                                 : absl::StrCat("[", absl::StrJoin(ours, ","), "], expected [",
                                                absl::StrJoin(golden, ","), "]"));
    compare_diffs(file, case_name, it.key(),
                  item.at("diffs").at(it.key()).get<std::vector<float>>(),
                  produced.trace_diffs[index], report);
  }
}

}  // namespace flux2
