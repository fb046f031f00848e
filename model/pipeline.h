// Pipeline: prompt -> PNG-ready pixels for a FLUX.2 checkpoint directory (klein: Flux2KleinPipeline
// and Flux2KleinKVPipeline; dev: Flux2Pipeline; architecture §2): tokenize, encode text (cached
// per prompt), draw diffusers-compatible noise, run N Euler steps (CFG against the negative prompt
// for klein base, embedded guidance for dev), decode with the VAE. The engine API server/ calls;
// one pipeline per backend, used by one thread at a time. Tested by `flux2 check-golden --only
// pipeline`, tests/host/pipeline_test.cc and the server end-to-end tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/cfg_parallel.h"
#include "model/field_violation.h"
#include "model/flux2_transformer.h"
#include "model/fp8_input_scale.h"
#include "model/lora_device_cache.h"
#include "model/memory_plan.h"
#include "model/model_limits.h"
#include "model/prompt_cache.h"
#include "model/reference_image.h"
#include "model/scheduler.h"
#include "model/step_cache.h"
#include "model/text_encoder.h"
#include "model/tokenizer.h"
#include "model/vae_decoder.h"
#include "model/vae_encoder.h"

namespace flux2 {

// How quality=lossless runs an FP8 checkpoint's quantized block projections (--fp8-lossless; a
// bf16 checkpoint is unaffected). Both give the same bits: the bf16 (CPU: f32) values
// float(W8) * scale, as diffusers on the dequantized weights.
enum class Fp8Lossless : uint8_t {
  kResident,  // "resident": their dequantized values stay on the device beside nothing else
              // (quality=high adds the file's FP8 codes): lossless runs at bf16 speed
  kPerLayer,  // "per_layer": only the file's FP8 codes and scales stay on the device (quality=high
              // runs on them directly); each lossless GEMM dequantizes its weight into a
              // scratch buffer first: about half the transformer's bytes, a dequantization per GEMM
};
// "resident" / "per_layer"; parse_fp8_lossless reads them back (InvalidArgument naming the flag).
absl::string_view fp8_lossless_name(Fp8Lossless mode);
absl::StatusOr<Fp8Lossless> parse_fp8_lossless(absl::string_view text);

// One component's weights as loaded, for GetModelInfo and the start-up log.
struct ComponentInfo {
  std::string name;    // "text_encoder", "transformer", "vae", "fp8_weights"
  std::string format;  // how its checkpoint stores it (TransformerCheckpoint::format, ...)
  int64_t device_bytes = 0;
  int64_t host_bytes = 0;        // page-locked host memory (the text encoder's embedding, ...)
  int64_t checkpoint_bytes = 0;  // its weights as the checkpoint stores them (0: not from a file)
};

// Everything about the loaded model that callers (GetModelInfo, validation) need.
struct PipelineInfo {
  std::string model_dir;
  std::string model_name;      // directory name, e.g. "FLUX.2-klein-4B"
  std::string pipeline_class;  // model_index.json _class_name
  std::string variant;         // "klein-distilled", "klein-base", "klein-kv", "dev"
  bool is_distilled = true;    // distilled: no CFG
  bool uses_cfg = false;       // base models: true CFG against the negative prompt
  // dev: guidance_scale enters the transformer through its guidance embedder (one call per step).
  bool guidance_embedded = false;
  // klein-KV (Flux2KleinKVPipeline): step 0 caches the reference tokens' K/V of every layer and
  // later steps attend to the cache instead of running the references again.
  bool uses_kv_cache = false;
  int64_t default_steps = 4;  // distilled 4, base 50
  double default_guidance = 4.0;
  int64_t max_sequence_length = kMaxSequenceLength;
  int64_t pixel_multiple = 16;  // width and height must be multiples of this
  // The bounds check() refuses beyond (max_sequence_length and pixel_multiple as above).
  ModelLimits hard_limits;
  std::string backend;             // "cpu" / "cuda"
  int64_t weight_value_bytes = 0;  // bytes per weight value there (bf16 on CUDA: 2; CPU: 4)
  std::string device_pci_bus_id;   // Backend::device_pci_bus_id: the GPU for NVML; "" on the CPU
  int64_t device_bytes = 0;        // weights held by the backend, all components
  int64_t text_encoder_bytes = 0;
  int64_t transformer_bytes = 0;
  int64_t vae_bytes = 0;
  int64_t fp8_bytes = 0;  // FP8 weight copies for quality=high (0 when not enabled)
  // How the transformer's checkpoint stores it (TransformerCheckpoint::format: "diffusers", "bfl",
  // "bfl_fp8", "comfy_fp8", "comfy_scaled_fp8", "modelopt_fp8"; "random" without a checkpoint) and
  // the bytes of its weights as stored.
  std::string transformer_format = "random";
  int64_t transformer_checkpoint_bytes = 0;
  // The same for the text encoder (TextEncoderCheckpoint::format): "diffusers" (a text_encoder/
  // folder), "file" (a bf16 --text-encoder-file), an FP8 layout's name, or "random".
  std::string text_encoder_format = "random";
  int64_t text_encoder_checkpoint_bytes = 0;
  // The text encoder's weights stay in page-locked host memory and stream onto the device layer by
  // layer for each encode (the memory plan of GPUs smaller than the model); text_encoder_bytes is
  // then its two device layer buffers.
  bool text_encoder_streamed = false;
  int64_t text_encoder_host_bytes = 0;  // the embedding table (always), the streamed layers
  int64_t prompt_cache_bytes = 0;       // capacity of the prompt-embedding cache (0: off)
  bool quality_high = false;            // quality=high requests are served
  Fp8Lossless fp8_lossless = Fp8Lossless::kResident;        // --fp8-lossless (FP8 checkpoints only)
  Fp8InputScale fp8_input_scale = Fp8InputScale::kDynamic;  // --fp8-input-scale
  // quality=high's FP8 GEMMs (registered transformer weights; 0 without quality=high), and how many
  // of them quantize their activation under the checkpoint's static input_scale (--fp8-input-scale
  // static; the rest per token).
  int64_t fp8_gemms = 0;
  int64_t fp8_static_scale_gemms = 0;
  std::vector<ComponentInfo> components;  // each component's format and bytes
  double load_seconds = 0.0;

