// The backend interface, one model on two backends: every op the FLUX.2 model, the
// Qwen3 text encoder and the VAE decoder need, implemented by kernels/cpu (the float32 reference)
// and kernels/cuda (production). Tested op by op in tests/host/cpu_ops_test.cc and tests/cuda/.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/base/lora_up_term.h"
#include "kernels/base/request_options.h"
#include "kernels/base/tensor.h"

namespace flux2 {

// How a rotary embedding pairs the dimensions of a head.
enum class RopeStyle : uint8_t {
  kInterleaved,  // FLUX.2: pairs (x[2m], x[2m+1]), table repeat-interleaved
  kHalfSplit,    // Qwen3 / HF rotate_half: pairs (x[m], x[m + D/2]), table halves duplicated
};

struct AttentionParams {
  int64_t num_heads = 1;        // query heads H
  int64_t num_kv_heads = 1;     // key/value heads; H % num_kv_heads == 0 (grouped-query attention)
  int64_t head_dim = 128;       // D per head
  float scale = 0.0f;           // softmax scale; usually 1/sqrt(D)
  bool causal = false;          // query i sees keys j <= i
  int64_t num_valid_keys = -1;  // keys at index >= this are masked out (right padding); -1: none
};

// A transformer block's gated residual: stream[M, N] += gate[N] ⊙ update (Backend::swiglu_linear).
struct GatedResidual {
  Tensor stream, gate;
};

// The per-head RMSNorm and rotary embedding in front of an attention (Backend::normed_attention).
struct QkNormRope {
  Tensor q_weight[2], k_weight[2];  // [Dh] each: rows [0, split) use [0], rows [split, S) use [1]
  int64_t split = 0;
  float eps = 0.0f;
  Tensor cos, sin;  // f32 [S, Dh]
  RopeStyle style = RopeStyle::kInterleaved;
};

// LoRA terms on q's and k's columns for Backend::normed_qk, per part of QkNormRope's split: the
// terms' t rows are the part's rows.
struct QkLoraTerms {
  std::vector<LoraUpTerm> q[2], k[2];
};

// `flux2 bench --tune-gemm`: the GEMM plans built so far and the algorithm candidates of each (the
// heuristic's order, 0 its first), so a tuner can time whole steps with each choice in turn.
class GemmCandidates {
 public:
  virtual ~GemmCandidates() = default;
  // Plan keys ("m=4608 n=27648 k=3072 ...") with more than one candidate.
  virtual std::vector<std::string> keys() const = 0;
  virtual int count(const std::string& key) const = 0;
  // The plan runs candidate `index` from now on; `tuned_ms` and `heuristic_ms` are what the tuner
  // measured with it and with candidate 0 (exported with the table).
  virtual absl::Status choose(const std::string& key, int index, double tuned_ms,
                              double heuristic_ms) = 0;
};

// A backend's low-precision copy of a projection weight for quality=high (FP8 on Hopper, NVFP4 on
// Blackwell), made once by Backend::add_fp8_weight and held by the model beside the bf16 values.
class LowPrecisionWeight {
 public:
  virtual ~LowPrecisionWeight() = default;
  // Device bytes the copy adds (0 where it shares a stored FP8 weight's tensors).
  virtual int64_t device_bytes() const = 0;
};

// Keys and values that later attention calls read after their own (klein-KV's cached reference
// rows): made once by Backend::cache_keys, in the backend's layout for the quality of the request
// that made them, and read by Backend::attention_with_cached_keys of that request.
class CachedKeys {
 public:
  virtual ~CachedKeys() = default;
  virtual int64_t rows() const = 0;          // R, the cached keys
  virtual int64_t device_bytes() const = 0;  // bytes the cache holds
};

// The default cache (Backend::cache_keys): copies of the keys and values in the activation dtype.
struct PlainCachedKeys final : CachedKeys {
  Tensor k, v;  // [R, Hkv·Dh]
  int64_t rows() const override { return k.rows(); }
  int64_t device_bytes() const override { return k.bytes() + v.bytes(); }
};

// A projection weight [N, K] as the model holds it: its values and, once the model registered it
// for quality=high, the backend's low-precision copy, which linear, layer_norm_modulate_linear and
// swiglu_linear use instead while a request runs at Quality::kHigh. A plain tensor converts to a
// weight without a copy (and then always runs at the activation precision).
//
// An FP8 checkpoint's weight may instead stay as the file stored it (a stored FP8 weight, the
// --fp8-lossless=per_layer plan): `tensor` holds its E4M3 codes [N, K] and `row_scales` its
// scales, W[r, :] = float(tensor[r, :]) * row_scales[r]; ops that need the values in the weight
// dtype dequantize them into a scratch buffer as they run (Backend::weight_values).
struct Weight {
  Weight() = default;
  Weight(Tensor values) : tensor(std::move(values)) {}  // NOLINT(google-explicit-constructor)
  Tensor tensor;
  Tensor row_scales;  // f32 [N] for a stored FP8 weight; undefined otherwise
  // A stored FP8 weight's static activation scale from its checkpoint (input_scale /
  // scale_input, the largest of a fused target's parts'), if every part has one; what
  // --fp8-input-scale static hands add_stored_fp8_weight.
  std::optional<float> input_scale;
  std::shared_ptr<const LowPrecisionWeight> low_precision;  // null: not registered
  bool stored_fp8() const { return tensor.dtype() == DType::kF8E4M3; }
};

// How `flux2 bench --profile` groups the device time of ops (Backend::set_op_profiling).
enum class OpProfiling : uint8_t {
  kOff,
  kByCategory,  // "gemm", "attention", "norm", "elementwise", "quantize", "conv", "other"
  kByShape,     // the categories split by GEMM shape (M x N x K) and by op name
};

// One copy of Backend::start_copies: contiguous tensors of the same dtype and shape.
struct CopyPair {
  Tensor src, dst;
};

// The copies of one start_copies call, for await_copies (empty where they ran synchronously).
struct CopyTicket {
  std::shared_ptr<void> done;
};

// Device memory as the backend sees it (zeros on the CPU backend).
struct BackendMemoryStats {
  int64_t used_bytes = 0;   // currently allocated by this backend
  int64_t peak_bytes = 0;   // high-water mark since the last reset_peak_memory()
  int64_t total_bytes = 0;  // device capacity
};

// Conventions for every op:
// - Tensors are row-major matrices [rows, cols] (Tensor::rows/cols); inputs and outputs may be
//   strided column slices of wider buffers unless an op says otherwise. Outputs never alias
//   inputs unless an op says "in place".
// - Element math follows the backend's activation dtype: the CPU backend computes in float32;
//   the CUDA backend rounds to bf16 where a PyTorch eager bf16 pipeline rounds (kernels/README.md,
//   "Rounding points").
// - Ops are asynchronous on their backend's stream; download() and synchronize() wait.
// - A precondition failure (shape, dtype, device) returns InvalidArgument and computes nothing.
// The device faults the CUDA backend can provoke for the server's fault-handling tests.
enum class InjectedFault : uint8_t {
  kDeviceOutOfMemory,  // the next allocation asks the driver for more than the device has
  kIllegalAddress,     // a kernel writes to an unmapped address: a sticky error
  kHang,               // a kernel spins for hang_seconds: a step that does not finish
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual absl::string_view name() const = 0;  // "cpu" or "cuda"
  virtual Device device() const = 0;
  virtual DType activation_dtype() const = 0;  // f32 on cpu, bf16 on cuda
  virtual DType weight_dtype() const = 0;      // dtype weights are stored in on this backend

