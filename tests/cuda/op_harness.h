// The op test harness (after ggml's test-backend-ops): one registry of cases, each
// an op call written once against the Backend interface and run on the CUDA backend with fast
// paths on and off and on the CPU reference backend with the same bf16-representable inputs.
// Every case checks, in this order: outputs finite where written and NaN sentinels untouched
// around them; fused == eager bit for bit (lossless); the fast path it names ran and no fallback
// was counted unless it expects one; the CPU reference non-trivial and the CUDA result within the
// case's relative L2 bound of it. `gpu_op_test --perf` times every case instead (GB/s of the bytes
// it reads and writes); `--op NAME` keeps the cases of one op. A new op or shape is one add() in
// op_cases.cc. Run by tests/gpu/run_on_device.sh; skips where no CUDA device exists.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace flux2::testing {

// The tensors of one run of a case on one backend. Inputs are drawn from (seed, call order), so
// the runs of a case on every backend see the same values.
class OpEnv {
 public:
  OpEnv(Backend& backend, uint64_t seed) : backend_(backend), seed_(seed) {}
  Backend& backend() { return backend_; }

  // [rows, cols] of uniform values in ±scale, rounded to bf16 (exact on both backends).
  Tensor input(int64_t rows, int64_t cols, float scale = 1.0f);
  // An input holding `values` (rounded to the backend's activation dtype; f32 when `f32`).
  Tensor input_values(int64_t rows, int64_t cols, const std::vector<float>& values,
                      bool f32 = false);
  // An output buffer [rows, cols] filled with NaN: the case's result must be it or a view of it;
  // the harness requires the result finite and every other element of the buffer still NaN.
  Tensor output(int64_t rows, int64_t cols);
  // An input the op updates in place: random values between two NaN guard rows that must stay.
  Tensor in_place(int64_t rows, int64_t cols, float scale = 1.0f);

  // Runs `op` (the case's backend call) once and returns `result`; perf mode re-runs the last op
  // between CUDA events, without the uploads.
  absl::StatusOr<Tensor> call(Tensor result, std::function<absl::Status()> op);
  const std::function<absl::Status()>& last_op() const { return op_; }

  // Bytes of every input and in-place input the case made: perf mode's
  // traffic a kernel cannot avoid, with the result's bytes added. A case whose op reads only
  // column slices of its buffers says what it touches instead (set_bytes: inputs and outputs).
  int64_t bytes() const { return bytes_; }
  void set_bytes(int64_t bytes) { bytes_ = bytes, bytes_set_ = true; }
  bool bytes_set() const { return bytes_set_; }
  // The NaN-filled buffers with their guarded region, for the sentinel check.
  struct Guarded {
    Tensor buffer;
    int64_t first_row = 0, rows = 0;  // in_place: the rows between the guards; output: all
  };
  const std::vector<Guarded>& guarded() const { return guarded_; }

 private:
  std::vector<float> draw(int64_t count, float scale);
  Backend& backend_;
  uint64_t seed_;
  uint64_t draws_ = 0;
  int64_t bytes_ = 0;
  bool bytes_set_ = false;
  std::vector<Guarded> guarded_;
  std::function<absl::Status()> op_;
};

// A case: makes its inputs and outputs, then returns env.call(result, op) (the result is an
// output, an in-place input or a view of one).
using OpRun = std::function<absl::StatusOr<Tensor>(OpEnv& env)>;

// Bound for a chain of bf16 ops against the float32 CPU reference, derived from norms: bf16's unit
// roundoff is u = 2^-8 ≈ 3.9e-3; round-to-nearest errors spread evenly over ±u and are independent
// between elements, so each rounding adds about u/√3 ≈ 2.3e-3 to the relative L2 error (an RMS),
// and r <= 4 roundings about √r · u/√3 ≈ 4.5e-3 (GEMMs and attention accumulate in fp32 and round
// once or twice more); 1e-2 covers them all.
inline constexpr double kBf16ChainBound = 1e-2;

struct OpCase {
  OpCase(std::string op_name, std::string parameters, OpRun call, std::string fast_path = "")
      : op(std::move(op_name)),
        vars(std::move(parameters)),
        run(std::move(call)),
        path(std::move(fast_path)) {}

  std::string op;    // "gate_residual": what --op selects
  std::string vars;  // the parameters, e.g. "S=4608,D=3072" (part of the test name)
  OpRun run;
  // The fast path that must run on the CUDA backend (its invocations counted), or "".
  std::string path;
  // A fallback the case expects on the CUDA backend ("path:reason"), else every fallback fails it.
  std::string expected_fallback;
  double bound = kBf16ChainBound;  // relative L2 to the CPU reference; why, when not the default
  std::string bound_why;
  // When set, the CUDA backend runs this instead (a launcher called directly, e.g. the fallback
  // kernel a fast path would hide); the CPU still runs `run`.
  OpRun run_gpu;
};

// gtest prints a case as its name (op and vars), not its bytes.
inline void PrintTo(const OpCase& c, std::ostream* os) {
  *os << c.op << " " << c.vars;
}

// Every registered case (op_cases.cc), in registration order.
const std::vector<OpCase>& op_cases();

// Runs the checks of `c` with GoogleTest assertions (the CUDA backend from gpu_test_util).
void check_op_case(const OpCase& c);
// Perf mode: times `c` on the CUDA backend, each call from a cold L2, and prints one line (median
// ms of 20, GB/s of the bytes it must read and write).
void time_op_case(const OpCase& c);

}  // namespace flux2::testing