  // One log line: model, backend, bytes per component and load time.
  std::string load_summary() const;
  // "22 FP8 GEMMs, --fp8-input-scale static: 22 under the checkpoint's input_scale, 0 per token"
  // (or "..., activations per token"), for load_summary.
  std::string fp8_gemms_summary() const;
};

// Progress of a load, one component at a time: reported when the component starts (seconds < 0,
// bytes: the memory plan's estimate, 0 where there is none) and when it is in place (seconds: how
// long it took, bytes: what it holds, device and host).
struct LoadProgress {
  std::string component;  // "tokenizer", "text_encoder", "transformer", "vae", "fp8_weights"
  int64_t bytes = 0;
  double seconds = -1.0;
  // What the component is read from when that is worth a word: the transformer's checkpoint
  // format ("bfl_fp8 (22 FP8 tensors, 4.070 GB as stored)"); "" otherwise.
  std::string source;
};
using LoadProgressFn = std::function<void(const LoadProgress&)>;
// "loading transformer (7.751 GB)" / "loaded transformer: 7.751 GB in 3.20 s (2.42 GB/s)"
// (MB below a GB).
std::string describe(const LoadProgress& progress);

// The shapes of a pipeline built with random weights (benchmarks at the published shapes).
struct RandomPipelineSpec {
  std::string name;                                   // e.g. "klein-4b (random weights)"
  std::string pipeline_class = "Flux2KleinPipeline";  // or "Flux2Pipeline" (dev)
  Flux2Config transformer;
  TextEncoderConfig text_encoder;
  WeightResidency text_encoder_residency = WeightResidency::kDevice;
  int64_t prompt_cache_bytes = kDefaultPromptCacheBytes;
  std::vector<int64_t> taps = {9, 18, 27};
  VaeConfig vae;
  std::string tokenizer_dir;  // a real tokenizer.json (tokenization cost is part of a request)
  bool is_distilled = true;
  bool kv_cache = false;  // run as klein-KV (Flux2KleinKVPipeline)
  bool enable_quality_high = false;
  // The transformer's block projections as an FP8 checkpoint's stored weights (random E4M3 codes
  // and row scales; `flux2 bench --weights fp8`), run as fp8_lossless says at quality=lossless;
  // the text encoder's projections too when it is resident (an FP8 text-encoder file).
  bool fp8_weights = false;
  Fp8Lossless fp8_lossless = Fp8Lossless::kResident;
  // With fp8_weights at quality=high: static runs the transformer's FP8 GEMMs under the random
  // weights' input scale (kRandomActivationAmax / 448, weight_loader.h), as --fp8-input-scale.
  Fp8InputScale fp8_input_scale = Fp8InputScale::kDynamic;
  uint64_t seed = 1;
  LoadProgressFn on_progress;  // per component, as PipelineOptions::on_progress
};

// Load-time overrides, for tests that run one checkpoint both ways.
struct PipelineOptions {
  std::optional<bool> is_distilled;  // replaces model_index.json's is_distilled
  // Run as klein-KV (true) or as the plain klein pipeline (false) whatever model_index.json's
  // class says: the goldens run one checkpoint both ways.
  std::optional<bool> kv_cache;
  // Keep FP8 copies of the transformer's block weights so requests may ask for Quality::kHigh
  // (costs about half the transformer's bf16 bytes; reported in PipelineInfo::fp8_bytes).
  bool enable_quality_high = false;
  // How an FP8 transformer checkpoint's quantized projections serve quality=lossless (and what
  // stays on the device): Fp8Lossless.
  Fp8Lossless fp8_lossless = Fp8Lossless::kResident;
  // Which activation scales quality=high's FP8 GEMMs use on an FP8 transformer checkpoint
  // (Fp8InputScale); static is refused without enable_quality_high, for a bf16 transformer and
  // for a checkpoint without any input_scale (check_fp8_input_scale), before anything loads.
  Fp8InputScale fp8_input_scale = Fp8InputScale::kDynamic;
  // kStreamed: the text encoder's weights in pinned host memory, streamed per encode (the 80 GB
  // memory plan for FLUX.2-dev).
  WeightResidency text_encoder_residency = WeightResidency::kDevice;
  // Bytes of prompt embeddings kept on the device for repeated prompts (0: no cache).
  int64_t prompt_cache_bytes = kDefaultPromptCacheBytes;
  // A Black Forest Labs single-file transformer (flux2-dev.safetensors naming, bf16 or any FP8
  // layout of model/fp8_checkpoint.h) to load instead of transformer/'s weights; its config comes
  // from transformer/config.json (dev without one: the published shapes). A diffusers-named file
  // is refused (its place is transformer/); a folder is opened as a transformer/ folder (a
  // ModelOpt FP8 export).
  std::string transformer_file;
  // One safetensors file holding the text encoder under HF names (ComfyUI's text-encoder files),
  // bf16 or FP8 (model/text_encoder_checkpoint.h), instead of text_encoder/'s weights; its config
  // is still text_encoder/config.json. An FP8 file's projections stay FP8 on the device, each
  // dequantized as its GEMM runs (lossless numerics on the dequantized weights); streamed
  // (kStreamed), they are dequantized into host memory at load and stream as bf16.
  std::string text_encoder_file;
  // Told as each component starts loading and when it is in place (the server logs it, the CLI
  // prints it): loading FLUX.2-dev takes minutes.
  LoadProgressFn on_progress;
  // Device bytes of LoRA adapters kept resident between requests (LoraDeviceCache; 0: each
  // request uploads its own).
  int64_t lora_cache_bytes = 0;
};

struct GenerateParams {
  std::string prompt;
  std::string negative_prompt;  // CFG models only ("" = the empty prompt, as diffusers)
  // Pixels, multiples of 16; 0: the first reference's (prepared) size, else 1024 (output_size).
  int64_t width = 0;
  int64_t height = 0;
  int64_t num_inference_steps = 0;  // 0: the model default (or sigmas' count when given)
  // Custom base sigmas, one per step (diffusers' `sigmas=`: few-step adapters such as dev's Turbo
  // LoRA bring their own), shifted like the default linspace(1, 1/N, N); empty: the default.
  std::vector<double> sigmas;
  double guidance_scale = -1.0;  // < 0: the model default; CFG applies when > 1 on base models
  uint64_t seed = 0;
  int64_t max_sequence_length = 0;  // 0: the model default (512)
  Quality quality = Quality::kLossless;
  bool fast_paths = true;  // false: every fused fast path runs its eager chain
  // Reference images for editing, in order (prepare_reference: sides multiples of 16, at most
  // kReferenceMaxArea pixels); empty: text-to-image. Reference k is image k + 1 of the prompt.
  std::vector<RgbImage> references;
  // LoRA adapters, applied in this order to every transformer forward (model/README.md, "LoRA").
  std::vector<LoraRequest> loras;
  // Step caching (model/step_cache.h; model/README.md, "Step caching"): off by default; refused
  // for runs of kStepCacheMinSteps - 1 steps or fewer and for klein-KV.
  StepCacheOptions cache;
};

// The size a request generates: width and height when given, else the first reference's size,
// else 1024 x 1024 (diffusers' default_sample_size x vae_scale_factor).
struct ImageSize {
  int64_t width = 0;
  int64_t height = 0;
};
ImageSize output_size(const GenerateParams& params);

// Wall-clock seconds per stage of one generation.
struct StageTimings {
  double tokenize = 0.0;
  double text_encode = 0.0;
  // Host time drawing and packing the initial noise: on the GPU on a thread of its own beside
  // tokenization and the text encoder (text_encode waits for it), on the CPU inside text_encode.
  double noise = 0.0;
  double reference_encode = 0.0;  // VAE-encoding the reference images (0 without references)
  double denoise = 0.0;           // noise upload, schedule, conditioning, then all steps
  std::vector<double> steps;      // each step (transformer forward(s) + Euler update)
  double decode = 0.0;            // VAE decode + post-processing to uint8
};

struct GeneratedImage {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> rgb;  // height x width x 3, row-major
  uint64_t seed = 0;
  StageTimings timings;
  bool prompt_cache_hit = false;  // the prompt's embeddings came from the cache (no text encode)
  StepCacheReport cache;          // what step caching did (enabled = false without it)
};

struct GenerateHooks {
  // Checked at every stage boundary: before the text encoder, before the reference encode, before
  // each step and before the VAE decode; returning a non-OK status (Cancelled, DeadlineExceeded)
  // stops the generation with that status. Each call runs under the request options of the stage
  // that follows (the text encoder's are lossless whatever the request's quality).
  std::function<absl::Status()> check_continue;
  // Checked inside each step too, between the transformer's blocks (before every block but the
  // first of each forward), where the backend runs ops synchronously (the CPU): a non-OK status
  // stops the step midway and the generation with it. Not called on CUDA (pipeline_generate.cc
  // says why). It runs (blocks - 1) times per forward, so it must be cheap; unlike
  // check_continue it marks no stage boundary. Unset: steps run to their end.
  std::function<absl::Status()> check_between_blocks;
  // Called after each step with its index (0-based), the step count and its wall time.
  std::function<void(int64_t step, int64_t steps, double seconds)> on_step;
  // With step caching, called after each step (before on_step) with what it did so far.
  std::function<void(const StepCacheReport& so_far)> on_step_cache;
  // Multi-rank pipelines (join_parallel) only: called after each step (before on_step) with this
  // rank's number (ParallelRank::rank), the step's index and the time this rank's collectives
  // took in it (Communicator::take_collective_seconds, read after the step's own synchronize).
  // Each rank calls it from its own thread: calls of different ranks may overlap.
  std::function<void(int rank, int64_t step, const CollectiveSeconds& seconds)> on_step_collectives;
  // Called once with the prompt embeddings [L, J] the transformer gets (for golden checks).
  std::function<void(const Tensor& prompt_embeds)> on_prompt_embeds;
  // Called with the latent tokens [N, 128]: step -1 is the initial noise, then after each step
  // (for golden checks).
  std::function<void(int64_t step, const Tensor& latents)> on_latents;
  // Golden checks only (teacher forcing): called before each step with the latent tokens
  // [N, 128] it starts from, which the hook may overwrite (each step then starts from a
  // reference's latents; tests/data/README.md, "Step caching").
  std::function<absl::Status(int64_t step, const Tensor& latents)> before_step;
  // Called in each step with the velocity [N, 128] the Euler step takes (after the CFG
  // combination), for golden checks.
  std::function<void(int64_t step, const Tensor& velocity)> on_velocity;
  // Called once with the reference tokens [R, 128] and their position ids [R, 4] (editing only).
  std::function<void(const Tensor& tokens, std::span<const int64_t> ids)> on_references;
  // Called with the decoded image [H, W, 3] in about [-1, 1], before post-processing.
  std::function<void(const Tensor& image)> on_image;
};

class Pipeline {
 public:
  // Loads a checkpoint directory (model_index.json, tokenizer/, text_encoder/, transformer/,
  // vae/, scheduler/) onto `backend`, which must outlive the pipeline.
  static absl::StatusOr<std::unique_ptr<Pipeline>> load(Backend& backend,
                                                        const std::string& model_dir,
                                                        const PipelineOptions& options = {});

