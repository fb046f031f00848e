// `flux2 bench --e2e`: whole requests (tokenize, text encode, reference encode, denoise, decode,
// PNG encode) with random weights at a model's shapes, 1024x1024 by default: the median of
// `repeats` runs after one warm-up, per phase; with --lora-rank the same requests without the
// adapters too, for the ratios. Run on the GPU machine by tests/gpu/run_on_device.sh.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/step_cache.h"
#include "nlohmann/json.hpp"
#include "server/cli/bench/bench_options.h"

namespace flux2 {

absl::StatusOr<nlohmann::json> bench_e2e(Backend& be, const BenchOptions& o,
                                         const std::string& tokenizer_dir, int repeats);

// How a request caches steps, for the report: "W4 MC3 R0.24", the schedule's flags, or "off".
std::string cache_description(const StepCacheOptions& cache);

}  // namespace flux2
