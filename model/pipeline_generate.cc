// Pipeline::generate and what it runs: validation, the prompt embeddings (with the prompt
// cache), the reference encode, the denoising steps and the VAE decode; see pipeline.h. Tested by
// `flux2 check-golden --only pipeline` and tests/host/pipeline_test.cc.
#include "model/pipeline.h"

#include <chrono>
#include <cmath>
#include <functional>
#include <future>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "kernels/base/decimal.h"
#include "kernels/base/elapsed.h"
#include "kernels/base/parallel.h"
#include "kernels/base/status.h"
#include "model/rope.h"
#include "model/timestep_embedding.h"
#include "model/torch_randn.h"

namespace flux2 {
namespace {

using Clock = std::chrono::steady_clock;

// The steps a request runs: its own, else as many as its custom sigmas, else the model's default.
int64_t resolved_steps(const GenerateParams& params, int64_t default_steps) {
  if (params.num_inference_steps > 0) return params.num_inference_steps;
  return params.sigmas.empty() ? default_steps : static_cast<int64_t>(params.sigmas.size());
}

// The initial latents as diffusers draws them: randn([1, channels, h, w]) in the activation dtype
// (torch's CPU generator), packed to tokens [n, channels]; with the host seconds it took.
std::pair<std::vector<float>, double> draw_packed_noise(DType act, uint64_t seed, int64_t channels,
                                                        int64_t n) {
  const Clock::time_point start = Clock::now();
  const std::vector<float> noise = act == DType::kBF16 ? torch_randn_bf16(seed, channels * n)
                                                       : torch_randn_f32(seed, channels * n);
  std::vector<float> packed(noise.size());
  if (static_cast<int64_t>(noise.size()) == channels * n) {
    parallel_for(n, 256, [&](int64_t begin, int64_t end) {  // token rows [begin, end)
      for (int64_t c = 0; c < channels; ++c) {
        for (int64_t t = begin; t < end; ++t) packed[t * channels + c] = noise[c * n + t];
      }
    });
  }
  return {std::move(packed), seconds_since(start)};
}

// Runs one stage of generate() and adds its wall-clock seconds to `seconds` (a StageTimings
// field: the latents and denoising stages both add to StageTimings::denoise).
absl::Status timed(double& seconds, const std::function<absl::Status()>& stage) {
  const Clock::time_point start = Clock::now();
  absl::Status status = stage();
  seconds += seconds_since(start);
  return status;
}

}  // namespace

absl::StatusOr<Tensor> Pipeline::prompt_embeddings(const TokenizedPrompt& tokens, bool* hit) const {
  // The key ignores quality and fast paths: the text encoder's numerics depend on neither (generate
  // runs it at lossless; its fast paths are bit-identical), so a hit gives the bytes an encode
  // would.
  PromptCache::Key key{tokens.ids, tokens.num_tokens};
  if (std::optional<Tensor> cached = prompt_cache_.find(key)) {
    *hit = true;
    return *cached;
  }
  *hit = false;
  FLUX_ASSIGN_OR_RETURN(Tensor embeds, text_encoder_->encode(tokens.ids, tokens.num_tokens));
  prompt_cache_.insert(std::move(key), embeds);
  return embeds;
}

absl::StatusOr<std::vector<int64_t>> Pipeline::encode_references(
    const std::vector<RgbImage>& references, const Tensor& tokens) const {
  Backend& be = backend_;
  std::vector<int64_t> ids;
  int64_t row = 0;
  for (size_t k = 0; k < references.size(); ++k) {
    const RgbImage& reference = references[k];
    FLUX_ASSIGN_OR_RETURN(Tensor pixels,
                          be.empty(be.activation_dtype(), {reference.height, reference.width, 3}));
    FLUX_RETURN_IF_ERROR(be.from_rgb8(reference.pixels.data(), pixels));  // [H, W, 3] in [-1, 1]
    FLUX_ASSIGN_OR_RETURN(Tensor encoded, vae_encoder_->encode_tokens(pixels));  // [h w, 128]
    if (row + encoded.rows() > tokens.rows()) {
      return absl::InternalError("reference tokens overflow their rows");
    }
    FLUX_RETURN_IF_ERROR(be.copy(encoded, tokens.row_slice(row, encoded.rows())));
    row += encoded.rows();
    // diffusers' _prepare_image_ids: (T = 10 + 10 k, row, col, 0), row-major.
    const int64_t h = reference.height / info_.pixel_multiple;
    const int64_t w = reference.width / info_.pixel_multiple;
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t x = 0; x < w; ++x) {
        ids.insert(ids.end(), {10 * (static_cast<int64_t>(k) + 1), y, x, 0});
      }
    }
  }
  return ids;
}