  // ---- memory -------------------------------------------------------------------------------
  // An uninitialised contiguous tensor. Out of memory is ResourceExhausted.
  virtual absl::StatusOr<Tensor> empty(DType dtype, Shape shape) = 0;
  // Copies dst.numel() contiguous host elements of `host_dtype` into `dst`, converting to dst's
  // dtype.
  virtual absl::Status upload(const void* host, DType host_dtype, const Tensor& dst) = 0;
  // Copies `src` into src.numel() contiguous host floats. Waits for pending work.
  virtual absl::Status download(const Tensor& src, float* host) = 0;
  // dst = src (same shape; both may be strided; dtypes may differ).
  virtual absl::Status copy(const Tensor& src, const Tensor& dst) = 0;
  // Waits for all work issued so far.
  virtual absl::Status synchronize() = 0;
  // Fills a contiguous tensor with reproducible uniform values in [-scale, scale] drawn from a
  // counter-based hash of (seed, index): random weights for benchmarks and tests.
  virtual absl::Status fill_uniform(const Tensor& t, uint64_t seed, float scale) = 0;
  // Runs work(0), ..., work(count - 1) back to back and returns each one's device time in
  // milliseconds: CUDA events between them on the GPU, with no host wait in between (the host
  // enqueues ahead, as in a denoising loop); a host clock with synchronize() after each on the
  // CPU. For benchmarks; `work` must only enqueue backend ops.
  virtual absl::StatusOr<std::vector<double>> time_each_ms(
      int64_t count, const std::function<absl::Status(int64_t)>& work);
  // One piece of work, timed alone (synchronized before and after).
  absl::StatusOr<double> time_ms(const std::function<absl::Status()>& work);
  virtual BackendMemoryStats memory_stats() const { return {}; }
  virtual void reset_peak_memory() {}
  // Op profiling for `flux2 bench --profile`: while on, the device time of every op is summed by
  // category (or by shape: OpProfiling); take_op_profile() waits for the device, returns the sums
  // in milliseconds and clears them.
  virtual void set_op_profiling(OpProfiling mode) {}
  virtual std::map<std::string, double> take_op_profile() { return {}; }
  // GEMM plans so far: how many, how many took the tuned table's algorithm, how many
  // --gemm-autotune timed (all 0 where there are no plans: the CPU).
  virtual std::map<std::string, int64_t> gemm_plan_stats() const { return {}; }
  // `flux2 bench --tune-gemm`: `existing` (a --gemm-algorithms JSON document, "" for none) with the
  // algorithm of every plan so far that was timed or came from the table added under this
  // device's section. Unimplemented where GEMMs have no algorithm choice (the CPU).
  virtual absl::StatusOr<std::string> export_gemm_algorithms(std::string_view existing) {
    return absl::UnimplementedError(std::string(name()) + " backend has no GEMM algorithms");
  }
  // The GEMM plans' candidates (null where GEMMs have no algorithm choice: the CPU).
  virtual GemmCandidates* gemm_candidates() { return nullptr; }
  // quality=high: the low-precision copy of projection weight `w` [N, K] that the model keeps in
  // Weight::low_precision. Unimplemented without a low-precision path.
  virtual absl::StatusOr<std::shared_ptr<const LowPrecisionWeight>> add_fp8_weight(
      const Tensor& w) {
    return absl::UnimplementedError(std::string(name()) +
                                    " backend has no FP8 path for quality=high");
  }
  // quality=high on an FP8 checkpoint: the low-precision weight made from the file's own E4M3
  // codes `values` [N, K] and f32 `row_scales` [N] (a stored FP8 weight), without quantizing
  // again where the backend's GEMM takes per-channel scales (the CUDA backend then shares both
  // tensors: no extra bytes). With `input_scale` (finite, > 0; --fp8-input-scale static) every
  // GEMM of the weight quantizes its activation per tensor under that static scale, codes
  // fp8_quantize_static_value(x, input_scale) (kernels/base/fp8_nvfp4.h) and the GEMM's activation
  // scale input_scale, in every op that feeds it (linear and the fused producers); without it,
  // per token as for any registered weight. InvalidArgument where the backend's low-precision GEMM
  // takes no such scale (NVFP4); Unimplemented without a low-precision path.
  virtual absl::StatusOr<std::shared_ptr<const LowPrecisionWeight>> add_stored_fp8_weight(
      const Tensor& values, const Tensor& row_scales, std::optional<float> input_scale) {
    return absl::UnimplementedError(std::string(name()) +
                                    " backend has no FP8 path for quality=high");
  }
  // out[N, K] (the weight dtype, contiguous) = float(values[r, c]) * row_scales[r] in f32, rounded
  // once to out's dtype: the value the loader's host dequantization (dequantize_fp8 + upload)
  // gives, bit for bit. `values` E4M3 [N, K] contiguous, `row_scales` f32 [N].
  virtual absl::Status dequantize_e4m3_rows(const Tensor& values, const Tensor& row_scales,
                                            const Tensor& out) = 0;
  // The values of `w` in the weight dtype: w.tensor itself, or for a stored FP8 weight a scratch
  // copy dequantized now (stream-ordered; freed when the returned tensor dies).
  absl::StatusOr<Tensor> weight_values(const Weight& w);
  // ---- host-resident weights (a memory plan for GPUs smaller than the model) ----------------
  // An uninitialised contiguous tensor in host memory that upload() fills and start_copies()
  // reads asynchronously: page-locked on CUDA (Device::kCpu there, so no other op takes it); on the
  // CPU backend an ordinary tensor. Out of memory is ResourceExhausted. Thread-safe: it touches
  // no state of the backend's (the LoRA registry calls it on request threads).
  virtual absl::StatusOr<Tensor> empty_host(DType dtype, Shape shape) {
    return empty(dtype, std::move(shape));
  }
  // Copies each src into its dst once all work issued so far is done (so a dst may still be read
  // by that work), on a copy stream beside the compute stream where the backend has one, and
  // returns without waiting; work issued after await_copies(ticket) sees them complete. The
  // default copies at once (the CPU backend, where ops run synchronously).
  virtual absl::StatusOr<CopyTicket> start_copies(const std::vector<CopyPair>& copies);
  virtual absl::Status await_copies(const CopyTicket& ticket) { return absl::OkStatus(); }
  // Device memory not allocated by anyone (cudaMemGetInfo), for start-up plans; -1 where the
  // backend has no separate device memory (CPU).
  virtual int64_t free_device_bytes() const { return -1; }
  // The device's PCI bus id ("0000:19:00.0", cudaDeviceGetPCIBusId), which names the same GPU to
  // NVML whatever CUDA_VISIBLE_DEVICES renumbers; empty without a device (CPU).
  virtual std::string device_pci_bus_id() const { return ""; }

