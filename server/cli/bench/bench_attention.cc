// bench_attention; see bench_attention.h.
// Run on the GPU machine by tests/gpu/run_on_device.sh `attention`; flux2_bench_attention_cpu
// (tests/server/CMakeLists.txt) runs the host side at a tiny image size.
#include "server/cli/bench/bench_attention.h"

#include <cmath>
#include <optional>
#include <vector>

#include "kernels/base/status.h"
#include "model/flux2_presets.h"
#include "server/cli/bench/gpu_sampler.h"
#include "server/cli/bench/median.h"

namespace flux2 {

// Attention alone at the model's joint shape, reading q/k/v from the single block's fused
// [S, 9D] projection buffer (strided) and from separate contiguous [S, D] buffers: what the
// operand layout costs cuDNN.
absl::StatusOr<nlohmann::json> bench_attention(Backend& be, const AttentionBenchOptions& o) {
  FLUX_ASSIGN_OR_RETURN(Flux2Config config, flux2_preset(o.model));
  const int64_t s = (o.height / 16) * (o.width / 16) + o.text_len, d = config.hidden();
  const int64_t dh = config.attention_head_dim, wide = 3 * d + 2 * config.mlp_hidden();
  const DType act = be.activation_dtype();
  FLUX_ASSIGN_OR_RETURN(Tensor fused, be.empty(act, {s, wide}));
  FLUX_ASSIGN_OR_RETURN(Tensor q, be.empty(act, {s, d}));
  FLUX_ASSIGN_OR_RETURN(Tensor k, be.empty(act, {s, d}));
  FLUX_ASSIGN_OR_RETURN(Tensor v, be.empty(act, {s, d}));
  FLUX_ASSIGN_OR_RETURN(Tensor out, be.empty(act, {s, d}));
  for (const Tensor* t : {&fused, &q, &k, &v}) FLUX_RETURN_IF_ERROR(be.fill_uniform(*t, 3, 1.0f));
  const RequestScope request(be, o.request);  // high: FP8 attention
  const AttentionParams params{config.num_attention_heads, config.num_attention_heads, dh,
                               static_cast<float>(1.0 / std::sqrt(static_cast<double>(dh)))};
  auto time_layout = [&](const Tensor& qq, const Tensor& kk,
                         const Tensor& vv) -> absl::StatusOr<double> {
    std::vector<double> times;
    for (int64_t i = 0; i < o.warmup + o.steps; ++i) {
      FLUX_ASSIGN_OR_RETURN(double ms,
                            be.time_ms([&] { return be.attention(qq, kk, vv, params, out); }));
      if (i >= o.warmup) times.push_back(ms);
    }
    return median_of(times);
  };
  GpuSampler sampler(be.device_pci_bus_id());  // the clock and power of both layouts' runs
  FLUX_ASSIGN_OR_RETURN(double strided, time_layout(fused.col_slice(0, d), fused.col_slice(d, d),
                                                    fused.col_slice(2 * d, d)));
  FLUX_ASSIGN_OR_RETURN(double contiguous, time_layout(q, k, v));
  const std::optional<GpuClockPower> clock_power = sampler.stop();
  const double flops = 4.0 * static_cast<double>(s) * s * d;
  nlohmann::json result{{"model", o.model},
                        {"quality", o.quality},
                        {"tokens", s},
                        {"ms_strided", strided},
                        {"ms_contiguous", contiguous},
                        {"tflops_strided", flops / (strided * 1e9)},
                        {"tflops_contiguous", flops / (contiguous * 1e9)}};
  add_clock_power(clock_power, result);
  return result;
}

}  // namespace flux2
