// parallel_for: splits [0, n) into contiguous chunks run on a fixed pool of host threads.
// Used by the CPU backend; tested by tests/host/small_units_test.cc (ParallelForTest).
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/status.h"

namespace flux2 {

// Calls fn(begin, end) on disjoint chunks covering [0, n), at most one chunk per worker thread,
// and returns when all are done. Chunks smaller than `min_chunk` items are not split further.
// Nested calls run serially on the calling thread.
void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

// Sizes the worker pool (BackendOptions::cpu_threads; 0: the hardware concurrency). Only before
// the first parallel_for: later, FailedPrecondition unless the size asked for is the one it has.
absl::Status set_parallel_thread_count(int threads);

// Number of worker threads, the calling thread included.
int parallel_thread_count();

}  // namespace flux2