  // ---- faults ----------------------------------------------------------------------------------
  // Whether the device still works: non-OK when an error broke it for good (a sticky CUDA error
  // such as an illegal address: every later call fails, only a new process recovers). Called
  // after a failed request; it waits for the device. OK on the CPU.
  virtual absl::Status device_status() { return absl::OkStatus(); }
  // TEST ONLY (flux2_server --test-inject-fault): provokes `fault` on the backend's stream, ahead
  // of the work issued next (InjectedFault). Unimplemented where the backend cannot (the CPU).
  virtual absl::Status inject_fault(InjectedFault fault, double hang_seconds) {
    return absl::UnimplementedError(std::string(name()) + " backend cannot inject device faults");
  }

  // The options of the request running now (RequestScope); defaults outside any request.
  const RequestOptions& request() const { return request_; }

  // ---- dense layers -------------------------------------------------------------------------
  // y[M, N] = x[M, K] · w[N, K]ᵀ (+ bias[N] when bias is defined).
  virtual absl::Status linear(const Tensor& x, const Weight& w, const Tensor& bias,
                              const Tensor& y) = 0;
  // The LoRA A products of one input for several stacks at once (an adapter's A rows on one fused
  // weight each): t[M, R] = x[M, K] · [a_0; a_1; ...]ᵀ, stack i [r_i, K] in the columns after
  // stack i-1's, R = the sum of r_i; each product's fp32 sum rounded once to t's dtype, in the
  // backend's order. The default runs one linear per stack into its columns.
  virtual absl::Status lora_down(const Tensor& x, const std::vector<Tensor>& stacks,
                                 const Tensor& t);

