// The FLUX.2 flow-matching schedule (model/README.md, "Schedule"): scheduler_config.json, the
// empirical mu, shifted sigmas and timesteps exactly as diffusers' FlowMatchEulerDiscreteScheduler
// computes them (float32 where numpy does), and the Euler update. Tested by
// tests/host/scheduler_test.cc and `flux2 check-golden --only scheduler`.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/field_violation.h"
#include "nlohmann/json.hpp"

namespace flux2 {

struct SchedulerConfig {
  int64_t num_train_timesteps = 1000;           // timestep = sigma x this
  double shift = 3.0;                           // static shift, used only without dynamic shifting
  bool use_dynamic_shifting = true;             // FLUX.2: mu comes from the pipeline (empirical mu)
  std::string time_shift_type = "exponential";  // "exponential" or "linear"

  // Parses scheduler_config.json; options FLUX.2 never uses (Karras/exponential/beta sigmas,
  // shift_terminal, inverted or stochastic sigmas) are rejected rather than ignored.
  static absl::StatusOr<SchedulerConfig> from_json(const nlohmann::json& json,
                                                   const std::string& source);
};

struct Schedule {
  double mu = 0.0;               // the shift parameter used
  std::vector<float> sigmas;     // N + 1 values, the last 0
  std::vector<float> timesteps;  // N values: sigma x num_train_timesteps (float32)
  int64_t steps() const { return static_cast<int64_t>(timesteps.size()); }
  // Euler step size for step i: sigma[i+1] − sigma[i] (float32).
  float dt(int64_t i) const { return sigmas[i + 1] - sigmas[i]; }
};

// FLUX.2's empirical mu for `image_seq_len` noise tokens and `num_steps` steps.
double flux2_empirical_mu(int64_t image_seq_len, int64_t num_steps);

// The schedule for `num_steps` steps over `image_seq_len` image tokens (num_steps >= 1). The base
// sigmas are the pipeline's linspace(1, 1/N, N), or `custom_sigmas` when given (N values, as
// diffusers' `sigmas=` argument: they are cast to float32 and shifted like the default ones).
Schedule make_schedule(const SchedulerConfig& config, int64_t num_steps, int64_t image_seq_len,
                       std::span<const double> custom_sigmas = {});

// Refusals of a request's custom sigmas for a run of `steps` steps: each finite and in (0, 1],
// strictly decreasing, as many as the steps and at most `max_steps` (fields "sigmas", "sigmas[i]").
void check_custom_sigmas(std::span<const double> sigmas, int64_t steps, int64_t max_steps,
                         std::vector<FieldViolation>* violations);

}  // namespace flux2