ImageSize output_size(const GenerateParams& params) {
  constexpr int64_t kDefaultSide = 1024;  // diffusers: default_sample_size 128 x vae_scale_factor 8
  ImageSize size{params.width, params.height};
  if (size.width == 0)
    size.width = params.references.empty() ? kDefaultSide : params.references[0].width;
  if (size.height == 0)
    size.height = params.references.empty() ? kDefaultSide : params.references[0].height;
  return size;
}

bool Pipeline::check_references(const GenerateParams& params,
                                std::vector<FieldViolation>& violations) const {
  bool first_ok = true;
  for (size_t i = 0; i < params.references.size(); ++i) {
    const std::string field = absl::StrCat("reference_images[", i, "]");
    const absl::Status status =
        check_prepared_reference(params.references[i], info_.hard_limits.pixel_multiple, field);
    if (status.ok()) continue;
    // Its message is "reference_images[i]: why" (reference_image.h).
    absl::string_view why = status.message();
    absl::ConsumePrefix(&why, absl::StrCat(field, ": "));
    violations.push_back({field, std::string(why)});
    if (i == 0) first_ok = false;
  }
  return first_ok;
}

void Pipeline::check_size(const ImageSize& size, std::vector<FieldViolation>& violations) const {
  const int64_t multiple = info_.hard_limits.pixel_multiple;
  bool sides_ok = true;
  for (auto [name, value] : {std::pair<const char*, int64_t>{"width", size.width},
                             std::pair<const char*, int64_t>{"height", size.height}}) {
    if (value < multiple || value % multiple != 0) {
      violations.push_back(
          {name, absl::StrCat(value, " is not a positive multiple of ", multiple)});
      sides_ok = false;
    }
  }
  const int64_t max_pixels = info_.hard_limits.max_pixels;
  if (sides_ok && size.width > max_pixels / size.height) {  // width x height > max_pixels
    const std::string why =
        absl::StrCat(size.width, " x ", size.height, " exceeds the model's bound of ", max_pixels,
                     " pixels (width x height)");
    violations.push_back({"width", why});
    violations.push_back({"height", why});
  }
}

namespace {

// Each adapter's weight (the request's scale): finite, and PEFT's scaling in float32 at it finite
// for every module (the server's --max-lora-scale bounds it already; `flux2 generate` takes any):
// an infinite one turns the image black.
void check_lora_weights(const std::vector<LoraRequest>& loras,
                        std::vector<FieldViolation>* violations) {
  for (size_t i = 0; i < loras.size(); ++i) {
    const double weight = loras[i].weight;
    const std::string field = absl::StrCat("loras[", i, "].scale");
    if (!std::isfinite(weight)) {
      violations->push_back({field, absl::StrCat(exact_decimal(weight), " is not finite")});
      continue;
    }
    for (const LoraModule& module : loras[i].adapter->modules) {
      if (!std::isfinite(module.scaling(weight))) {
        violations->push_back(
            {field, absl::StrCat(exact_decimal(weight), " makes ", module.module,
                                 "'s scaling (lora_alpha ", module.alpha, " over rank ",
                                 module.rank, ") overflow float32")});
        break;
      }
    }
  }
}

}  // namespace

