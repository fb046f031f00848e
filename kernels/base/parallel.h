// parallel_for: splits [0, n) into contiguous chunks run on a fixed pool of host threads.
// Used by the CPU backend; tested by tests/host/parallel_test.cc.
#pragma once

#include <cstdint>
#include <functional>

namespace flux2 {

// Calls fn(begin, end) on disjoint chunks covering [0, n), at most one chunk per worker thread,
// and returns when all are done. Chunks smaller than `min_chunk` items are not split further.
// Nested calls run serially on the calling thread.
void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

// Number of worker threads (FLUX2_CPU_THREADS, else the hardware concurrency).
int parallel_thread_count();

}  // namespace flux2
