// Wall time on the steady clock, shared by every layer (request stages, load times, the worker):
// seconds elapsed since a point. Exercised by the timings every request reports
// (tests/server/engine_worker_test.cc checks they are positive and add up).
#pragma once

#include <chrono>

namespace flux2 {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace flux2