std::vector<FieldViolation> Pipeline::check(const GenerateParams& params) const {
  std::vector<FieldViolation> violations;
  const bool first_reference_ok = check_references(params, violations);
  // The output size, unless it comes from a reference refused above (its violation says why).
  const bool size_from_reference =
      !params.references.empty() && (params.width == 0 || params.height == 0);
  if (first_reference_ok || !size_from_reference) check_size(output_size(params), violations);
  const ModelLimits& limits = info_.hard_limits;
  if (params.num_inference_steps < 0 || params.num_inference_steps > limits.max_steps) {
    violations.push_back(
        {"num_inference_steps", absl::StrCat(params.num_inference_steps, " is outside 1..",
                                             limits.max_steps, " (0 = default)")});
  }
  check_custom_sigmas(params.sigmas, resolved_steps(params, info_.default_steps), limits.max_steps,
                      &violations);
  if (!std::isfinite(params.guidance_scale) ||
      (params.guidance_scale >= 0.0 && params.guidance_scale > limits.max_guidance)) {
    violations.push_back(
        {"guidance_scale", absl::StrCat(exact_decimal(params.guidance_scale),
                                        " is not a finite value in 0..", limits.max_guidance)});
  }
  if (!params.negative_prompt.empty() && !info_.uses_cfg) {
    violations.push_back(
        {"negative_prompt",
         absl::StrCat(info_.model_name, " (", info_.variant,
                      ") runs without classifier-free guidance, so a negative prompt does not "
                      "apply")});
  }
  if (params.quality == Quality::kHigh && !info_.quality_high) {
    violations.push_back({"quality",
                          "QUALITY_HIGH is not enabled for this model (load it with quality=high "
                          "enabled)"});
  }
  check_lora_weights(params.loras, &violations);
  check_step_cache(params.cache, resolved_steps(params, info_.default_steps), &violations);
  if (params.cache.enabled() && parallel_.has_value()) {
    violations.push_back({"cache", absl::StrCat("step caching compares whole-sequence residuals "
                                                "and does not run over several ranks (",
                                                parallel_->layout.ranks(), " here)")});
  }
  if (params.cache.enabled() && info_.uses_kv_cache) {
    violations.push_back({"cache", absl::StrCat(info_.model_name,
                                                " (klein-kv) runs distilled few-step generations: "
                                                "step caching does not apply")});
  }
  if (params.max_sequence_length < 0 || params.max_sequence_length > limits.max_sequence_length) {
    violations.push_back(
        {"max_sequence_length", absl::StrCat(params.max_sequence_length, " is outside 1..",
                                             limits.max_sequence_length, " (0 = default)")});
  }
  return violations;
}