  // In place on y[M, N], each term in order: y = round(y + round(round(t · bᵀ) · scale)) on the
  // term's columns, round: to the activation dtype (PEFT's LoRA `result + lora_B(t) * scaling`,
  // t = lora_A(x), one adapter after another). One op for the B products and their adds, so y is
  // read and written once; each product's fp32 sum is in the backend's order.
  virtual absl::Status lora_up_add(const Tensor& y, const std::vector<LoraUpTerm>& terms) = 0;
  // The LoRA terms on a SwiGLU's input, then the SwiGLU: out[M, F] = swiglu(y'[:, :F], y'[:, F:])
  // with y' = y after lora_up_add(y, terms). The default runs the two ops; a backend may do both
  // in one pass without writing y', so callers must not read y after.
  virtual absl::Status lora_up_swiglu(const Tensor& y, const std::vector<LoraUpTerm>& terms,
                                      const Tensor& out);
  // The LoRA terms on a block's output, then its gated residual: x += gate ⊙ y' with y' = y after
  // lora_up_add(y, terms). The default runs the two ops; a backend may do both in one pass without
  // writing y', so callers must not read y after.
  virtual absl::Status lora_up_gate_residual(const Tensor& y, const std::vector<LoraUpTerm>& terms,
                                             const Tensor& x, const Tensor& gate);
  // The LoRA terms on q's or k's columns, then their QK-norm and RoPE: in place on x [S, H·Dh],
  // lora_up_add(x, terms) then qk_norm_rope(x, ...). The default runs the two ops; a backend may do
  // both in one pass (x read and written once).
  virtual absl::Status lora_up_qk_norm_rope(const Tensor& x, const std::vector<LoraUpTerm>& terms,
                                            int64_t head_dim, const Tensor& norm_weight, float eps,
                                            const Tensor& cos, const Tensor& sin, RopeStyle style);

