// check-golden part "scheduler": mu, sigmas and timesteps of every case in scheduler_cases.json
// against make_schedule (tests/data/README.md: tables equal, sigmas within 1e-6). See
// golden_check.h.
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/json_util.h"
#include "model/scheduler.h"
#include "server/cli/golden/golden_check.h"

namespace flux2 {
namespace {

constexpr char kFile[] = "scheduler_cases.json";
constexpr double kSigmaTolerance = 1e-6;  // tests/data/README.md
// Timesteps are sigma x 1000 in float32, so the same bound scaled by 1000.
constexpr double kTimestepTolerance = 1e-3;
constexpr double kMuTolerance = 1e-12;  // both sides compute mu in float64

double max_abs_diff(const std::vector<float>& ours, const nlohmann::json& reference) {
  if (!reference.is_array() || reference.size() != ours.size()) return INFINITY;
  double worst = 0.0;
  for (size_t i = 0; i < ours.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(ours[i]) - reference[i].get<double>()));
  }
  return worst;
}

}  // namespace

void check_golden_scheduler(const GoldenContext& context, GoldenReport& report) {
  auto cases = read_json_file(context.dir + "/" + kFile);
  if (!cases.ok()) return report.fail(kFile, "-", cases.status().message());
  SchedulerConfig config;
  const std::string config_path = context.checkpoint_dir() + "/scheduler/scheduler_config.json";
  if (std::filesystem::exists(config_path)) {
    auto json = read_json_file(config_path);
    if (!json.ok()) return report.fail(kFile, "-", json.status().message());
    auto parsed = SchedulerConfig::from_json(*json, config_path);
    if (!parsed.ok()) return report.fail(kFile, "-", parsed.status().message());
    config = *parsed;
  }
  if (!cases->is_array() || cases->empty()) return report.fail(kFile, "-", "no cases");
  for (size_t k = 0; k < cases->size(); ++k) {
    const nlohmann::json& item = (*cases)[k];
    const std::string name = absl::StrCat("case", k);
    if (!item.contains("steps") || !item.contains("image_seq_len")) {
      report.fail(kFile, name, "missing steps or image_seq_len");
      continue;
    }
    const int64_t steps = item["steps"].get<int64_t>();
    const int64_t seq = item["image_seq_len"].get<int64_t>();
    const Schedule schedule = make_schedule(config, steps, seq);
    const std::string label = absl::StrCat(name, "(steps=", steps, ",seq=", seq, ")");
    const double mu_error = std::fabs(schedule.mu - item["mu"].get<double>());
    report.record(mu_error <= kMuTolerance, kFile, label, "mu",
                  absl::StrFormat("abs_err=%.3e tol=%.1e", mu_error, kMuTolerance));
    const double sigma_error = max_abs_diff(schedule.sigmas, item["sigmas"]);
    report.record(sigma_error <= kSigmaTolerance, kFile, label, "sigmas",
                  absl::StrFormat("max_abs_err=%.3e tol=%.1e", sigma_error, kSigmaTolerance));
    const double timestep_error = max_abs_diff(schedule.timesteps, item["timesteps"]);
    report.record(timestep_error <= kTimestepTolerance, kFile, label, "timesteps",
                  absl::StrFormat("max_abs_err=%.3e tol=%.1e", timestep_error, kTimestepTolerance));
  }
}

}  // namespace flux2
