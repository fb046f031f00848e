// `flux2 bench --lora-load-mb N`: what an adapter costs before its first step, at the real
// shapes: a random adapter file of about N MB in diffusers' layout on every Linear of --model,
// its header check, its host load through the server's registry (read, hash, parse) on first and
// on cached use, its upload to the device cache and its resident reuse; then 8 smaller adapters
// (rank 32) requested in turn twice, each request's acquire timed (the first round uploads, the
// second finds them resident). Run by tests/gpu/run_on_device.sh `lora`.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/flux2_config.h"
#include "nlohmann/json.hpp"

namespace flux2 {

absl::StatusOr<nlohmann::json> bench_lora_load(Backend& backend, const Flux2Config& config,
                                               int64_t megabytes);

}  // namespace flux2