absl::Status Pipeline::validate(const GenerateParams& params) const {
  const std::vector<FieldViolation> violations = check(params);
  if (violations.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(describe_violations(violations));
}

struct Pipeline::Generation {
  Generation(const PipelineInfo& info, const Flux2Config& flux, const GenerateParams& params,
             const GenerateHooks& hooks);
  // hooks.check_continue, when set: a stage boundary.
  absl::Status check_continue() const {
    return hooks.check_continue ? hooks.check_continue() : absl::OkStatus();
  }
  // Starts drawing the initial noise, which depends only on the seed and the size: where the
  // backend's ops run asynchronously (the GPU) a host thread draws it while this one tokenizes and
  // enqueues the text encoder (it takes longer than the device's text encode at 1024x1024); on
  // the CPU it is drawn in line when encode_prompts asks for it.
  void start_noise_draw(const Backend& be);
  // The transformer's input [N + R, channels]: the noisy latents, then the reference tokens.
  absl::Status allocate_model_input(Backend& be);

  const GenerateParams& params;
  const GenerateHooks& hooks;
  RequestOptions request;        // the request's quality and fast-path switch
  int64_t steps = 0;             // the request's, else the model's default
  double guidance = 0.0;         // the request's, else the model's default
  int64_t max_length = 0;        // text-encoder tokens
  bool cfg = false;              // true CFG against the negative prompt (base models only)
  int64_t h = 0, w = 0, n = 0;   // the latent token grid and N = h w
  int64_t channels = 0;          // the transformer's in_channels (128)
  int64_t reference_tokens = 0;  // R: every reference's tokens, in order
  // The prompts, and the noise drawn beside them ([N, channels] packed).
  std::future<std::pair<std::vector<float>, double>> noise_draw;
  std::vector<float> noise;
  TokenizedPrompt tokens, negative_tokens;
  Tensor prompt_embeds, negative_embeds;  // [L, J]
  // The transformer's input: latents [N, channels] are its first rows, the references' after.
  Tensor model_input, latents;
  std::optional<Flux2References> references;
  // What every step reads and writes: the schedule, and on the device the conditioning (with the
  // transformer's workspace and klein-KV's cache) and the velocities [N, channels].
  Schedule schedule;
  struct StepBuffers {
    Flux2Conditioning cond, negative_cond;
    Tensor velocity, negative_velocity;
  };
  std::optional<StepBuffers> step_buffers;
  std::vector<Flux2LoraUse> loras;  // the request's adapters on the device, held while it runs
  GeneratedImage image;             // its size, seed and timings, then its pixels
};

Pipeline::Generation::Generation(const PipelineInfo& info, const Flux2Config& flux,
                                 const GenerateParams& params, const GenerateHooks& hooks)
    : params(params), hooks(hooks), request{params.quality, params.fast_paths} {
  steps = resolved_steps(params, info.default_steps);
  guidance = params.guidance_scale >= 0.0 ? params.guidance_scale : info.default_guidance;
  max_length =
      params.max_sequence_length > 0 ? params.max_sequence_length : info.max_sequence_length;
  cfg = info.uses_cfg && guidance > 1.0;
  const ImageSize size = output_size(params);
  h = size.height / info.pixel_multiple;
  w = size.width / info.pixel_multiple;
  n = h * w;
  channels = flux.in_channels;
  for (const RgbImage& reference : params.references) {
    reference_tokens +=
        (reference.height / info.pixel_multiple) * (reference.width / info.pixel_multiple);
  }
  image.width = size.width;
  image.height = size.height;
  image.seed = params.seed;
}

void Pipeline::Generation::start_noise_draw(const Backend& be) {
  auto draw = [&](std::launch policy) {
    return std::async(policy, draw_packed_noise, be.activation_dtype(), params.seed, channels, n);
  };
  try {
    noise_draw = draw(be.device() == Device::kCuda ? std::launch::async : std::launch::deferred);
  } catch (const std::system_error&) {  // no thread to be had: draw it in line
    noise_draw = draw(std::launch::deferred);
  }
}

absl::Status Pipeline::Generation::allocate_model_input(Backend& be) {
  FLUX_ASSIGN_OR_RETURN(model_input,
                        be.empty(be.activation_dtype(), {n + reference_tokens, channels}));
  latents = model_input.row_slice(0, n);
  return absl::OkStatus();
}

absl::StatusOr<GeneratedImage> Pipeline::generate(const GenerateParams& params,
                                                  const GenerateHooks& hooks) const {
  // Refused requests are refused on every rank alike, before any collective: a multi-rank group
  // lives on. A later failure ends it, so the other ranks stop too instead of waiting.
  FLUX_RETURN_IF_ERROR(validate(params));
  // A stop at a stage boundary (check_continue's non-OK answer) leaves no collective pending, so
  // it keeps the group when every rank stopped there alike (pipeline.h).
  bool stopped_at_boundary = false;
  GenerateHooks checked = hooks;
  if (hooks.check_continue) {
    checked.check_continue = [&] {
      absl::Status status = hooks.check_continue();
      stopped_at_boundary = !status.ok();
      return status;
    };
  }
  absl::StatusOr<GeneratedImage> image = run_stages(params, checked);
  if (!image.ok() && !stopped_at_boundary) end_parallel_group(image.status());
  return image;
}

absl::StatusOr<GeneratedImage> Pipeline::run_stages(const GenerateParams& params,
                                                    const GenerateHooks& hooks) const {
  // Every op of this request runs under its options (the text encoder's under lossless ones).
  const RequestScope request_scope(backend_, RequestOptions{params.quality, params.fast_paths});
  Generation g(info_, transformer_->config(), params, hooks);
  StageTimings& t = g.image.timings;
  g.start_noise_draw(backend_);  // beside the prompts (on the GPU); encode_prompts waits for it
  FLUX_RETURN_IF_ERROR(timed(t.tokenize, [&] { return tokenize_prompts(g); }));
  FLUX_RETURN_IF_ERROR(timed(t.text_encode, [&] { return encode_prompts(g); }));
  FLUX_RETURN_IF_ERROR(g.allocate_model_input(backend_));
  if (g.reference_tokens > 0) {
    FLUX_RETURN_IF_ERROR(timed(t.reference_encode, [&] { return encode_reference_images(g); }));
  }
  FLUX_RETURN_IF_ERROR(timed(t.denoise, [&] { return prepare_latents(g); }));
  FLUX_RETURN_IF_ERROR(timed(t.denoise, [&] { return denoise(g); }));
  // The transformer's buffers go back before the VAE decode, so the request's peak is the larger
  // of the two stages, not their sum (FLUX.2-dev at 1024x1024 on a 141 GB device: 100.25 GB with
  // both held).
  g.step_buffers.reset();
  FLUX_RETURN_IF_ERROR(timed(t.decode, [&] { return decode(g); }));
  return std::move(g.image);
}

absl::Status Pipeline::tokenize_prompts(Generation& g) const {
  g.tokens = tokenize_prompt(*tokenizer_, prompt_format_, g.params.prompt, g.max_length);
  if (g.cfg) {
    g.negative_tokens =
        tokenize_prompt(*tokenizer_, prompt_format_, g.params.negative_prompt, g.max_length);
  }
  return absl::OkStatus();
}

absl::Status Pipeline::encode_prompts(Generation& g) const {
  {
    // The text encoder always runs at lossless numerics (quality=high is the transformer's and
    // the VAE's), so the prompt cache may serve both qualities.
    const RequestScope text_scope(backend_, g.request.at_lossless());
    FLUX_RETURN_IF_ERROR(g.check_continue());
    FLUX_ASSIGN_OR_RETURN(g.prompt_embeds, prompt_embeddings(g.tokens, &g.image.prompt_cache_hit));
    if (g.hooks.on_prompt_embeds) g.hooks.on_prompt_embeds(g.prompt_embeds);
    if (g.cfg) {
      bool negative_hit = false;
      FLUX_ASSIGN_OR_RETURN(g.negative_embeds, prompt_embeddings(g.negative_tokens, &negative_hit));
    }
  }
  // The noise, drawn meanwhile (or now, on the CPU); text encoding overlapped with it.
  std::tie(g.noise, g.image.timings.noise) = g.noise_draw.get();
  if (static_cast<int64_t>(g.noise.size()) != g.channels * g.n) {
    return absl::InternalError("noise generation failed");
  }
  return backend_.synchronize();
}

absl::Status Pipeline::encode_reference_images(Generation& g) const {
  // Encoded once per request, under the request's quality.
  FLUX_RETURN_IF_ERROR(g.check_continue());
  const Tensor tokens = g.model_input.row_slice(g.n, g.reference_tokens);  // [R, 128]
  g.references.emplace();
  g.references->kv_cache = info_.uses_kv_cache;
  FLUX_ASSIGN_OR_RETURN(g.references->ids, encode_references(g.params.references, tokens));
  FLUX_RETURN_IF_ERROR(backend_.synchronize());
  if (g.hooks.on_references) g.hooks.on_references(tokens, g.references->ids);
  return absl::OkStatus();
}

absl::Status Pipeline::prepare_latents(Generation& g) const {
  Backend& be = backend_;
  const DType act = be.activation_dtype();
  FLUX_RETURN_IF_ERROR(be.upload(g.noise.data(), DType::kF32, g.latents));
  if (g.hooks.on_latents) g.hooks.on_latents(-1, g.latents);

  // Schedule and per-request conditioning (modulation for every step, RoPE tables).
  g.schedule = make_schedule(scheduler_config_, g.steps, g.n, g.params.sigmas);
  std::vector<float> model_timesteps(static_cast<size_t>(g.steps));
  for (int64_t i = 0; i < g.steps; ++i) {
    model_timesteps[i] = round_to_activation(
        round_to_activation(g.schedule.timesteps[i], act) / 1000.0f, act);  // timestep / 1000
  }
  std::vector<float> guidance_values;
  if (transformer_->config().guidance_embeds) {
    guidance_values.assign(static_cast<size_t>(g.steps), static_cast<float>(g.guidance));
  }
  const std::vector<int64_t> txt_ids = flux2_text_ids(g.prompt_embeds.rows());
  const std::vector<int64_t> img_ids = flux2_image_ids(g.h, g.w);
  const Flux2References* refs = g.references ? &*g.references : nullptr;
  std::shared_ptr<const Flux2Lora> lora;
  if (!g.params.loras.empty()) {  // applied in both CFG branches, as diffusers does
    FLUX_ASSIGN_OR_RETURN(g.loras, lora_cache_.acquire(be, transformer_->config(), g.params.loras));
    lora = std::make_shared<const Flux2Lora>(flux2_lora(transformer_->config(), g.loras));
  }
  Generation::StepBuffers& b = g.step_buffers.emplace();
  // CFG-parallel (join_parallel), this rank's branch only: the prompt's or the negative prompt's.
  const Tensor& embeds = runs_negative_branch(g.cfg) ? g.negative_embeds : g.prompt_embeds;
  FLUX_ASSIGN_OR_RETURN(b.cond, transformer_->prepare(embeds, txt_ids, img_ids, model_timesteps,
                                                      guidance_values, refs, lora));
  FLUX_RETURN_IF_ERROR(shard(b.cond));
  if (g.cfg && !cfg_parallel(g.cfg)) {  // the references ride in both branches
    FLUX_ASSIGN_OR_RETURN(
        b.negative_cond, transformer_->prepare(g.negative_embeds, txt_ids, img_ids, model_timesteps,
                                               guidance_values, refs, lora));
    FLUX_RETURN_IF_ERROR(shard(b.negative_cond));
  }
  if (g.params.cache.enabled()) {  // each branch keeps its own state
    b.cond.step_cache = std::make_shared<Flux2StepCache>(g.params.cache, 0);
    if (g.cfg) b.negative_cond.step_cache = std::make_shared<Flux2StepCache>(g.params.cache, 1);
  }
  FLUX_ASSIGN_OR_RETURN(b.velocity, be.empty(act, {g.n, g.channels}));
  if (g.cfg) {
    FLUX_ASSIGN_OR_RETURN(b.negative_velocity, be.empty(act, {g.n, g.channels}));
  }
  return absl::OkStatus();
}

absl::Status Pipeline::denoise(Generation& g) const {
  // Inside a step, the request is checked between the transformer's blocks only where ops run
  // synchronously (the CPU backend, where one step at a large size is slow). On CUDA ops are
  // asynchronous on the backend's stream and no CUDA graph captures a step: the host enqueues a
  // step's blocks ahead of the device and waits once, at its end (denoising_step). A check
  // between enqueues would stop nothing the device runs, and a step left midway would leave its
  // enqueued kernels to run anyway; there the check before each step is the one that counts.
  const std::function<absl::Status()> between_blocks =
      backend_.device() == Device::kCpu ? g.hooks.check_between_blocks : nullptr;
  for (int64_t i = 0; i < g.steps; ++i) {
    FLUX_RETURN_IF_ERROR(g.check_continue());
    if (g.hooks.before_step) FLUX_RETURN_IF_ERROR(g.hooks.before_step(i, g.latents));
    double seconds = 0.0;
    FLUX_RETURN_IF_ERROR(timed(seconds, [&] { return denoising_step(g, i, between_blocks); }));
    g.image.timings.steps.push_back(seconds);
    FLUX_RETURN_IF_ERROR(report_step_collectives(g.hooks, i));
    if (g.params.cache.enabled()) {
      g.image.cache = step_cache_report(g);
      if (g.hooks.on_step_cache) g.hooks.on_step_cache(g.image.cache);
    }
    if (g.hooks.on_latents) g.hooks.on_latents(i, g.latents);
    if (g.hooks.on_step) g.hooks.on_step(i, g.steps, seconds);
  }
  return absl::OkStatus();
}

StepCacheReport Pipeline::step_cache_report(const Generation& g) const {
  StepCacheReport report;
  const Generation::StepBuffers& b = *g.step_buffers;
  if (b.cond.step_cache) add_step_cache_records(*b.cond.step_cache, 0, &report);
  if (b.negative_cond.step_cache) add_step_cache_records(*b.negative_cond.step_cache, 1, &report);
  return report;
}

absl::Status Pipeline::denoising_step(Generation& g, int64_t step,
                                      const std::function<absl::Status()>& between_blocks) const {
  Backend& be = backend_;
  const Generation::StepBuffers& b = *g.step_buffers;
  // [latents; references], but the latents alone once klein-KV cached the references' K/V.
  const Tensor& x = b.cond.kv != nullptr && step > 0 ? g.latents : g.model_input;
  FLUX_RETURN_IF_ERROR(
      transformer_->forward(b.cond, step, x, b.velocity, nullptr, between_blocks));  // [N, 128]
  if (cfg_parallel(g.cfg)) {  // the other branch's velocity from the other rank group
    FLUX_ASSIGN_OR_RETURN(const Tensor guided,
                          combine_cfg_branches(b.velocity, b.negative_velocity,
                                               static_cast<float>(g.guidance)));  // [N, 128]
    if (g.hooks.on_velocity) g.hooks.on_velocity(step, guided);
    FLUX_RETURN_IF_ERROR(be.euler_step(g.latents, guided, g.schedule.dt(step)));
    return be.synchronize();
  }
  if (g.cfg) {
    FLUX_RETURN_IF_ERROR(transformer_->forward(b.negative_cond, step, x, b.negative_velocity,
                                               nullptr, between_blocks));
    FLUX_RETURN_IF_ERROR(be.cfg_combine(b.negative_velocity, b.velocity,
                                        static_cast<float>(g.guidance), b.velocity));
  }
  if (g.hooks.on_velocity) g.hooks.on_velocity(step, b.velocity);
  FLUX_RETURN_IF_ERROR(be.euler_step(g.latents, b.velocity, g.schedule.dt(step)));  // [N, 128]
  return be.synchronize();
}

absl::Status Pipeline::decode(Generation& g) const {
  FLUX_RETURN_IF_ERROR(g.check_continue());
  // BatchNorm de-normalisation, unpatchify, VAE decoder, uint8.
  FLUX_ASSIGN_OR_RETURN(Tensor pixels, vae_->decode_tokens(g.latents, g.h, g.w));  // [H, W, 3]
  if (g.hooks.on_image) g.hooks.on_image(pixels);
  g.image.rgb.resize(static_cast<size_t>(pixels.numel()));
  FLUX_RETURN_IF_ERROR(backend_.to_rgb8(pixels, g.image.rgb.data()));
  if (static_cast<int64_t>(g.image.rgb.size()) != g.image.width * g.image.height * 3) {
    return absl::InternalError("decoded image has the wrong size");
  }
  return absl::OkStatus();
}

}  // namespace flux2
