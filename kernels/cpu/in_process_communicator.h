// The in-process Communicator: the P ranks of a group are threads of one process whose tensors
// live in host memory (the CPU backend's), so a collective is a barrier and memcpy (timed in wall
// time, the barrier's wait included: take_collective_seconds). It runs the parallel algorithms of
// model/sequence_parallel.h on the CPU, where CI tests them against one rank. Tested by
// tests/host/sequence_parallel_test.cc.
#pragma once

#include <memory>
#include <vector>

#include "kernels/base/communicator.h"

namespace flux2 {

// The `size` ranks of a new group, communicator i being rank i. Each is used by one thread; a
// collective waits for every rank's thread to enter it (or for an abort). The communicators
// share the group's state and may be destroyed in any order.
std::vector<std::unique_ptr<Communicator>> create_in_process_group(int size);

}  // namespace flux2
