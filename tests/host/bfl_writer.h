// The inverse of model/bfl_checkpoint.h for tests and tools: writes a diffusers-named FLUX.2
// transformer as one Black Forest Labs single file (fusing what BFL fuses, the final adaLN's halves
// swapped back). Tested by tests/host/bfl_checkpoint_test.cc (round trips, and BFL names checked
// against diffusers' convert_flux2_to_diffusers independently of the shared mapping).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "model/checkpoint.h"

namespace flux2::testing {

// Writes the transformer `diffusers` (a transformer/ directory: exactly the tensors of
// Flux2Weights::table for its config.json) to `path` in BFL naming, every name after `prefix`
// (e.g. kBflModelPrefix), each tensor in its checkpoint dtype, data 8-byte aligned. Streams from
// the mapped checkpoint (no tensor held in memory whole).
absl::Status write_bfl_transformer(const ComponentWeights& diffusers, const std::string& path,
                                   const std::string& prefix = "");

}  // namespace flux2::testing