  // ---- element-wise -------------------------------------------------------------------------
  virtual absl::Status silu(const Tensor& x, const Tensor& out) = 0;                  // x·σ(x)
  virtual absl::Status add(const Tensor& a, const Tensor& b, const Tensor& out) = 0;  // a + b
  // out = a − b; out may be a or b (element by element, each read before it is written).
  virtual absl::Status sub(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // mean|a − b| / mean|a| over all elements of a and b (same shape), as a float32 scalar on the
  // host (cache-dit's relative L1 distance; model/step_cache.h): the sums in float32-or-wider in
  // a fixed order (deterministic for a shape), the quotient in float32. Waits for the device
  // (one scalar read back). An all-zero `a` gives +inf (or NaN when b is zero too).
  virtual absl::StatusOr<float> mean_abs_diff_ratio(const Tensor& a, const Tensor& b) = 0;
  // In place: x[M, D] += gate[D] ⊙ update[M, D] (gate broadcast over rows).
  virtual absl::Status gate_residual(const Tensor& x, const Tensor& gate, const Tensor& update) = 0;
  // out[M, F] = silu(gate[M, F]) ⊙ up[M, F].
  virtual absl::Status swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;
  // y = x · wᵀ where x [M, P + F] ends with act = swiglu(gate, up) (its first P columns, e.g. the
  // single block's attention output, are read as they are). With `residual`, the block's gated
  // residual follows: gate_residual(residual->stream, residual->gate, y). The default writes act,
  // runs linear (and gate_residual); a backend may feed the GEMM without writing act (quality=high
  // on CUDA), and with `residual` add into the stream without writing y, so callers must not read
  // act (or y) after.
  virtual absl::Status swiglu_linear(const Tensor& gate, const Tensor& up, const Tensor& x,
                                     const Weight& w, const Tensor& y,
                                     const GatedResidual* residual);

  // ---- normalisation ------------------------------------------------------------------------
  // out = (1 + scale) ⊙ LayerNorm(x) + shift; LayerNorm over the last dim without affine.
  // shift and scale are [D] (one row), broadcast over the rows of x [M, D].
  virtual absl::Status layer_norm_modulate(const Tensor& x, const Tensor& shift,
                                           const Tensor& scale, float eps, const Tensor& out) = 0;
  // y = layer_norm_modulate(x, shift, scale) · wᵀ, the normalised activation in `normed` (x's
  // shape). The default runs the two ops; a backend may feed the GEMM without writing normed
  // (quality=high on CUDA), so callers must not read normed after.
  virtual absl::Status layer_norm_modulate_linear(const Tensor& x, const Tensor& shift,
                                                  const Tensor& scale, float eps,
                                                  const Tensor& normed, const Weight& w,
                                                  const Tensor& y);
  // The same with `normed` written for callers that read it after (LoRA's A products). The
  // default runs the two ops; a backend may write normed and the GEMM's input in one pass
  // (quality=high on CUDA: the bf16 rows and the E4M3 rows).
  virtual absl::Status layer_norm_modulate_linear_keeping_normed(const Tensor& x,
                                                                 const Tensor& shift,
                                                                 const Tensor& scale, float eps,
                                                                 const Tensor& normed,
                                                                 const Weight& w, const Tensor& y);
  // out = RMSNorm(x) ⊙ weight over the last dim; weight [D].
  virtual absl::Status rms_norm(const Tensor& x, const Tensor& weight, float eps,
                                const Tensor& out) = 0;
  // In place on x [S, H·Dh] (Dh = head_dim): RMSNorm of each head with weight [Dh], then the
  // rotary embedding out = x·cos + rot(x)·sin with f32 tables cos, sin [S, Dh].
  virtual absl::Status qk_norm_rope(const Tensor& x, int64_t head_dim, const Tensor& norm_weight,
                                    float eps, const Tensor& cos, const Tensor& sin,
                                    RopeStyle style) = 0;
  // In place on x [S, H·Dh]: the rotary embedding alone (qk_norm_rope without the norm), for text
  // encoders without q/k RMSNorm (Mistral).
  virtual absl::Status rope(const Tensor& x, int64_t head_dim, const Tensor& cos, const Tensor& sin,
                            RopeStyle style) = 0;
  // GroupNorm of x [P, C] (P pixels, NHWC) with `groups` channel groups, affine gamma/beta [C],
  // then SiLU when `silu` is set.
  virtual absl::Status group_norm(const Tensor& x, int64_t groups, const Tensor& gamma,
                                  const Tensor& beta, float eps, bool silu, const Tensor& out) = 0;

  // ---- attention ----------------------------------------------------------------------------
  // out [S_q, H·Dh] = softmax(q kᵀ · scale + mask) v per head; q [S_q, H·Dh], k and v [S_k,
  // Hkv·Dh].
  virtual absl::Status attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const AttentionParams& params, const Tensor& out) = 0;
  // A cache of k and v [R, Hkv·Dh] (post-RoPE keys and their values) for
  // attention_with_cached_keys with `params` in this request: the default keeps copies in the
  // activation dtype (PlainCachedKeys); the CUDA backend at quality=high keeps its FP8 attention's
  // operands instead, quantized here once. Stream-ordered: k and v may be overwritten after.
  virtual absl::StatusOr<std::shared_ptr<const CachedKeys>> cache_keys(
      const Tensor& k, const Tensor& v, const AttentionParams& params);
  // out [S_q, H·Dh] = attention of q over two key segments, the call's own k and v [S, Hkv·Dh]
  // and then the R cached rows: softmax over [k ; cached k], weights on [v ; cached v]
  // (klein-KV's cached forwards: the text and image keys, then the references'). k and v must be
  // the first S rows of k_room and v_room [S + R, Hkv·Dh], whose last R rows are scratch: a
  // backend that attends over one concatenated sequence (the default) copies the cache there, so
  // the call's own rows are never copied. At quality=high each segment is quantized on its own,
  // per head and 128 keys from its first row (kernels/base/fp8_attention_keys.h).
  virtual absl::Status attention_with_cached_keys(const Tensor& q, const Tensor& k, const Tensor& v,
                                                  const CachedKeys& cached, const Tensor& k_room,
                                                  const Tensor& v_room,
                                                  const AttentionParams& params, const Tensor& out);
  // In place: QkNormRope's per-head RMSNorm and RoPE on q and k (rows [0, split) with the first
  // weights, the rest with the second); normed_attention's first half, for callers that attend
  // to other keys too (klein-KV's cached reference keys).
  // With `lora`, each part's LoRA terms are added first (lora_up_qk_norm_rope).
  absl::Status normed_qk(const Tensor& q, const Tensor& k, const QkNormRope& norm, int64_t head_dim,
                         const QkLoraTerms* lora = nullptr);
  // FLUX.2's attention with its QK-norm and RoPE in front: qk_norm_rope on q and on k (rows
  // [0, split) with the first weights, the rest with the second: the text and image streams of a
  // double block), then attention. The default is those ops in turn; a backend may fuse the norms
  // into its attention, and q and k then keep their values (callers must not read them after).
  virtual absl::Status normed_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const QkNormRope& norm, const AttentionParams& params,
                                        const Tensor& out);

