// `flux2 bench --attention-only`: attention alone at a model's joint shape, its q/k/v read from the
// single block's fused projection buffer (strided) and from contiguous buffers. Run on the GPU
// machine by tests/gpu/run_on_device.sh `attention`.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "nlohmann/json.hpp"

namespace flux2 {

struct AttentionBenchOptions {
  std::string model, quality;
  int64_t height = 1024, width = 1024, text_len = 512;
  int64_t warmup = 3, steps = 10;
  RequestOptions request;  // quality=high: the FP8 attention
};

absl::StatusOr<nlohmann::json> bench_attention(Backend& be, const AttentionBenchOptions& o);

}  // namespace flux2
