// --gpus: the GPUs of this host one request is split over, given as a count N (device ordinals
// 0 .. N-1) or as a comma-separated list of two or more distinct device ordinals (`--gpus 2,3`),
// rank r running on the r-th. Parsed and checked here with errors naming --gpus; the ordinals are
// the `gpu` label of the per-GPU metrics and GetModelInfo's backend_options["gpu-ordinals"].
// Tested by tests/server/server_options_test.cc (GpusFlag*).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flux2 {

// The most GPUs one request may be split over: a bound against typos (the model's attention
// heads decide at load which counts fit; 64 is well above any host's).
inline constexpr int kMaxGpus = 64;

// The ordinals of `text`: "N" is 0 .. N-1 (N in 1..kMaxGpus), "A,B,..." the listed ordinals.
// InvalidArgument naming --gpus: empty, not a count or a list of integers, an empty entry, a
// negative or duplicate ordinal, a count outside 1..kMaxGpus, more than kMaxGpus entries.
absl::StatusOr<std::vector<int>> parse_gpus_flag(absl::string_view text);

// OK when `gpus` is what parse_gpus_flag can return (options built in code are checked too):
// 1..kMaxGpus distinct non-negative ordinals, a single one being device 0 (one GPU runs on the
// process's first device; CUDA_VISIBLE_DEVICES picks another). InvalidArgument naming --gpus.
absl::Status check_gpus(const std::vector<int>& gpus);

// How --gpus reads for `gpus`: the count when they are 0 .. N-1 ("3"), else the list ("2,3").
std::string gpus_flag_text(const std::vector<int>& gpus);

// The ordinals comma-separated ("0,1,2"), as GetModelInfo reports them.
std::string gpu_ordinals_text(const std::vector<int>& gpus);

}  // namespace flux2