  // ---- images -------------------------------------------------------------------------------
  // NHWC convolution, stride 1, zero padding kh/2: x [H, W, Cin], w [Cout, kh, kw, Cin],
  // bias [Cout], out [H, W, Cout]. kh == kw, odd.
  virtual absl::Status conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                              const Tensor& out) = 0;
  // out = residual + conv2d(x, w, bias): a resnet's convolution and its shortcut add. By default
  // the two ops (PyTorch's roundings); the CUDA backend adds the bias and the shortcut in one pass
  // (the same roundings) and at quality=high in cuDNN's epilogue. out must not alias x or residual.
  virtual absl::Status conv2d_add(const Tensor& x, const Tensor& w, const Tensor& bias,
                                  const Tensor& residual, const Tensor& out) {
    if (absl::Status status = conv2d(x, w, bias, out); !status.ok()) return status;
    return add(residual, out, out);
  }
  // diffusers' Downsample2D (padding 0): x [H, W, Cin] (H, W even) zero-padded by one row at the
  // bottom and one column at the right, then a 3x3 convolution with stride 2 and bias:
  // out [H/2, W/2, Cout], w [Cout, 3, 3, Cin].
  virtual absl::Status conv2d_downsample(const Tensor& x, const Tensor& w, const Tensor& bias,
                                         const Tensor& out) = 0;
  // out [2H, 2W, C] = nearest-neighbour ×2 of x [H, W, C].
  virtual absl::Status upsample_nearest_2x(const Tensor& x, const Tensor& out) = 0;
  // Packed latent tokens [h·w, 4C] (token = row·w + col, channel = c·4 + dy·2 + dx) →
  // BatchNorm de-normalisation z·sqrt(var + eps) + mean (mean, var [4C]) → unpatchify →
  // out [2h, 2w, C] NHWC (diffusers' FLUX.2 decode path).
  virtual absl::Status latent_unpack(const Tensor& tokens, const Tensor& bn_mean,
                                     const Tensor& bn_var, float eps, const Tensor& out) = 0;
  // The inverse, for the editing pipeline's reference latents: the first C = tokens.cols() / 4
  // channels of x [2h, 2w, Cx] (the posterior's mean of mean | logvar) → patchify 2x2 →
  // BatchNorm normalisation (z − mean) / sqrt(var + eps) → tokens [h·w, 4C] (same channel order).
  virtual absl::Status latent_pack(const Tensor& x, const Tensor& bn_mean, const Tensor& bn_var,
                                   float eps, const Tensor& tokens) = 0;

  // diffusers' pre-processing of a reference image: image [H, W, 3] (the activation dtype,
  // contiguous) = the H·W·3 host bytes `host` as 2·(v / 255) − 1, each op in f32 (numpy's float32
  // division, then VaeImageProcessor.normalize), rounded once to the dtype. The bytes go to the
  // device as they are (a quarter of the f32 values' transfer) and are scaled there.
  virtual absl::Status from_rgb8(const uint8_t* host, const Tensor& image) = 0;
  // diffusers' post-processing of an image [H, W, 3] in about [-1, 1] into H·W·3 host bytes:
  // round(clamp(x / 2 + 0.5, 0, 1) · 255), the first two ops in the activation dtype (bf16 ops on
  // the CUDA backend, as a bf16 pipeline does them). Waits for pending work.
  virtual absl::Status to_rgb8(const Tensor& image, uint8_t* host) = 0;

  // ---- sampling -----------------------------------------------------------------------------
  // In place: x += dt · v (flow-matching Euler step; x is the latent, v the velocity).
  virtual absl::Status euler_step(const Tensor& x, const Tensor& v, float dt) = 0;
  // out = uncond + scale · (cond − uncond) (classifier-free guidance).
  virtual absl::Status cfg_combine(const Tensor& uncond, const Tensor& cond, float scale,
                                   const Tensor& out) = 0;

 private:
  friend class RequestScope;
  RequestOptions request_;
};

// attention_with_cached_keys' layout: k and v [S, ·] the first rows of k_room and v_room, which
// are R = cached.rows() rows longer with the same columns. InvalidArgument naming what differs.
absl::Status check_cached_keys_layout(const Tensor& k, const Tensor& v, const CachedKeys& cached,
                                      const Tensor& k_room, const Tensor& v_room);

// The options one request runs under: set on `backend` for the scope's lifetime, then the previous
// ones come back (a nested scope, such as the text encoder's lossless one inside a quality=high
// request, restores its request's). Create one per request; the backend serves one thread at a
// time, so no two requests can see each other's options.
class RequestScope {
 public:
  RequestScope(Backend& backend, const RequestOptions& options)
      : backend_(backend), previous_(backend.request_) {
    backend_.request_ = options;
  }
  ~RequestScope() { backend_.request_ = previous_; }
  RequestScope(const RequestScope&) = delete;
  RequestScope& operator=(const RequestScope&) = delete;

 private:
  Backend& backend_;
  RequestOptions previous_;
};

}  // namespace flux2