  // A pipeline with random weights at `spec`'s shapes (no checkpoint), for `flux2 bench --e2e`.
  static absl::StatusOr<std::unique_ptr<Pipeline>> create_random(Backend& backend,
                                                                 const RandomPipelineSpec& spec);

  const PipelineInfo& info() const { return info_; }
  const Flux2Config& transformer_config() const { return transformer_->config(); }
  // The adapters resident on the device between requests (--lora-cache-bytes, --lora-preload).
  LoraDeviceCache& lora_cache() const { return lora_cache_; }

  // Every way `params` does not fit the model, in field order (reference_images[i], width,
  // height, num_inference_steps, guidance_scale, negative_prompt, quality, max_sequence_length);
  // empty: generate() takes them. A size taken from a refused reference is not checked again.
  std::vector<FieldViolation> check(const GenerateParams& params) const;
  // check() as a status: OK, or InvalidArgument "field: description; field2: ..."
  // (describe_violations()).
  absl::Status validate(const GenerateParams& params) const;

  // Makes this pipeline rank `rank.rank` of an engine that splits each request over
  // rank.layout.ranks() ranks (model/cfg_parallel.h): CFG branches on two rank groups, each
  // group's transformer forwards sequence-parallel. Every rank's pipeline loads the same
  // checkpoint on its own backend, and generate() runs with the same params on every rank, each on
  // its own thread; each rank runs the text encoder, the Euler steps and the VAE itself, and every
  // rank returns the same image (model/README.md, "Several GPUs"). InvalidArgument when the layout
  // does not fit the model (heads, klein-KV, CFG on a model without it) or the communicators.
  absl::Status join_parallel(const ParallelRank& rank);

