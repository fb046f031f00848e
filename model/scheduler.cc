// Flow-matching schedule; see scheduler.h. Tested by tests/host/scheduler_test.cc.
#include "model/scheduler.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/base/decimal.h"
#include "kernels/base/status.h"
#include "model/json_util.h"

namespace flux2 {

absl::StatusOr<SchedulerConfig> SchedulerConfig::from_json(const nlohmann::json& json,
                                                           const std::string& source) {
  SchedulerConfig config;
  JsonFields f(json, source);
  FLUX_RETURN_IF_ERROR(f.read("num_train_timesteps", &config.num_train_timesteps));
  FLUX_RETURN_IF_ERROR(f.read("shift", &config.shift));
  FLUX_RETURN_IF_ERROR(f.read("use_dynamic_shifting", &config.use_dynamic_shifting));
  FLUX_RETURN_IF_ERROR(f.read("time_shift_type", &config.time_shift_type));
  if (config.time_shift_type != "exponential" && config.time_shift_type != "linear") {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": unsupported time_shift_type \"", config.time_shift_type, "\""));
  }
  for (const char* flag : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas",
                           "invert_sigmas", "stochastic_sampling"}) {
    bool enabled = false;
    FLUX_RETURN_IF_ERROR(f.read(flag, &enabled));
    if (enabled)
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", flag, " is not supported"));
  }
  double shift_terminal = 0.0;
  FLUX_RETURN_IF_ERROR(f.read("shift_terminal", &shift_terminal));
  if (shift_terminal != 0.0) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": shift_terminal is not supported"));
  }
  if (config.num_train_timesteps <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": num_train_timesteps must be positive"));
  }
  return config;
}

double flux2_empirical_mu(int64_t image_seq_len, int64_t num_steps) {
  constexpr double a1 = 8.73809524e-05, b1 = 1.89833333;
  constexpr double a2 = 0.00016927, b2 = 0.45666666;
  const double n = static_cast<double>(image_seq_len);
  if (image_seq_len > 4300) return a2 * n + b2;
  const double m_200 = a2 * n + b2;
  const double m_10 = a1 * n + b1;
  const double a = (m_200 - m_10) / 190.0;
  const double b = m_200 - 200.0 * a;
  return a * static_cast<double>(num_steps) + b;
}

Schedule make_schedule(const SchedulerConfig& config, int64_t num_steps, int64_t image_seq_len,
                       std::span<const double> custom_sigmas) {
  FLUX_CHECK(num_steps >= 1);
  FLUX_CHECK(custom_sigmas.empty() || static_cast<int64_t>(custom_sigmas.size()) == num_steps);
  Schedule schedule;
  schedule.mu = flux2_empirical_mu(image_seq_len, num_steps);
  // The pipeline's base sigmas: linspace(1, 1/N, N) in float64, then float32 in the scheduler.
  const double last = 1.0 / static_cast<double>(num_steps);
  const float e_mu = static_cast<float>(std::exp(schedule.mu));
  const float mu = static_cast<float>(schedule.mu);
  const float shift = static_cast<float>(config.shift);
  for (int64_t i = 0; i < num_steps; ++i) {
    // numpy linspace: start + i·step, with the last sample set to `stop` exactly.
    const double step = num_steps > 1 ? (last - 1.0) / static_cast<double>(num_steps - 1) : 0.0;
    const double base = (i == num_steps - 1) ? last : 1.0 + static_cast<double>(i) * step;
    const float t = static_cast<float>(custom_sigmas.empty() ? base : custom_sigmas[i]);
    float sigma;
    if (!config.use_dynamic_shifting) {
      sigma = shift * t / (1.0f + (shift - 1.0f) * t);
    } else if (config.time_shift_type == "exponential") {
      sigma = e_mu / (e_mu + (1.0f / t - 1.0f));  // (1/t − 1)^1.0 is exact
    } else {
      sigma = mu / (mu + (1.0f / t - 1.0f));
    }
    schedule.sigmas.push_back(sigma);
    schedule.timesteps.push_back(sigma * static_cast<float>(config.num_train_timesteps));
  }
  schedule.sigmas.push_back(0.0f);
  return schedule;
}

void check_custom_sigmas(std::span<const double> sigmas, int64_t steps, int64_t max_steps,
                         std::vector<FieldViolation>* violations) {
  if (sigmas.empty()) return;
  if (static_cast<int64_t>(sigmas.size()) > max_steps) {
    violations->push_back({"sigmas", absl::StrCat(sigmas.size(), " values exceed the ", max_steps,
                                                  " steps allowed")});
    return;
  }
  if (static_cast<int64_t>(sigmas.size()) != steps) {
    violations->push_back({"sigmas", absl::StrCat(sigmas.size(), " values for ", steps,
                                                  " steps (one sigma per step)")});
    return;
  }
  auto in_range = [](double sigma) { return std::isfinite(sigma) && sigma > 0.0 && sigma <= 1.0; };
  for (size_t i = 0; i < sigmas.size(); ++i) {
    const std::string field = absl::StrCat("sigmas[", i, "]");
    const double sigma = sigmas[i];
    if (!in_range(sigma)) {
      violations->push_back({field, absl::StrCat(exact_decimal(sigma), " is not in (0, 1]")});
    } else if (i > 0 && in_range(sigmas[i - 1]) &&
               static_cast<float>(sigma) >= static_cast<float>(sigmas[i - 1])) {
      // Compared as float32, the values the schedule uses.
      violations->push_back(
          {field, absl::StrCat(exact_decimal(sigma), " does not decrease from sigmas[", i - 1,
                               "] = ", exact_decimal(sigmas[i - 1]), " (compared in float32)")});
    }
  }
}

}  // namespace flux2
