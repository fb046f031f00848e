// CudaBackend's class declaration, shared by the files that implement it: cuda_backend.cc
// (construction, memory, transfers), cuda_ops.cc (element-wise and norm ops), cuda_linear.cc (GEMMs
// and the fused projections, FP8 at quality=high), cuda_attention.cc, cuda_cached_keys.cc,
// cuda_conv.cc and cuda_profile.cc. Internal to kernels/cuda; tested through the backend by
// tests/cuda/.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/backend_options.h"
#include "kernels/base/status.h"
#include "kernels/cuda/cuda_fast_paths.h"
#include "kernels/cuda/cudnn_conv.h"
#include "kernels/cuda/cudnn_sdpa.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2 {

namespace cuda {
struct FlashFp8KeySegment;  // flash_attention_fp8.h
}  // namespace cuda

// A tensor as a launcher matrix.
inline cuda::Mat mat(const Tensor& t) {
  return cuda::Mat{t.data(), t.rows(), t.cols(), t.row_stride()};
}

// Keeps the stream alive for every tensor's deleter (frees are stream-ordered).
struct CudaStream {
  cudaStream_t stream = nullptr;
  ~CudaStream();
};

// A weight's low-precision copy (Backend::add_fp8_weight), and an activation's just before its
// GEMM: E4M3 values with per-channel (rowwise) or per-tensor scales, or on Blackwell packed E2M1
// values with swizzled UE4M3 block scales and a global scale.
struct CudaLowPrecision final : LowPrecisionWeight {
  Tensor values;  // E4M3 [N, K], or packed E2M1 [N, K / 2] bytes on the NVFP4 path
  Tensor scale;   // FP8: f32 [N] per output channel (rowwise) or [1] per tensor (amax / 448);
                  // NVFP4: UE4M3 block scales, 128x4 swizzled
  Tensor global;  // NVFP4 only: f32 [1] global encode scale
  // A weight's static activation scale, f32 [1] (add_stored_fp8_weight's input_scale): its GEMMs'
  // activations are quantized per tensor under it. Undefined: per token (or tensor), dynamically.
  Tensor input_scale;
  // values and scale are a stored FP8 weight's own tensors (add_stored_fp8_weight): no bytes added
  bool shares_stored = false;
  int64_t device_bytes() const override {
    // An unset tensor holds nothing (its bytes() would count one element of an empty shape).
    auto held = [](const Tensor& t) { return t.data() != nullptr ? t.bytes() : int64_t{0}; };
    return (shares_stored ? 0 : held(values) + held(scale) + held(global)) + held(input_scale);
  }
  // The static activation scale as a device pointer, null when there is none.
  const float* static_scale() const {
    return input_scale.data() != nullptr ? input_scale.data_as<float>() : nullptr;
  }
};

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> create(const BackendOptions& options);
  ~CudaBackend() override;

  absl::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }
  DType activation_dtype() const override { return DType::kBF16; }
  DType weight_dtype() const override { return DType::kBF16; }
  cudaStream_t stream() const { return stream_->stream; }
  // Whether quality=high's FP8 GEMMs scale per token and channel here (else per tensor).
  bool fp8_rowwise() const { return fp8_rowwise_; }

  absl::StatusOr<Tensor> empty(DType dtype, Shape shape) override;
  absl::Status upload(const void* host, DType host_dtype, const Tensor& dst) override;
  absl::Status download(const Tensor& src, float* host) override;
  absl::Status copy(const Tensor& src, const Tensor& dst) override;
  absl::Status synchronize() override;
  absl::Status fill_uniform(const Tensor& t, uint64_t seed, float scale) override;
  absl::StatusOr<std::vector<double>> time_each_ms(
      int64_t count, const std::function<absl::Status(int64_t)>& work) override;
  absl::StatusOr<Tensor> empty_host(DType dtype, Shape shape) override;
  absl::StatusOr<CopyTicket> start_copies(const std::vector<CopyPair>& copies) override;
  absl::Status await_copies(const CopyTicket& ticket) override;
  int64_t free_device_bytes() const override;
  std::string device_pci_bus_id() const override;
  BackendMemoryStats memory_stats() const override;
  absl::Status device_status() override;
  absl::Status inject_fault(InjectedFault fault, double hang_seconds) override;
  void reset_peak_memory() override;
  void set_op_profiling(OpProfiling mode) override { profiling_ = mode; }
  std::map<std::string, double> take_op_profile() override;
  std::map<std::string, int64_t> gemm_plan_stats() const override;
  absl::StatusOr<std::string> export_gemm_algorithms(std::string_view existing) override;
  GemmCandidates* gemm_candidates() override { return gemm_.get(); }
  absl::StatusOr<std::shared_ptr<const LowPrecisionWeight>> add_fp8_weight(
      const Tensor& w) override;
  absl::StatusOr<std::shared_ptr<const LowPrecisionWeight>> add_stored_fp8_weight(
      const Tensor& values, const Tensor& row_scales, std::optional<float> input_scale) override;
  absl::Status dequantize_e4m3_rows(const Tensor& values, const Tensor& row_scales,
                                    const Tensor& out) override;

  absl::Status linear(const Tensor& x, const Weight& w, const Tensor& bias,
                      const Tensor& y) override;
  absl::Status lora_down(const Tensor& x, const std::vector<Tensor>& stacks,
                         const Tensor& t) override;
  absl::Status lora_up_add(const Tensor& y, const std::vector<LoraUpTerm>& terms) override;
  absl::Status lora_up_swiglu(const Tensor& y, const std::vector<LoraUpTerm>& terms,
                              const Tensor& out) override;
  absl::Status lora_up_gate_residual(const Tensor& y, const std::vector<LoraUpTerm>& terms,
                                     const Tensor& x, const Tensor& gate) override;
  absl::Status lora_up_qk_norm_rope(const Tensor& x, const std::vector<LoraUpTerm>& terms,
                                    int64_t head_dim, const Tensor& norm_weight, float eps,
                                    const Tensor& cos, const Tensor& sin, RopeStyle style) override;
  absl::Status silu(const Tensor& x, const Tensor& out) override;
  absl::Status add(const Tensor& a, const Tensor& b, const Tensor& out) override;
  absl::Status sub(const Tensor& a, const Tensor& b, const Tensor& out) override;
  absl::StatusOr<float> mean_abs_diff_ratio(const Tensor& a, const Tensor& b) override;
  absl::Status gate_residual(const Tensor& x, const Tensor& gate, const Tensor& update) override;
  absl::Status swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  absl::Status swiglu_linear(const Tensor& gate, const Tensor& up, const Tensor& x, const Weight& w,
                             const Tensor& y, const GatedResidual* residual) override;
  absl::Status layer_norm_modulate(const Tensor& x, const Tensor& shift, const Tensor& scale,
                                   float eps, const Tensor& out) override;
  absl::Status layer_norm_modulate_linear(const Tensor& x, const Tensor& shift, const Tensor& scale,
                                          float eps, const Tensor& normed, const Weight& w,
                                          const Tensor& y) override;
  absl::Status layer_norm_modulate_linear_keeping_normed(const Tensor& x, const Tensor& shift,
                                                         const Tensor& scale, float eps,
                                                         const Tensor& normed, const Weight& w,
                                                         const Tensor& y) override;
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
  absl::Status normed_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                const QkNormRope& norm, const AttentionParams& params,
                                const Tensor& out) override;
  // klein-KV's cache (cuda_cached_keys.cc): at quality=high with the FP8 attention, its operands
  // quantized once and read as the kernel's second key segment.
  absl::StatusOr<std::shared_ptr<const CachedKeys>> cache_keys(
      const Tensor& k, const Tensor& v, const AttentionParams& params) override;
  absl::Status attention_with_cached_keys(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const CachedKeys& cached, const Tensor& k_room,
                                          const Tensor& v_room, const AttentionParams& params,
                                          const Tensor& out) override;
  absl::Status conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                      const Tensor& out) override;
  absl::Status conv2d_add(const Tensor& x, const Tensor& w, const Tensor& bias,
                          const Tensor& residual, const Tensor& out) override;
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
  friend class OpProfileScope;
  explicit CudaBackend(const BackendOptions& options) : options_(options) {}

  // Runs `fast` for `path` under the registry's one rule (fast_path_registry.h: run_fast_path)
  // with this request's options, else `fallback`; `unsupported` names a failed precondition.
  template <typename Fast, typename Fallback>
  absl::Status run_path(cuda::CudaPath path, absl::string_view unsupported, Fast&& fast,
                        Fallback&& fallback) {
    return run_fast_path(cuda::fast_path(path), request(), unsupported, fast, fallback,
                         [this] { return capturing(); });
  }
  // Runs into(target) for an output that may be a column range of a wider buffer: straight into
  // it (the token_concat fast path) or into a separate buffer, then copied (its eager chain).
  template <typename Into>
  absl::Status write_output(const Tensor& out, Into&& into) {
    if (out.contiguous()) return into(mat(out));
    return run_path(
        cuda::CudaPath::kTokenConcat, "", [&] { return into(mat(out)); },
        [&]() -> absl::Status {
          FLUX_ASSIGN_OR_RETURN(Tensor separate, scratch({out.rows(), out.cols()}));
          FLUX_RETURN_IF_ERROR(into(mat(separate)));
          return copy(separate, out);
        });
  }
  // A scratch tensor for eager chains (stream-ordered, freed when the returned tensor dies).
  absl::StatusOr<Tensor> scratch(Shape shape, DType dtype = DType::kBF16);
  bool capturing() const;
  // The SiLU inside SwiGLU and the VAE's GroupNorm: SiluMath::kFast at quality=high.
  cuda::SiluMath silu_math() const {
    return request().quality == Quality::kHigh ? cuda::SiluMath::kFast : cuda::SiluMath::kExact;
  }
  // ---- profiling (cuda_profile.cc) ----
  bool by_shape() const { return profiling_ == OpProfiling::kByShape; }
  // An op's profile category, split by op name with OpProfiling::kByShape.
  std::string op_category(absl::string_view category, absl::string_view op) const;
  // A GEMM's profile category ("gemm", "quantize"), split by shape with OpProfiling::kByShape.
  std::string profile_category(absl::string_view category, const Tensor& x, int64_t n) const;

  // ---- low-precision GEMMs at quality=high (cuda_linear.cc) ----
  // The low-precision copy of `w` a quality=high request uses, else null.
  const CudaLowPrecision* low_precision_of(const Weight& w) const;
  // The activation (or, at registration, the weight) in the backend's low-precision format.
  absl::StatusOr<CudaLowPrecision> quantize_low_precision(const Tensor& x);
  // The activation x of a GEMM with weight w: under w's static activation scale (FP8 E4M3 per
  // tensor; rowwise: that scale repeated for every row), else quantize_low_precision(x).
  absl::StatusOr<CudaLowPrecision> quantize_activation(const Tensor& x, const CudaLowPrecision& w);
  // y = x · wᵀ through the FP8 (or, on Blackwell, NVFP4) GEMM, x quantized first.
  absl::Status linear_low_precision(const Tensor& x, const CudaLowPrecision& w, const Tensor& y);
  // The GEMM of linear_low_precision on x's quantized copy xq.
  absl::Status gemm_low_precision(const Tensor& x, const CudaLowPrecision& xq,
                                  const CudaLowPrecision& w, const Tensor& y);
  // layer_norm_modulate_linear with rowwise FP8: the norm writes x's E4M3 rows (and with `normed`
  // its bf16 rows too, in the same pass), then the GEMM.
  absl::Status layer_norm_linear_fp8(const Tensor& x, const Tensor& shift, const Tensor& scale,
                                     float eps, const CudaLowPrecision& w, const Tensor& y,
                                     const Tensor* normed = nullptr);
  // layer_norm_modulate_linear(_keeping_normed): `keep` says whether normed must be written.
  absl::Status norm_linear(const Tensor& x, const Tensor& shift, const Tensor& scale, float eps,
                           const Tensor& normed, const Weight& w, const Tensor& y, bool keep);
  // swiglu_linear with rowwise FP8: one kernel writes x's E4M3 rows ([prefix | swiglu(gate, up)],
  // a scale per row) without the bf16 activation, then the GEMM; with `residual` the GEMM adds
  // gate ⊙ (x · wᵀ) into the stream itself (the gate folded into the per-channel scales, beta = 1).
  absl::Status swiglu_linear_fp8(const Tensor& gate, const Tensor& up, const Tensor& x,
                                 const CudaLowPrecision& w, const Tensor& y,
                                 const GatedResidual* residual);

  // ---- attention (cuda_attention.cc) ----
  // bf16 attention into `target`: cuDNN SDPA where it applies and serves the shape, else the
  // plain kernel.
  absl::Status attention_bf16(const Tensor& q, const Tensor& k, const Tensor& v,
                              const AttentionParams& params, const cuda::Mat& target);
  // quality=high: Q, K and V quantized to E4M3 per head and 128 tokens (V transposed; with `norm`,
  // QK-norm and RoPE on the way), then our FP8 flash attention straight into the bf16 output; with
  // `cached`, its keys are a second segment after k's (klein-KV's FP8 cache).
  absl::Status attention_flash_fp8(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionParams& params, const QkNormRope* norm,
                                   const cuda::Mat& out,
                                   const cuda::FlashFp8KeySegment* cached = nullptr);
  // Whether a quality=high request's attention runs through our FP8 kernel (when it can).
  bool wants_fp8_attention(const AttentionParams& params) const;
  // Attention for one wide head (the VAE mid block, head_dim 512): Q·Kᵀ, row softmax, P·V.
  absl::Status attention_by_gemms(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                                  const cuda::Mat& out);

  // ---- convolutions (cuda_conv.cc) ----
  absl::Status check_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                            const Tensor& out) const;
  // The convolution with PyTorch's separate bias add.
  absl::Status conv_unfused(const Tensor& x, const Tensor& w, const Tensor& bias,
                            const Tensor& out);
  // quality=high: bias (and residual, when not null) in cuDNN's epilogue; else `separate`.
  template <typename Separate>
  absl::Status conv2d_fused(const Tensor& x, const Tensor& w, const Tensor& bias,
                            const Tensor* residual, const Tensor& out, Separate separate);

  const BackendOptions options_;
  std::shared_ptr<CudaStream> stream_;
  std::shared_ptr<CudaStream> copy_stream_;  // start_copies: host-resident weights onto the GPU
  std::unique_ptr<cuda::Gemm> gemm_;
  std::unique_ptr<cuda::CudnnSdpa> sdpa_;
  std::unique_ptr<cuda::CudnnConv> conv_;
  void* staging_[2] = {nullptr, nullptr};  // pinned host buffers for transfers
  cudaEvent_t staging_done_[2] = {nullptr, nullptr};
  // The staging buffer the next upload chunk fills: alternating across calls too, so converting
  // one small tensor overlaps the previous one's copy (a LoRA adapter is hundreds of them).
  int staging_next_ = 0;
  int64_t total_bytes_ = 0;
  int multiprocessors_ = 0;            // the device's SMs (how lora_down splits its work)
  int device_ = 0;                     // its ordinal (current on the thread that made it)
  std::string device_name_;            // cudaDeviceProp::name: the GEMM table's section
  bool fail_next_allocation_ = false;  // inject_fault(kDeviceOutOfMemory) armed
  // quality=high's FP8 GEMMs scale per token and per channel when cuBLASLt offers it on this
  // device (LayerNorm+modulate and SwiGLU then write the E4M3 rows of the GEMM after them); else
  // per tensor, each activation quantized just before its GEMM.
  bool fp8_rowwise_ = false;
  // Blackwell (compute capability >= 10.0) with cuBLASLt's block-scaled FP4 GEMM: quality=high
  // uses NVFP4 instead of FP8 there (Hopper has no FP4 tensor cores). Never on the H200.
  bool nvfp4_ = false;
  // Whether the fused producers (layer_norm_modulate_linear, swiglu_linear) write their GEMM's
  // E4M3 rows with a scale per row (rowwise FP8 at quality=high).
  bool fp8_rows_wanted() const {
    return request().quality == Quality::kHigh && !nvfp4_ && fp8_rowwise_;
  }

  OpProfiling profiling_ = OpProfiling::kOff;
  int profile_depth_ = 0;  // ops called by ops are timed once, by the outermost
  struct ProfiledOp {
    std::string category;
    cudaEvent_t start, stop;
  };
  std::vector<ProfiledOp> profiled_;
};

// Times an op while profiling is on and `category` is not empty (events on the backend's stream);
// nested timed scopes are counted once, by the outermost.
class OpProfileScope {
 public:
  OpProfileScope(CudaBackend& backend, std::string category);
  ~OpProfileScope();
  OpProfileScope(const OpProfileScope&) = delete;
  OpProfileScope& operator=(const OpProfileScope&) = delete;

 private:
  CudaBackend& backend_;
  std::string category_;
  bool counted_ = false;  // incremented the profile depth
  cudaEvent_t start_ = nullptr;
};

}  // namespace flux2
