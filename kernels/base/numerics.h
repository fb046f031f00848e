// Error measures used by the golden checker and the tests (tests/data/README.md: relative error =
// ||out − ref||₂ / ||ref||₂ over the whole tensor). Tested by tests/host/small_units_test.cc.
#pragma once

#include <cmath>
#include <span>

namespace flux2 {

// ||out − ref||₂ / ||ref||₂ in double; NaN/inf anywhere in `out` gives +inf; a zero reference
// gives 0 when out is zero too, else +inf.
inline double relative_l2_error(std::span<const float> out, std::span<const float> ref) {
  if (out.size() != ref.size()) return INFINITY;
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    const double delta = static_cast<double>(out[i]) - ref[i];
    diff += delta * delta;
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  if (norm == 0.0) return diff == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(diff / norm);
}

}  // namespace flux2
