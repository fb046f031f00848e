// Pipeline::generate and what it runs: validation, the prompt embeddings (with the prompt
// cache), the reference encode, the denoising steps and the VAE decode; see pipeline.h. Tested by
// `flux2 check-golden --only pipeline` and tests/host/pipeline_test.cc.
#include "model/pipeline.h"

#include <chrono>
#include <cmath>
#include <future>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
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

// Steps and guidance accepted by validate(); generous bounds that keep a request finite.
constexpr int64_t kMaxSteps = 200;
constexpr double kMaxGuidance = 100.0;

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
    const std::vector<float> unit = reference_to_unit_range(reference);  // [H, W, 3] in [-1, 1]
    FLUX_ASSIGN_OR_RETURN(Tensor pixels,
                          be.empty(be.activation_dtype(), {reference.height, reference.width, 3}));
    FLUX_RETURN_IF_ERROR(be.upload(unit.data(), DType::kF32, pixels));
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

absl::Status Pipeline::validate_references(const GenerateParams& params) const {
  for (size_t i = 0; i < params.references.size(); ++i) {
    FLUX_RETURN_IF_ERROR(check_prepared_reference(params.references[i], info_.pixel_multiple,
                                                  absl::StrCat("reference_images[", i, "]")));
  }
  return absl::OkStatus();
}

