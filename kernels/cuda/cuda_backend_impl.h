// CudaBackend's class declaration, shared by cuda_backend.cc (construction, memory, transfers)
// and cuda_ops.cc (compute ops and fast-path dispatch). Internal to kernels/cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/base/fast_path_registry.h"
#include "kernels/cuda/cudnn_conv.h"
#include "kernels/cuda/cudnn_sdpa.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kernel_args.h"

namespace flux2 {

// Keeps the stream alive for every tensor's deleter (frees are stream-ordered).
struct CudaStream {
  cudaStream_t stream = nullptr;
  ~CudaStream();
};

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> create();
  ~CudaBackend() override;

  absl::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }
  DType activation_dtype() const override { return DType::kBF16; }
  DType weight_dtype() const override { return DType::kBF16; }
  cudaStream_t stream() const { return stream_->stream; }

  absl::StatusOr<Tensor> empty(DType dtype, Shape shape) override;
  absl::Status upload(const void* host, DType host_dtype, const Tensor& dst) override;
  absl::Status download(const Tensor& src, float* host) override;
  absl::Status copy(const Tensor& src, const Tensor& dst) override;
  absl::Status synchronize() override;
  absl::Status fill_uniform(const Tensor& t, uint64_t seed, float scale) override;
  absl::StatusOr<std::vector<double>> time_each_ms(
      int64_t count, const std::function<absl::Status(int64_t)>& work) override;
  BackendMemoryStats memory_stats() const override;
  void reset_peak_memory() override;
  void set_fast_paths(bool enabled) override { fast_paths_ = enabled; }
  void set_op_profiling(bool enabled) override { profiling_ = enabled; }
  absl::StatusOr<int64_t> add_fp8_weight(const Tensor& w) override;
  // Whether quality=high's FP8 GEMMs scale per token and channel (else per tensor).
  bool fp8_rowwise() const { return fp8_rowwise_; }
  void set_quality(Quality quality) override { quality_ = quality; }
  std::map<std::string, double> take_op_profile() override;

  absl::Status linear(const Tensor& x, const Tensor& w, const Tensor& bias,
                      const Tensor& y) override;
  absl::Status embedding(const Tensor& ids, const Tensor& table, const Tensor& out) override;
  absl::Status silu(const Tensor& x, const Tensor& out) override;
  absl::Status add(const Tensor& a, const Tensor& b, const Tensor& out) override;
  absl::Status gate_residual(const Tensor& x, const Tensor& gate, const Tensor& update) override;
  absl::Status swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  absl::Status swiglu_linear(const Tensor& gate, const Tensor& up, const Tensor& x, const Tensor& w,
                             const Tensor& y, const GatedResidual* residual) override;
  absl::Status layer_norm_modulate(const Tensor& x, const Tensor& shift, const Tensor& scale,
                                   float eps, const Tensor& out) override;
  absl::Status layer_norm_modulate_linear(const Tensor& x, const Tensor& shift, const Tensor& scale,
                                          float eps, const Tensor& normed, const Tensor& w,
                                          const Tensor& y) override;
  absl::Status rms_norm(const Tensor& x, const Tensor& weight, float eps,
                        const Tensor& out) override;
  absl::Status qk_norm_rope(const Tensor& x, int64_t head_dim, const Tensor& norm_weight, float eps,
                            const Tensor& cos, const Tensor& sin, RopeStyle style) override;
  absl::Status group_norm(const Tensor& x, int64_t groups, const Tensor& gamma, const Tensor& beta,
                          float eps, bool silu, const Tensor& out) override;
  absl::Status attention(const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionParams& params, const Tensor& out) override;
  absl::Status normed_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                const QkNormRope& norm, const AttentionParams& params,
                                const Tensor& out) override;
  absl::Status conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                      const Tensor& out) override;
  absl::Status conv2d_add(const Tensor& x, const Tensor& w, const Tensor& bias,
                          const Tensor& residual, const Tensor& out) override;
  absl::Status upsample_nearest_2x(const Tensor& x, const Tensor& out) override;
  absl::Status latent_unpack(const Tensor& tokens, const Tensor& bn_mean, const Tensor& bn_var,
                             float eps, const Tensor& out) override;
  absl::Status to_rgb8(const Tensor& image, uint8_t* host) override;
  absl::Status euler_step(const Tensor& x, const Tensor& v, float dt) override;
  absl::Status cfg_combine(const Tensor& uncond, const Tensor& cond, float scale,
                           const Tensor& out) override;

 private:
  friend class OpProfileScope;
  CudaBackend() = default;

  // Runs `fused` for fast path `path` unless fast paths are off, the path is disabled or
  // `unsupported` names a failed precondition — then `eager`, counting the fallback reason. A
  // fused launch error disables the path and falls back, except during graph capture.
  template <typename Fused, typename Eager>
  absl::Status run_fast_path(FastPath& path, absl::string_view unsupported, Fused fused,
                             Eager eager);
  // The same rule without the request switch, for library paths whose fallback is not an eager
  // chain with identical bits (cuDNN attention, FP8 GEMMs at quality=high).
  template <typename Fast, typename Fallback>
  absl::Status run_path(FastPath& path, absl::string_view unsupported, Fast fast,
                        Fallback fallback);
  // conv2d's operand checks; the convolution with its bias (and residual) fused, else `separate`.
  absl::Status check_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                            const Tensor& out) const;
  // The convolution with PyTorch's separate bias add.
  absl::Status conv_unfused(const Tensor& x, const Tensor& w, const Tensor& bias,
                            const Tensor& out);
  template <typename Separate>
  absl::Status conv2d_fused(const Tensor& x, const Tensor& w, const Tensor& bias,
                            const Tensor* residual, const Tensor& out, Separate separate);
  // Runs into(target) for an output that may be a column range of a wider buffer: straight into
  // it (the token_concat fast path) or into a separate buffer then copied (its eager chain).
  template <typename Into>
  absl::Status write_output(const Tensor& out, Into into);
  // A scratch tensor for eager chains (stream-ordered, freed when the returned tensor dies).
  absl::StatusOr<Tensor> scratch(Shape shape, DType dtype = DType::kBF16);
  bool capturing() const;
  // quality=high: Q, K and V quantized to E4M3 per head and 128 tokens (V transposed; with `norm`,
  // QK-norm and RoPE on the way), then our FP8 flash attention straight into the bf16 output.
  // `row_amax` receives the output's row maxima when a hand-off is wanted (else stays empty).
  absl::Status attention_flash_fp8(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionParams& params, const QkNormRope* norm,
                                   const cuda::Mat& out, Tensor* row_amax);
  // quality=high: the attention output's row maxima handed to the op that reads it next (those
  // the kernel wrote, else a pass over the output).
  absl::Status hand_off_attention_output(const Tensor& out, const AttentionParams& params,
                                         Tensor row_amax_from_kernel = {});
  // Attention for one wide head (the VAE mid block, head_dim 512): Q·Kᵀ, row softmax, P·V.
  absl::Status attention_by_gemms(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                                  const cuda::Mat& out);

  std::shared_ptr<CudaStream> stream_;
  std::unique_ptr<cuda::Gemm> gemm_;
  std::unique_ptr<cuda::CudnnSdpa> sdpa_;
  // Our FP8 flash attention at quality=high (flash_attention_fp8.h): on unless FLUX2_FLASH_FP8=0.
  bool flash_fp8_attention_ = true;
  std::unique_ptr<cuda::CudnnConv> conv_;
  void* staging_[2] = {nullptr, nullptr};  // pinned host buffers for transfers
  cudaEvent_t staging_done_[2] = {nullptr, nullptr};
  int64_t total_bytes_ = 0;
  bool fast_paths_ = true;
  Quality quality_ = Quality::kLossless;
  // quality=high: FP8 copies of weights by the bf16 weight's address.
  struct Fp8Weight {
    Tensor source;  // the bf16 weight, kept alive so its address cannot be reused by another tensor
    Tensor values;  // E4M3 [N, K], or packed E2M1 [N, K / 2] bytes on the NVFP4 path
    Tensor scale;   // FP8: f32 [N] per output channel (rowwise) or [1] per tensor (amax / 448);
                    // NVFP4: UE4M3 block scales, 128x4 swizzled
    Tensor global;  // NVFP4 only: f32 [1] global encode scale
  };
  // Rowwise FP8 (per-token activation, per-channel weight scales) when cuBLASLt offers it on this
  // device, unless FLUX2_FP8_ROWWISE=0: LayerNorm+modulate and SwiGLU write the E4M3 rows of the
  // GEMM after them; else per-tensor scales with row-maxima hand-offs.
  bool fp8_rowwise_ = false;
  // Blackwell (compute capability >= 10.0) with cuBLASLt's block-scaled FP4 GEMM: quality=high
  // uses NVFP4 instead of FP8 there (kernels.md §1.8). Never on the H200.
  bool nvfp4_ = false;
  std::map<const void*, Fp8Weight> fp8_weights_;
  // The activation (or, at registration, the weight) in the backend's low-precision format.
  absl::StatusOr<Fp8Weight> quantize_low_precision(const Tensor& x);
  // Whether the op profile splits its categories (profiling, with FLUX2_PROFILE_GEMM_SHAPES set).
  bool profile_split() const;
  // An op's profile category, split by op name under FLUX2_PROFILE_GEMM_SHAPES.
  std::string op_category(absl::string_view category, absl::string_view op) const;
  // A GEMM's profile category ("gemm", "quantize"), split by shape under FLUX2_PROFILE_GEMM_SHAPES.
  std::string profile_category(absl::string_view category, const Tensor& x, const Tensor& w) const;
  // y = x · wᵀ through the FP8 (or, on Blackwell, NVFP4) GEMM.
  absl::Status linear_low_precision(const Tensor& x, const Fp8Weight& w, const Tensor& y);
  // The GEMM of linear_low_precision on x's quantized copy xq.
  absl::Status gemm_low_precision(const Tensor& x, const Fp8Weight& xq, const Fp8Weight& w,
                                  const Tensor& y);
  // layer_norm_modulate_linear with rowwise FP8: the norm writes only x's E4M3 rows, then the GEMM.
  absl::Status layer_norm_linear_fp8(const Tensor& x, const Tensor& shift, const Tensor& scale,
                                     float eps, const Fp8Weight& w, const Tensor& y);
  // swiglu_linear with rowwise FP8: one kernel writes x's E4M3 rows ([prefix | swiglu(gate, up)],
  // a scale per row) without the bf16 activation, then the GEMM; with `residual` the GEMM adds
  // gate ⊙ (x · wᵀ) into the stream itself (the gate folded into the per-channel scales, beta = 1).
  absl::Status swiglu_linear_fp8(const Tensor& gate, const Tensor& up, const Tensor& x,
                                 const Fp8Weight& w, const Tensor& y,
                                 const GatedResidual* residual);
  // quality=high hand-off with per-tensor FP8 GEMMs: the op that wrote a bf16 activation also left
  // each row's max |x| (SwiGLU, attention) or an E4M3 copy with its scale (LayerNorm+modulate); an
  // FP8 GEMM that reads exactly that region (or a row range of it) next skips the quantizer's amax
  // pass (bit-identical) or the whole quantization. It lives from the end of the producer to the
  // start of the next op, and through linears that consumed it (the double block's image and text
  // GEMMs read two row ranges of one output).
  struct AmaxHandoff {
    const char* data = nullptr;  // the region's first element
    int64_t rows = 0, cols = 0, stride = 0;
    Tensor row_amax;        // u32 [rows]: f32 magnitude bits of max |x| per row, or
    Tensor fp8, fp8_scale;  // the region already in E4M3 [rows, cols] with its scale [1]
  };
  std::optional<AmaxHandoff> handoff_;   // left by the op that finished last
  std::optional<AmaxHandoff> incoming_;  // what the running (outermost) op found
  int op_depth_ = 0;                     // ops called by ops see their caller's hand-off
  // The SiLU inside SwiGLU and the VAE's GroupNorm: SiluMath::kFast at quality=high.
  cuda::SiluMath silu_math() const {
    return quality_ == Quality::kHigh ? cuda::SiluMath::kFast : cuda::SiluMath::kExact;
  }
  // Whether quality=high ops produce and consume hand-offs of row maxima (per-tensor FP8 GEMMs).
  bool handoff_wanted() const { return quality_ == Quality::kHigh && !nvfp4_ && !fp8_rowwise_; }
  // Whether the fused producer ops (layer_norm_modulate_linear, swiglu_linear) write their GEMM's
  // E4M3 rows with a scale per row instead (rowwise FP8 GEMMs, the default).
  bool fp8_rows_wanted() const { return quality_ == Quality::kHigh && !nvfp4_ && fp8_rowwise_; }
  // Leaves `out` with its row maxima (or its E4M3 copy and scale) for the next op.
  void hand_off(const Tensor& out, Tensor row_amax, Tensor fp8 = {}, Tensor fp8_scale = {});
  // The first row of x within the incoming hand-off's region when x is a row range of it.
  std::optional<int64_t> incoming_rows(const Tensor& x) const;
  bool profiling_ = false;
  int profile_depth_ = 0;  // ops called by ops are timed once, by the outermost
  struct ProfiledOp {
    std::string category;
    cudaEvent_t start, stop;
  };
  std::vector<ProfiledOp> profiled_;
};

// Opened first by every op: the outermost one takes over the hand-off the previous op left
// (CudaBackend::incoming_). Times the op when profiling is on and `category` is not empty
// (events on the backend's stream); nested timed scopes are counted once, by the outermost.
class OpProfileScope {
 public:
  OpProfileScope(CudaBackend& backend, std::string category);
  ~OpProfileScope();

 private:
  CudaBackend& backend_;
  std::string category_;
  bool counted_ = false;  // incremented the profile depth
  cudaEvent_t start_ = nullptr;
};

// A tensor as a launcher matrix.
inline cuda::Mat mat(const Tensor& t) {
  return cuda::Mat{t.data(), t.rows(), t.cols(), t.row_stride()};
}

}  // namespace flux2
