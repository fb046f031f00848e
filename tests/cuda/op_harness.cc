// The op test harness: inputs, sentinels, the checks and perf mode; see op_harness.h.
#include "tests/cuda/op_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "kernels/base/dtype.h"
#include "kernels/base/fast_path_registry.h"
#include "kernels/base/numerics.h"
#include "kernels/base/uniform_hash.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2::testing {
namespace {

constexpr float kSentinel = std::numeric_limits<float>::quiet_NaN();

// Uploads `values` into a new [rows, cols] tensor of `dtype`.
Tensor upload(Backend& be, int64_t rows, int64_t cols, const std::vector<float>& values,
              DType dtype) {
  Tensor t = be.empty(dtype, {rows, cols}).value();
  EXPECT_TRUE(be.upload(values.data(), DType::kF32, t).ok());
  return t;
}

// The element offset of `view` inside `buffer` as (row, column); both share a row stride.
std::pair<int64_t, int64_t> position_in(const Tensor& buffer, const Tensor& view) {
  const int64_t offset =
      (static_cast<const char*>(view.data()) - static_cast<const char*>(buffer.data())) /
      dtype_size(buffer.dtype());
  return {offset / buffer.row_stride(), offset % buffer.row_stride()};
}

// Whether `result` lies inside `g`'s checked region (then it is the one compared).
bool covers(const OpEnv::Guarded& g, const Tensor& result) {
  const char* begin = static_cast<const char*>(g.buffer.data());
  const char* at = static_cast<const char*>(result.data());
  if (at < begin || at >= begin + g.buffer.bytes()) return false;
  return result.row_stride() == g.buffer.row_stride() || result.rows() <= 1;
}

// Sentinels: inside `result` every value is finite, everywhere else in the NaN-filled buffers
// every value is still NaN (an op that wrote outside its output, or left part of it unwritten,
// fails here). In-place inputs: only their guard rows are checked.
void check_sentinels(Backend& be, const OpEnv& env, const Tensor& result, const std::string& what) {
  bool found = false;
  for (const OpEnv::Guarded& g : env.guarded()) {
    const std::vector<float> all = values(be, g.buffer);
    const int64_t stride = g.buffer.cols();
    const bool holds = covers(g, result);
    found |= holds;
    auto [r0, c0] = holds ? position_in(g.buffer, result) : std::pair<int64_t, int64_t>{-1, -1};
    const int64_t in_rows = holds ? result.rows() : 0, in_cols = holds ? result.cols() : 0;
    int64_t bad_inside = 0, bad_outside = 0;
    for (int64_t r = 0; r < g.buffer.rows(); ++r) {
      const bool guard_row = r < g.first_row || r >= g.first_row + g.rows;
      for (int64_t c = 0; c < stride; ++c) {
        const float v = all[r * stride + c];
        const bool inside = r >= r0 && r < r0 + in_rows && c >= c0 && c < c0 + in_cols;
        if (inside) {
          bad_inside += !std::isfinite(v);
        } else if (guard_row || g.rows == g.buffer.rows()) {
          bad_outside += !std::isnan(v);  // outputs: all outside; in place: the guards
        }
      }
    }
    EXPECT_EQ(bad_inside, 0) << what << ": non-finite or unwritten result values";
    EXPECT_EQ(bad_outside, 0) << what << ": values written outside the result";
  }
  EXPECT_TRUE(found) << what << ": the result is not a view of an output or in-place input";
}

// Fallback counts by "path:reason" since `before`.
std::vector<std::string> fallbacks_since(const std::vector<FastPathCounters>& before) {
  std::vector<std::string> out;
  for (const FastPathCounters& now : fast_path_snapshot()) {
    for (const auto& [reason, count] : now.fallbacks) {
      int64_t earlier = 0;
      for (const FastPathCounters& b : before) {
        if (b.path == now.path && b.fallbacks.count(reason)) earlier = b.fallbacks.at(reason);
      }
      if (count > earlier) out.push_back(now.path + ":" + reason);
    }
  }
  return out;
}

}  // namespace

std::vector<float> OpEnv::draw(int64_t count, float scale) {
  std::vector<float> values(static_cast<size_t>(count));
  const uint64_t stream = seed_ * 1000003u + draws_++;
  for (int64_t i = 0; i < count; ++i) {
    values[i] =
        round_to_bf16((2.0f * uniform_hash(stream, static_cast<uint64_t>(i)) - 1.0f) * scale);
  }
  return values;
}

absl::StatusOr<Tensor> OpEnv::call(Tensor result, std::function<absl::Status()> op) {
  op_ = std::move(op);
  if (absl::Status status = op_(); !status.ok()) return status;
  return result;
}

Tensor OpEnv::input(int64_t rows, int64_t cols, float scale) {
  return input_values(rows, cols, draw(rows * cols, scale));
}

Tensor OpEnv::input_values(int64_t rows, int64_t cols, const std::vector<float>& values, bool f32) {
  EXPECT_EQ(static_cast<int64_t>(values.size()), rows * cols);
  Tensor t = upload(backend_, rows, cols, values, f32 ? DType::kF32 : backend_.activation_dtype());
  bytes_ += t.bytes();
  return t;
}

Tensor OpEnv::output(int64_t rows, int64_t cols) {
  const std::vector<float> nan(static_cast<size_t>(rows * cols), kSentinel);
  Tensor t = upload(backend_, rows, cols, nan, backend_.activation_dtype());
  guarded_.push_back({t, 0, rows});
  return t;
}

