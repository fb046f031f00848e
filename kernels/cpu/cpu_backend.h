// The CPU reference backend: float32 math in plain loops over host memory, multithreaded with
// parallel_for, GEMMs through OpenBLAS. It is the oracle the CUDA backend is compared against; at
// quality=high it emulates the CUDA backend's FP8 formats in float32 (cpu_fp8.h), the
// same-precision reference of the quality=high bounds.
// Tested op by op by tests/host/cpu_ops_test.cc and end to end by the golden checker.
#pragma once

#include "kernels/backend.h"

namespace flux2 {

class CpuBackend final : public Backend {
 public:
  absl::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::kCpu; }
  DType activation_dtype() const override { return DType::kF32; }
  DType weight_dtype() const override { return DType::kF32; }

  absl::StatusOr<Tensor> empty(DType dtype, Shape shape) override;
  absl::Status upload(const void* host, DType host_dtype, const Tensor& dst) override;
  absl::Status download(const Tensor& src, float* host) override;
  absl::Status copy(const Tensor& src, const Tensor& dst) override;
  absl::Status synchronize() override { return absl::OkStatus(); }
  absl::Status fill_uniform(const Tensor& t, uint64_t seed, float scale) override;

  // quality=high: a per-channel E4M3 copy of w, dequantized (cpu_fp8.h); linear then quantizes
  // x per token the same way: a float32 emulation of the CUDA backend's rowwise FP8 GEMMs.
  absl::StatusOr<std::shared_ptr<const LowPrecisionWeight>> add_fp8_weight(
      const Tensor& w) override;
  // quality=high on an FP8 checkpoint: the stored weight's values (float(W8) * s_r, exact in
  // f32) as the FP8 GEMM's weight, x quantized per token as above, or with `input_scale` per
  // tensor under it (cpu_fp8.h quantize_static_e4m3).
  absl::StatusOr<std::shared_ptr<const LowPrecisionWeight>> add_stored_fp8_weight(
      const Tensor& values, const Tensor& row_scales, std::optional<float> input_scale) override;
  absl::Status dequantize_e4m3_rows(const Tensor& values, const Tensor& row_scales,
                                    const Tensor& out) override;
  absl::Status linear(const Tensor& x, const Weight& w, const Tensor& bias,
                      const Tensor& y) override;
  absl::Status lora_up_add(const Tensor& y, const std::vector<LoraUpTerm>& terms) override;

  absl::Status silu(const Tensor& x, const Tensor& out) override;
  absl::Status add(const Tensor& a, const Tensor& b, const Tensor& out) override;
  absl::Status sub(const Tensor& a, const Tensor& b, const Tensor& out) override;
  absl::StatusOr<float> mean_abs_diff_ratio(const Tensor& a, const Tensor& b) override;
  absl::Status gate_residual(const Tensor& x, const Tensor& gate, const Tensor& update) override;
  absl::Status swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) override;

  absl::Status layer_norm_modulate(const Tensor& x, const Tensor& shift, const Tensor& scale,
                                   float eps, const Tensor& out) override;
  absl::Status rms_norm(const Tensor& x, const Tensor& weight, float eps,
                        const Tensor& out) override;
  absl::Status qk_norm_rope(const Tensor& x, int64_t head_dim, const Tensor& norm_weight, float eps,
                            const Tensor& cos, const Tensor& sin, RopeStyle style) override;
  absl::Status rope(const Tensor& x, int64_t head_dim, const Tensor& cos, const Tensor& sin,
                    RopeStyle style) override;
  absl::Status group_norm(const Tensor& x, int64_t groups, const Tensor& gamma, const Tensor& beta,
                          float eps, bool silu, const Tensor& out) override;

  absl::Status attention(const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionParams& params, const Tensor& out) override;
  // quality=high: the FP8 emulation with each key segment quantized on its own; otherwise the
  // default (the cache copied after k and v, then attention).
  absl::Status attention_with_cached_keys(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const CachedKeys& cached, const Tensor& k_room,
                                          const Tensor& v_room, const AttentionParams& params,
                                          const Tensor& out) override;

  absl::Status conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                      const Tensor& out) override;
  absl::Status conv2d_downsample(const Tensor& x, const Tensor& w, const Tensor& bias,
                                 const Tensor& out) override;
  absl::Status upsample_nearest_2x(const Tensor& x, const Tensor& out) override;
  absl::Status latent_unpack(const Tensor& tokens, const Tensor& bn_mean, const Tensor& bn_var,
                             float eps, const Tensor& out) override;
  absl::Status latent_pack(const Tensor& x, const Tensor& bn_mean, const Tensor& bn_var, float eps,
                           const Tensor& tokens) override;

  absl::Status from_rgb8(const uint8_t* host, const Tensor& image) override;
  absl::Status to_rgb8(const Tensor& image, uint8_t* host) override;
  absl::Status euler_step(const Tensor& x, const Tensor& v, float dt) override;
  absl::Status cfg_combine(const Tensor& uncond, const Tensor& cond, float scale,
                           const Tensor& out) override;

 private:
  // attention's checks: the head layout, f32 q, k, v and out of matching shapes.
  absl::Status check_attention(absl::string_view op, const Tensor& q, const Tensor& k,
                               const Tensor& v, const AttentionParams& params, const Tensor& out);
  // Whether this attention emulates the CUDA backend's FP8 one: quality=high, non-causal, unmasked.
  bool emulates_fp8_attention(const AttentionParams& params) const;
  // An FP8 attention operand: t's E4M3 values per head and 128 rows (V's scales powers of two).
  absl::StatusOr<Tensor> fp8_attention_operand(const Tensor& t, int64_t head_dim, bool value);
  // attention's loops over (head, query row), keys below valid_keys; `fp8_probabilities` rounds
  // each probability as the FP8 kernel does before it weights V.
  absl::Status attention_rows(const Tensor& q, const Tensor& k, const Tensor& v,
                              const AttentionParams& params, const Tensor& out, int64_t valid_keys,
                              bool fp8_probabilities);
};

}  // namespace flux2