  // One image for `params` (refused as validate() refuses), in stages: the prompts (tokenized,
  // text-encoded), the reference images (VAE-encoded), the latents (noise, schedule,
  // conditioning), the denoising steps, the VAE decode; each timed into GeneratedImage::timings.
  // Synchronous: returns when the pixels are on the host.
  // Multi-rank (join_parallel): a failure on this rank ends its communicators, so the other
  // ranks' generations fail too instead of waiting for it (and the engine must start again). A
  // stop by hooks.check_continue at a stage boundary does not: no collective is pending there,
  // so the group lives on, provided every rank got the same answers (the engine's duty:
  // server/serving/parallel_engine.h).
  absl::StatusOr<GeneratedImage> generate(const GenerateParams& params,
                                          const GenerateHooks& hooks = {}) const;

 private:
  Pipeline(Backend& backend) : backend_(backend) {}
  // One generate() call: its settings, then what each stage hands the next (pipeline_generate.cc).
  struct Generation;
  // generate() on this rank once validate() took the params (pipeline_generate.cc).
  absl::StatusOr<GeneratedImage> run_stages(const GenerateParams& params,
                                            const GenerateHooks& hooks) const;
  // The stages of generate(), in order. Each that says so starts with hooks.check_continue.
  absl::Status tokenize_prompts(Generation& g) const;  // the prompt (and CFG's negative prompt)
  // Checks, then the prompt embeddings [L, J] under lossless numerics; waits for the noise.
  absl::Status encode_prompts(Generation& g) const;
  // Checks, then VAE-encodes the references into the transformer input's last R rows.
  absl::Status encode_reference_images(Generation& g) const;
  // Uploads the noise into the latents; the schedule, the conditioning and the velocity buffers.
  absl::Status prepare_latents(Generation& g) const;
  // The steps, each after a check: transformer forward(s), CFG, Euler update.
  absl::Status denoise(Generation& g) const;
  // The step cache's records so far (GeneratedImage::cache).
  StepCacheReport step_cache_report(const Generation& g) const;
  // One step; `between_blocks` goes to the transformer's forwards.
  absl::Status denoising_step(Generation& g, int64_t step,
                              const std::function<absl::Status()>& between_blocks) const;
  // Checks, then the VAE decode to RGB8.
  absl::Status decode(Generation& g) const;
  // Multi-rank engines (join_parallel; pipeline_parallel.cc). Ends this rank's communicators after
  // a failure (nothing on one rank).
  void end_parallel_group(const absl::Status& why) const;
  // Whether a step's two CFG branches
  // (`cfg`: the request runs CFG) run on two rank groups, and whether this rank's is the negative.
  bool cfg_parallel(bool cfg) const;
  bool runs_negative_branch(bool cfg) const;
  // Makes `cond`'s forwards sequence-parallel over this rank's group (nothing on one rank).
  absl::Status shard(Flux2Conditioning& cond) const;
  // After step `step` (synchronized): this rank's collective time in it, to
  // hooks.on_step_collectives (nothing on one rank).
  absl::Status report_step_collectives(const GenerateHooks& hooks, int64_t step) const;
  // CFG-parallel: exchanges this rank's branch velocity `own` for the other's (into `other`) and
  // returns the tensor holding the guided velocity (the conditional branch's, overwritten).
  absl::StatusOr<Tensor> combine_cfg_branches(const Tensor& own, const Tensor& other,
                                              float guidance) const;