Tensor OpEnv::in_place(int64_t rows, int64_t cols, float scale) {
  std::vector<float> host(static_cast<size_t>((rows + 2) * cols), kSentinel);
  const std::vector<float> inside = draw(rows * cols, scale);
  std::copy(inside.begin(), inside.end(), host.begin() + cols);
  Tensor t = upload(backend_, rows + 2, cols, host, backend_.activation_dtype());
  guarded_.push_back({t, 1, rows});
  bytes_ += rows * cols * dtype_size(t.dtype());  // read (the write is the result's bytes)
  return t.row_slice(1, rows);
}

void check_op_case(const OpCase& c) {
  FLUX2_REQUIRE_GPU(gpu);
  const std::string what = c.op + " " + c.vars;
  const OpRun& gpu_run = c.run_gpu ? c.run_gpu : c.run;
  // CUDA, fast paths on: sentinels, the path ran, no unexpected fallback.
  OpEnv fast_env(*gpu, 1);
  const std::vector<FastPathCounters> before = fast_path_snapshot();
  const int64_t invoked = c.path.empty() ? 0 : fast_path_counters(c.path).invocations;
  absl::StatusOr<Tensor> fast = gpu_run(fast_env);
  ASSERT_TRUE(fast.ok()) << what << ": " << fast.status();
  ASSERT_TRUE(gpu->synchronize().ok());
  check_sentinels(*gpu, fast_env, *fast, what);
  if (!c.path.empty()) {
    EXPECT_GT(fast_path_counters(c.path).invocations, invoked)
        << what << ": " << c.path << " did not run";
  }
  const std::vector<std::string> fell_back = fallbacks_since(before);
  const std::vector<std::string> expected = c.expected_fallback.empty()
                                                ? std::vector<std::string>{}
                                                : std::vector<std::string>{c.expected_fallback};
  EXPECT_EQ(fell_back, expected) << what << ": fallbacks counted";
  const std::vector<uint16_t> fast_bits = bits(*gpu, *fast);

  // CUDA, fast paths off: the eager chains give the same bits (lossless by contract).
  if (gpu->request().quality == Quality::kLossless) {
    OpEnv eager_env(*gpu, 1);
    const RequestScope eager(*gpu, {Quality::kLossless, /*fast_paths=*/false});
    absl::StatusOr<Tensor> slow = gpu_run(eager_env);
    ASSERT_TRUE(slow.ok()) << what << " (eager): " << slow.status();
    const std::vector<uint16_t> eager_bits = bits(*gpu, *slow);
    int64_t differing = 0;
    for (size_t i = 0; i < fast_bits.size() && i < eager_bits.size(); ++i) {
      differing += fast_bits[i] != eager_bits[i];
    }
    EXPECT_EQ(fast_bits.size(), eager_bits.size());
    EXPECT_EQ(differing, 0) << what << ": " << differing << " of " << fast_bits.size()
                            << " values differ between fast paths on and off";
  }

  // CPU reference: non-trivial, and the CUDA result within the bound.
  CpuBackend cpu;
  OpEnv cpu_env(cpu, 1);
  absl::StatusOr<Tensor> reference = c.run(cpu_env);
  ASSERT_TRUE(reference.ok()) << what << " (cpu): " << reference.status();
  const std::vector<float> ref = values(cpu, *reference), got = values(*gpu, *fast);
  double norm = 0.0;
  bool constant = true;
  for (float v : ref) {
    norm += static_cast<double>(v) * v;
    constant &= v == ref.front();
  }
  EXPECT_GT(std::sqrt(norm), 1e-3) << what << ": trivial reference";
  EXPECT_FALSE(constant && ref.size() > 1) << what << ": constant reference";
  const double error = relative_l2_error(got, ref);
  EXPECT_LE(error, c.bound) << what << ": relative L2 error against the CPU reference"
                            << (c.bound_why.empty() ? "" : " (bound: " + c.bound_why + ")");
}

void time_op_case(const OpCase& c) {
  std::string why;
  Backend* gpu = gpu_backend(&why);
  if (gpu == nullptr) {
    std::printf("%s %s: skipped: %s\n", c.op.c_str(), c.vars.c_str(), why.c_str());
    return;
  }
  const OpRun& run = c.run_gpu ? c.run_gpu : c.run;
  OpEnv env(*gpu, 1);
  absl::StatusOr<Tensor> result = run(env);  // warm-up: plans, first launches
  if (!result.ok()) {
    std::printf("%s %s: error: %s\n", c.op.c_str(), c.vars.c_str(),
                std::string(result.status().message()).c_str());
    return;
  }
  const int64_t bytes = env.bytes_set() ? env.bytes() : env.bytes() + result->bytes();
  // Each timed call starts from a cold L2: 128 MiB written between calls evicts the
  // H200's 60 MiB, so inputs come from device memory, as they do inside a model step.
  Tensor scrub = gpu->empty(DType::kBF16, {int64_t{64} << 20}).value();
  std::vector<double> samples;
  for (int i = 0; i < 20; ++i) {
    if (!gpu->fill_uniform(scrub, static_cast<uint64_t>(i), 1.0f).ok()) break;
    absl::StatusOr<double> ms = gpu->time_ms([&] { return env.last_op()(); });
    if (ms.ok()) samples.push_back(*ms);
  }
  if (samples.empty()) {
    std::printf("%s %s: timing failed\n", c.op.c_str(), c.vars.c_str());
    return;
  }
  std::sort(samples.begin(), samples.end());
  const double median = samples[samples.size() / 2];
  std::printf("%-22s %-32s %9.3f ms %8.1f GB/s\n", c.op.c_str(), c.vars.c_str(), median,
              median > 0 ? bytes / (median * 1e6) : 0.0);
}

}  // namespace flux2::testing
