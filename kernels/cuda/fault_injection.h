// TEST ONLY kernels behind CudaBackend::inject_fault (flux2_server --test-inject-fault): a write
// to an unmapped address and a timed spin. Tested by the fault tests of
// tests/cuda/server_gpu_test.cc.
#pragma once

#include <cuda_runtime_api.h>

namespace flux2::cuda {

// One thread writes to an address no allocation maps: the stream's next wait fails with
// cudaErrorIllegalAddress, a sticky error that every later call of the process repeats.
void launch_illegal_address_write(cudaStream_t stream);
// One thread spins on the GPU's nanosecond timer for `seconds`: work behind it on the stream
// waits as behind a hung kernel.
void launch_spin(cudaStream_t stream, double seconds);

}  // namespace flux2::cuda