  // The PipelineInfo fields every klein pipeline derives from its name and variant.
  void describe(const std::string& model_dir, const std::string& model_name,
                const std::string& pipeline_class, bool is_distilled, bool kv_cache);
  // Adds a violation of reference_images[i] for each reference of `params` that is not prepared
  // (reference_image.h); returns whether the first one is.
  bool check_references(const GenerateParams& params,
                        std::vector<FieldViolation>& violations) const;
  // Adds a violation of width / height for a side that is not a positive multiple of the
  // pixel multiple.
  void check_size(const ImageSize& size, std::vector<FieldViolation>& violations) const;
  // VAE-encodes the references into rows [0, R) of `tokens` [R, 128] (R: their tokens in order)
  // and returns their position ids [R, 4] (T = 10 (k + 1), row, col, 0).
  absl::StatusOr<std::vector<int64_t>> encode_references(const std::vector<RgbImage>& references,
                                                         const Tensor& tokens) const;
  // Checks that the components fit together and fills the derived PipelineInfo fields.
  absl::Status connect_components(const std::string& source);
  // The end of load() and create_random(): connect_components, quality=high's low-precision
  // weights when asked for, and the load time since `start`.
  // --fp8-lossless=resident: the transformer's stored FP8 weights dequantized on the device,
  // their bytes moved in info_ (a bf16 checkpoint has none).
  absl::Status dequantize_stored_fp8(const LoadProgressFn& progress);
  absl::Status finish_load(const std::string& source, bool enable_quality_high,
                           Fp8InputScale input_scale, std::chrono::steady_clock::time_point start,
                           const LoadProgressFn& progress);
  // quality=high's low-precision weights (enable_quality_high), counted into info_.
  absl::Status register_fp8_weights(Fp8InputScale input_scale, const LoadProgressFn& progress);
  // The prompt embeddings of `tokens`: from the cache, else encoded (and cached). `hit` says which.
  absl::StatusOr<Tensor> prompt_embeddings(const TokenizedPrompt& tokens, bool* hit) const;

  Backend& backend_;
  PipelineInfo info_;
  SchedulerConfig scheduler_config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  PromptFormat prompt_format_ = PromptFormat::kQwen3Chat;
  std::unique_ptr<TextEncoder> text_encoder_;
  std::unique_ptr<Flux2Transformer> transformer_;
  std::unique_ptr<VaeDecoder> vae_;
  std::unique_ptr<VaeEncoder> vae_encoder_;
  mutable PromptCache prompt_cache_;
  mutable LoraDeviceCache lora_cache_;
  std::optional<ParallelRank> parallel_;  // join_parallel's; none: one rank runs it all
};

}  // namespace flux2
