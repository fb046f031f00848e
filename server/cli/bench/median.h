// The median the `flux2 bench` timings report (the upper one of an even count; 0 for none).
// Used by bench_command.cc, bench_e2e.cc and bench_attention.cc; covered by their ctest runs on
// the CPU.
#pragma once

#include <algorithm>
#include <vector>

namespace flux2 {

inline double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

}  // namespace flux2