absl::Status Pipeline::validate(const GenerateParams& params) const {
  const int64_t multiple = info_.pixel_multiple;
  FLUX_RETURN_IF_ERROR(validate_references(params));
  const ImageSize size = output_size(params);
  for (auto [name, value] : {std::pair<const char*, int64_t>{"width", size.width},
                             std::pair<const char*, int64_t>{"height", size.height}}) {
    if (value < multiple || value % multiple != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", value, " is not a positive multiple of ", multiple));
    }
  }
  if (params.num_inference_steps < 0 || params.num_inference_steps > kMaxSteps) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_inference_steps: ", params.num_inference_steps, " is outside 1..",
                     kMaxSteps, " (0 = default)"));
  }
  if (!std::isfinite(params.guidance_scale) ||
      (params.guidance_scale >= 0.0 && params.guidance_scale > kMaxGuidance)) {
    return absl::InvalidArgumentError(
        absl::StrCat("guidance_scale: ", exact_decimal(params.guidance_scale),
                     " is not a finite value in 0..", kMaxGuidance));
  }
  if (!params.negative_prompt.empty() && !info_.uses_cfg) {
    return absl::InvalidArgumentError(absl::StrCat(
        "negative_prompt: ", info_.model_name, " (", info_.variant,
        ") runs without classifier-free guidance, so a negative prompt does not apply"));
  }
  if (params.quality == Quality::kHigh && !info_.quality_high) {
    return absl::InvalidArgumentError(
        "quality: QUALITY_HIGH is not enabled for this model (load it with quality=high enabled)");
  }
  if (params.max_sequence_length < 0 || params.max_sequence_length > info_.max_sequence_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_sequence_length: ", params.max_sequence_length, " is outside 1..",
                     info_.max_sequence_length, " (0 = default)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<GeneratedImage> Pipeline::generate(const GenerateParams& params,
                                                  const GenerateHooks& hooks) const {
  FLUX_RETURN_IF_ERROR(validate(params));
  Backend& be = backend_;
  const RequestOptions request{params.quality, params.fast_paths};
  const RequestScope request_scope(be, request);  // every op of this request runs under it
  const DType act = be.activation_dtype();
  const Flux2Config& flux = transformer_->config();
  const int64_t steps =
      params.num_inference_steps > 0 ? params.num_inference_steps : info_.default_steps;
  const double guidance =
      params.guidance_scale >= 0.0 ? params.guidance_scale : info_.default_guidance;
  const int64_t max_length =
      params.max_sequence_length > 0 ? params.max_sequence_length : info_.max_sequence_length;
  const bool cfg = info_.uses_cfg && guidance > 1.0;
  const ImageSize size = output_size(params);
  const int64_t h = size.height / info_.pixel_multiple, w = size.width / info_.pixel_multiple;
  const int64_t n = h * w, channels = flux.in_channels;
  int64_t reference_tokens = 0;  // R: every reference's tokens, in order
  for (const RgbImage& reference : params.references) {
    reference_tokens +=
        (reference.height / info_.pixel_multiple) * (reference.width / info_.pixel_multiple);
  }

  GeneratedImage image;
  image.width = size.width;
  image.height = size.height;
  image.seed = params.seed;
  StageTimings& timings = image.timings;

  // The noise depends only on the seed and the size: where the backend's ops run asynchronously
  // (the GPU) a host thread draws it while this one tokenizes and enqueues the text encoder (it
  // takes longer than the device's text encode at 1024x1024); on the CPU it is drawn in line.
  auto draw_noise = [&](std::launch policy) {
    return std::async(policy, draw_packed_noise, act, params.seed, channels, n);
  };
  std::future<std::pair<std::vector<float>, double>> noise_draw;
  try {
    noise_draw =
        draw_noise(be.device() == Device::kCuda ? std::launch::async : std::launch::deferred);
  } catch (const std::system_error&) {  // no thread to be had: draw it in line
    noise_draw = draw_noise(std::launch::deferred);
  }

  // Text: prompt (and the negative prompt for CFG) -> prompt embeddings [L, J].
  Clock::time_point start = Clock::now();
  const TokenizedPrompt tokens =
      tokenize_prompt(*tokenizer_, prompt_format_, params.prompt, max_length);
  TokenizedPrompt negative_tokens;
  if (cfg) {
    negative_tokens =
        tokenize_prompt(*tokenizer_, prompt_format_, params.negative_prompt, max_length);
  }
  timings.tokenize = seconds_since(start);
  start = Clock::now();
  // The text encoder always runs at lossless numerics (quality=high is the transformer's and the
  // VAE's), so the prompt cache may serve both qualities.
  std::optional<RequestScope> text_scope(std::in_place, be, request.at_lossless());
  if (hooks.check_continue) FLUX_RETURN_IF_ERROR(hooks.check_continue());
  FLUX_ASSIGN_OR_RETURN(Tensor prompt_embeds, prompt_embeddings(tokens, &image.prompt_cache_hit));
  if (hooks.on_prompt_embeds) hooks.on_prompt_embeds(prompt_embeds);
  Tensor negative_embeds;
  if (cfg) {
    bool negative_hit = false;
    FLUX_ASSIGN_OR_RETURN(negative_embeds, prompt_embeddings(negative_tokens, &negative_hit));
  }
  text_scope.reset();
  // The noise, drawn meanwhile (or now, on the CPU).
  std::vector<float> packed;
  std::tie(packed, timings.noise) = noise_draw.get();
  if (static_cast<int64_t>(packed.size()) != channels * n)
    return absl::InternalError("noise generation failed");
  FLUX_RETURN_IF_ERROR(be.synchronize());
  timings.text_encode = seconds_since(start);  // text encoding, overlapped with drawing the noise

  // The transformer's input: the noisy latents [N, 128], then the reference tokens [R, 128].
  FLUX_ASSIGN_OR_RETURN(Tensor model_input, be.empty(act, {n + reference_tokens, channels}));
  const Tensor latents = model_input.row_slice(0, n);
  std::optional<Flux2References> references;
  if (reference_tokens > 0) {
    // References: VAE-encoded once per request, under the request's quality.
    if (hooks.check_continue) FLUX_RETURN_IF_ERROR(hooks.check_continue());
    start = Clock::now();
    references.emplace();
    references->kv_cache = info_.uses_kv_cache;
    FLUX_ASSIGN_OR_RETURN(
        references->ids,
        encode_references(params.references, model_input.row_slice(n, reference_tokens)));
    FLUX_RETURN_IF_ERROR(be.synchronize());
    timings.reference_encode = seconds_since(start);
    if (hooks.on_references) {
      hooks.on_references(model_input.row_slice(n, reference_tokens), references->ids);
    }
  }

  start = Clock::now();
  FLUX_RETURN_IF_ERROR(be.upload(packed.data(), DType::kF32, latents));
  if (hooks.on_latents) hooks.on_latents(-1, latents);

  // Schedule and per-request conditioning (modulation for every step, RoPE tables).
  const Schedule schedule = make_schedule(scheduler_config_, steps, n);
  std::vector<float> model_timesteps(static_cast<size_t>(steps));
  for (int64_t i = 0; i < steps; ++i) {
    model_timesteps[i] = round_to_activation(
        round_to_activation(schedule.timesteps[i], act) / 1000.0f, act);  // timestep / 1000
  }
  std::vector<float> guidance_values;
  if (flux.guidance_embeds)
    guidance_values.assign(static_cast<size_t>(steps), static_cast<float>(guidance));
  const std::vector<int64_t> txt_ids = flux2_text_ids(prompt_embeds.rows());
  const std::vector<int64_t> img_ids = flux2_image_ids(h, w);
  const Flux2References* refs = references ? &*references : nullptr;
  FLUX_ASSIGN_OR_RETURN(Flux2Conditioning cond,
                        transformer_->prepare(prompt_embeds, txt_ids, img_ids, model_timesteps,
                                              guidance_values, refs));
  Flux2Conditioning negative_cond;
  if (cfg) {  // the references ride in both branches
    FLUX_ASSIGN_OR_RETURN(negative_cond,
                          transformer_->prepare(negative_embeds, txt_ids, img_ids, model_timesteps,
                                                guidance_values, refs));
  }
  FLUX_ASSIGN_OR_RETURN(Tensor velocity, be.empty(act, {n, channels}));
  Tensor negative_velocity;
  if (cfg) {
    FLUX_ASSIGN_OR_RETURN(negative_velocity, be.empty(act, {n, channels}));
  }

  for (int64_t i = 0; i < steps; ++i) {
    if (hooks.check_continue) FLUX_RETURN_IF_ERROR(hooks.check_continue());
    const Clock::time_point step_start = Clock::now();
    // [latents; references], but the latents alone once klein-KV cached the references' K/V.
    const Tensor& x = cond.kv != nullptr && i > 0 ? latents : model_input;
    FLUX_RETURN_IF_ERROR(transformer_->forward(cond, i, x, velocity));  // [N, 128]
    if (cfg) {
      FLUX_RETURN_IF_ERROR(transformer_->forward(negative_cond, i, x, negative_velocity));
      FLUX_RETURN_IF_ERROR(
          be.cfg_combine(negative_velocity, velocity, static_cast<float>(guidance), velocity));
    }
    FLUX_RETURN_IF_ERROR(be.euler_step(latents, velocity, schedule.dt(i)));  // [N, 128]
    FLUX_RETURN_IF_ERROR(be.synchronize());
    const double step_seconds = seconds_since(step_start);
    timings.steps.push_back(step_seconds);
    if (hooks.on_latents) hooks.on_latents(i, latents);
    if (hooks.on_step) hooks.on_step(i, steps, step_seconds);
  }
  timings.denoise = seconds_since(start);
  // The transformer's workspace (and klein-KV's cache) go back before the VAE decode, so the
  // request's peak is the larger of the two stages, not their sum (FLUX.2-dev at 1024x1024 on a
  // 141 GB device: 100.25 GB with both held).
  cond = Flux2Conditioning{};
  negative_cond = Flux2Conditioning{};
  velocity = Tensor{};
  negative_velocity = Tensor{};

  // Decode: BatchNorm de-normalisation, unpatchify, VAE decoder, uint8.
  if (hooks.check_continue) FLUX_RETURN_IF_ERROR(hooks.check_continue());
  start = Clock::now();
  FLUX_ASSIGN_OR_RETURN(Tensor pixels, vae_->decode_tokens(latents, h, w));  // [H, W, 3]
  if (hooks.on_image) hooks.on_image(pixels);
  image.rgb.resize(static_cast<size_t>(pixels.numel()));
  FLUX_RETURN_IF_ERROR(be.to_rgb8(pixels, image.rgb.data()));
  timings.decode = seconds_since(start);
  if (static_cast<int64_t>(image.rgb.size()) != size.width * size.height * 3) {
    return absl::InternalError("decoded image has the wrong size");
  }
  return image;
}

}  // namespace flux2
