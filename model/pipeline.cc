// The FLUX.2 pipelines (klein, klein-KV, dev): loading with a memory plan, and generation; see
// pipeline.h. Tested by `flux2 check-golden --only pipeline` and tests/host/pipeline_test.cc.
#include "model/pipeline.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/base/decimal.h"
#include "kernels/base/elapsed.h"
#include "kernels/base/parallel.h"
#include "kernels/base/status.h"
#include "model/bfl_checkpoint.h"
#include "model/checkpoint.h"
#include "model/flux2_presets.h"
#include "model/json_util.h"
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

// Runs one component's load (`load` returns the bytes it holds) between its two progress reports.
absl::Status load_component(const LoadProgressFn& progress, const char* component,
                            int64_t planned_bytes,
                            const std::function<absl::StatusOr<int64_t>()>& load) {
  if (progress) progress(LoadProgress{component, planned_bytes, -1.0});
  const Clock::time_point start = Clock::now();
  FLUX_ASSIGN_OR_RETURN(const int64_t bytes, load());
  if (progress) progress(LoadProgress{component, bytes, seconds_since(start)});
  return absl::OkStatus();
}

absl::StatusOr<int64_t> load_tokenizer(const std::string& dir, std::unique_ptr<Tokenizer>& out) {
  FLUX_ASSIGN_OR_RETURN(out, Tokenizer::load(dir));
  return 0;
}

constexpr int64_t kPatchChannels = 4;  // 2x2 patch: packed channels = 4 x latent channels

std::string model_name_of(const std::string& model_dir) {
  std::filesystem::path path = std::filesystem::path(model_dir).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();
  // A directory called "checkpoint" (as in tests/data/<model>/checkpoint) is named by its parent.
  if (path.filename() == "checkpoint" && !path.parent_path().filename().empty()) {
    return path.parent_path().filename().string();
  }
  return path.filename().string();
}

constexpr char kDevClass[] = "Flux2Pipeline";

// The hidden-state taps of each text encoder (diffusers' text_encoder_out_layers).
std::vector<int64_t> text_encoder_taps(bool dev) {
  return dev ? std::vector<int64_t>{10, 20, 30} : std::vector<int64_t>{9, 18, 27};
}

// transformer/, or options.transformer_file (a BFL single file) with transformer/config.json (dev
// without one: the published shapes).
absl::StatusOr<ComponentWeights> open_transformer(const std::string& model_dir,
                                                  const PipelineOptions& options, bool dev) {
  if (options.transformer_file.empty()) return ComponentWeights::open(model_dir + "/transformer");
  FLUX_ASSIGN_OR_RETURN(const bool bfl, is_bfl_transformer_file(options.transformer_file));
  if (!bfl) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.transformer_file,
        ": not a Black Forest Labs FLUX.2 transformer (no double_blocks.0.img_attn.qkv.weight); "
        "diffusers-named weights belong in ",
        model_dir, "/transformer/"));
  }
  // Its config: transformer/config.json when the directory has one; a dev directory without a
  // transformer/ folder (a ComfyUI-style layout) takes the published FLUX.2-dev shapes.
  std::string config_path = model_dir + "/transformer/config.json";
  nlohmann::json config;
  if (std::filesystem::exists(config_path) || !dev) {
    FLUX_ASSIGN_OR_RETURN(config, read_json_file(config_path));
  } else {
    FLUX_ASSIGN_OR_RETURN(const Flux2Config preset, flux2_preset("dev"));
    config = flux2_config_json(preset);
    config_path = "the published FLUX.2-dev transformer config (flux2_preset dev)";
  }
  return open_bfl_transformer(options.transformer_file, std::move(config), config_path);
}

// Every tensor of `weights` at `value_bytes` bytes per value (all of them are loaded).
int64_t component_bytes(const ComponentWeights& weights, int64_t value_bytes) {
  int64_t values = 0;
  for (const auto& [name, ref] : weights.tensors()) values += shape_numel(ref.entry->shape);
  return values * value_bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Pipeline>> Pipeline::load(Backend& backend,
                                                         const std::string& model_dir,
                                                         const PipelineOptions& options) {
  const Clock::time_point start = Clock::now();
  FLUX_ASSIGN_OR_RETURN(ModelIndex index, ModelIndex::read(model_dir));
  // The served classes are exactly those with a prompt format (chat_template.h).
  if (!prompt_format_for_pipeline(index.class_name).ok()) {
    return absl::UnimplementedError(
        absl::StrCat(model_dir, "/model_index.json: pipeline class \"", index.class_name,
                     "\" is not served; only Flux2Pipeline (FLUX.2-dev), Flux2KleinPipeline and "
                     "Flux2KleinKVPipeline (FLUX.2-klein) checkpoints are"));
  }
  const bool dev = index.class_name == kDevClass;
  const bool kv_cache =
      !dev && options.kv_cache.value_or(index.class_name == "Flux2KleinKVPipeline");
  const bool is_distilled = options.is_distilled.value_or(index.is_distilled || kv_cache);
  if (kv_cache && !is_distilled) {
    return absl::InvalidArgumentError(absl::StrCat(
        model_dir, ": klein-KV runs distilled checkpoints only (Flux2KleinKVPipeline has no CFG)"));
  }
  std::unique_ptr<Pipeline> pipeline(new Pipeline(backend));
  pipeline->describe(model_dir, model_name_of(model_dir), dev ? kDevClass : index.class_name,
                     is_distilled, kv_cache);

  const std::string scheduler_path = model_dir + "/scheduler/scheduler_config.json";
  FLUX_ASSIGN_OR_RETURN(nlohmann::json scheduler_json, read_json_file(scheduler_path));
  FLUX_ASSIGN_OR_RETURN(pipeline->scheduler_config_,
                        SchedulerConfig::from_json(scheduler_json, scheduler_path));
  FLUX_RETURN_IF_ERROR(load_component(options.on_progress, "tokenizer", 0, [&] {
    return load_tokenizer(model_dir + "/tokenizer", pipeline->tokenizer_);
  }));

  // The memory plan, from the tensor shapes, before anything is allocated.
  FLUX_ASSIGN_OR_RETURN(ComponentWeights text_weights,
                        ComponentWeights::open(model_dir + "/text_encoder"));
  FLUX_ASSIGN_OR_RETURN(ComponentWeights transformer_weights,
                        open_transformer(model_dir, options, dev));
  FLUX_ASSIGN_OR_RETURN(ComponentWeights vae_weights, ComponentWeights::open(model_dir + "/vae"));
  const std::vector<int64_t> taps = text_encoder_taps(dev);
  const int64_t value_bytes = dtype_size(backend.weight_dtype());
  MemoryPlan plan;
  FLUX_ASSIGN_OR_RETURN(
      std::tie(plan.text_encoder_device, plan.text_encoder_host),
      TextEncoder::planned_bytes(text_weights, taps, options.text_encoder_residency, value_bytes));
  plan.transformer = component_bytes(transformer_weights, value_bytes);
  plan.vae = component_bytes(vae_weights, value_bytes);
  plan.fp8 = options.enable_quality_high ? plan.transformer / 2 : 0;
  plan.prompt_cache = options.prompt_cache_bytes;
  plan.working = kWorkingBytes;
  FLUX_RETURN_IF_ERROR(check_memory_plan(
      plan, backend.free_device_bytes(), model_dir,
      options.text_encoder_residency == WeightResidency::kStreamed, "--text-encoder-offload"));

  Pipeline& p = *pipeline;
  FLUX_RETURN_IF_ERROR(load_component(
      options.on_progress, "text_encoder", plan.text_encoder_device + plan.text_encoder_host,
      [&]() -> absl::StatusOr<int64_t> {
        FLUX_ASSIGN_OR_RETURN(p.text_encoder_, TextEncoder::load(backend, text_weights, taps,
                                                                 options.text_encoder_residency));
        return p.text_encoder_->device_bytes() + p.text_encoder_->host_bytes();
      }));
  FLUX_RETURN_IF_ERROR(load_component(
      options.on_progress, "transformer", plan.transformer, [&]() -> absl::StatusOr<int64_t> {
        FLUX_ASSIGN_OR_RETURN(p.transformer_, Flux2Transformer::load(backend, transformer_weights));
        return p.transformer_->load_report().device_bytes;
      }));
  FLUX_RETURN_IF_ERROR(
      load_component(options.on_progress, "vae", plan.vae, [&]() -> absl::StatusOr<int64_t> {
        FLUX_ASSIGN_OR_RETURN(p.vae_, VaeDecoder::load(backend, vae_weights));
        FLUX_ASSIGN_OR_RETURN(p.vae_encoder_, VaeEncoder::load(backend, vae_weights));
        return p.vae_->device_bytes() + p.vae_encoder_->device_bytes();
      }));

  pipeline->prompt_cache_ = PromptCache(options.prompt_cache_bytes);
  FLUX_RETURN_IF_ERROR(
      pipeline->finish_load(model_dir, options.enable_quality_high, start, options.on_progress));
  return pipeline;
}

std::string describe(const LoadProgress& progress) {
  const std::string bytes = progress.bytes >= 1e9 ? absl::StrFormat("%.3f GB", progress.bytes / 1e9)
                            : progress.bytes > 0  ? absl::StrFormat("%.1f MB", progress.bytes / 1e6)
                                                  : "";
  if (progress.seconds < 0) {
    return absl::StrCat("loading ", progress.component,
                        bytes.empty() ? "" : absl::StrCat(" (", bytes, ")"));
  }
  const std::string rate =
      progress.bytes > 0 && progress.seconds > 0
          ? absl::StrFormat(" (%.2f GB/s)", progress.bytes / 1e9 / progress.seconds)
          : "";
  return absl::StrCat("loaded ", progress.component, bytes.empty() ? "" : ": " + bytes,
                      absl::StrFormat(" in %.2f s", progress.seconds), rate);
}

std::string PipelineInfo::load_summary() const {
  return absl::StrFormat(
      "loaded %s (%s) on %s in %.2f s: text_encoder %.3f GB, transformer %.3f GB, vae %.3f GB%s",
      model_name, variant, backend, load_seconds, text_encoder_bytes / 1e9, transformer_bytes / 1e9,
      vae_bytes / 1e9,
      absl::StrCat(absl::StrFormat(", text encoder %s %.3f GB of host memory",
                                   text_encoder_streamed ? "streamed from" : "embedding in",
                                   text_encoder_host_bytes / 1e9),
                   quality_high
                       ? absl::StrFormat(", fp8 copies for quality=high %.3f GB", fp8_bytes / 1e9)
                       : ""));
}

absl::Status Pipeline::connect_components(const std::string& source) {
  const Flux2Config& flux = transformer_->config();
  const int64_t text_width =
      text_encoder_->config().hidden_size * static_cast<int64_t>(text_encoder_->taps().size());
  if (text_width != flux.joint_attention_dim) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the text encoder yields ", text_width,
                                                   " channels per token but the transformer's ",
                                                   "joint_attention_dim is ",
                                                   flux.joint_attention_dim));
  }
  const VaeConfig& vae = vae_->config();
  if (vae.latent_channels * kPatchChannels != flux.in_channels ||
      flux.in_channels != flux.out_channels) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": VAE latent_channels ", vae.latent_channels,
                     " x 4 does not match the transformer's ", flux.in_channels, " in / ",
                     flux.out_channels, " out channels"));
  }
  info_.pixel_multiple = 2 * vae.scale_factor();
  info_.text_encoder_bytes = text_encoder_->device_bytes();
  info_.text_encoder_host_bytes = text_encoder_->host_bytes();
  info_.text_encoder_streamed = text_encoder_->residency() == WeightResidency::kStreamed;
  info_.prompt_cache_bytes = prompt_cache_.capacity_bytes();
  info_.transformer_bytes = transformer_->load_report().device_bytes;
  info_.vae_bytes = vae_->device_bytes() + vae_encoder_->device_bytes();
  info_.device_bytes = info_.text_encoder_bytes + info_.transformer_bytes + info_.vae_bytes;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Pipeline>> Pipeline::create_random(Backend& backend,
                                                                  const RandomPipelineSpec& spec) {
  const Clock::time_point start = Clock::now();
  std::unique_ptr<Pipeline> pipeline(new Pipeline(backend));
  pipeline->describe("(random weights)", spec.name, spec.pipeline_class,
                     spec.is_distilled || spec.kv_cache, spec.kv_cache);
  FLUX_RETURN_IF_ERROR(load_component(spec.on_progress, "tokenizer", 0, [&] {
    return load_tokenizer(spec.tokenizer_dir, pipeline->tokenizer_);
  }));
  Pipeline& p = *pipeline;
  FLUX_RETURN_IF_ERROR(
      load_component(spec.on_progress, "text_encoder", 0, [&]() -> absl::StatusOr<int64_t> {
        FLUX_ASSIGN_OR_RETURN(p.text_encoder_,
                              TextEncoder::create_random(backend, spec.text_encoder, spec.taps,
                                                         spec.seed, spec.text_encoder_residency));
        return p.text_encoder_->device_bytes() + p.text_encoder_->host_bytes();
      }));
  pipeline->prompt_cache_ = PromptCache(spec.prompt_cache_bytes);
  FLUX_RETURN_IF_ERROR(
      load_component(spec.on_progress, "transformer", 0, [&]() -> absl::StatusOr<int64_t> {
        FLUX_ASSIGN_OR_RETURN(p.transformer_, Flux2Transformer::create_random(
                                                  backend, spec.transformer, spec.seed + 1));
        return p.transformer_->load_report().device_bytes;
      }));
  FLUX_RETURN_IF_ERROR(load_component(spec.on_progress, "vae", 0, [&]() -> absl::StatusOr<int64_t> {
    FLUX_ASSIGN_OR_RETURN(p.vae_, VaeDecoder::create_random(backend, spec.vae, spec.seed + 2));
    FLUX_ASSIGN_OR_RETURN(p.vae_encoder_,
                          VaeEncoder::create_random(backend, spec.vae, spec.seed + 3));
    return p.vae_->device_bytes() + p.vae_encoder_->device_bytes();
  }));
  FLUX_RETURN_IF_ERROR(
      pipeline->finish_load(spec.name, spec.enable_quality_high, start, spec.on_progress));
  return pipeline;
}

void Pipeline::describe(const std::string& model_dir, const std::string& model_name,
                        const std::string& pipeline_class, bool is_distilled, bool kv_cache) {
  const bool dev = pipeline_class == kDevClass;
  info_.model_dir = model_dir;
  info_.model_name = model_name;
  info_.pipeline_class = pipeline_class;
  info_.guidance_embedded = dev;
  info_.is_distilled = !dev && is_distilled;
  info_.uses_cfg = !dev && !is_distilled;
  info_.uses_kv_cache = kv_cache;
  info_.variant = dev            ? "dev"
                  : kv_cache     ? "klein-kv"
                  : is_distilled ? "klein-distilled"
                                 : "klein-base";
  info_.default_steps = info_.is_distilled ? 4 : 50;
  info_.default_guidance = 4.0;
  info_.backend = std::string(backend_.name());
  info_.device_pci_bus_id = backend_.device_pci_bus_id();
  // load() and the random presets pass served classes only.
  prompt_format_ = prompt_format_for_pipeline(pipeline_class).value_or(PromptFormat::kQwen3Chat);
}

absl::Status Pipeline::finish_load(const std::string& source, bool enable_quality_high,
                                   std::chrono::steady_clock::time_point start,
                                   const LoadProgressFn& progress) {
  FLUX_RETURN_IF_ERROR(connect_components(source));
  if (enable_quality_high) {
    FLUX_RETURN_IF_ERROR(load_component(
        progress, "fp8_weights", info_.transformer_bytes / 2, [&]() -> absl::StatusOr<int64_t> {
          FLUX_ASSIGN_OR_RETURN(info_.fp8_bytes, transformer_->enable_quality_high());
          return info_.fp8_bytes;
        }));
    info_.quality_high = true;
  }
  info_.load_seconds = seconds_since(start);
  return absl::OkStatus();
}

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
  if (params.num_inference_steps < 0 || params.num_inference_steps > kMaxInferenceSteps) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_inference_steps: ", params.num_inference_steps, " is outside 1..",
                     kMaxInferenceSteps, " (0 = default)"));
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

std::vector<FieldViolation> Pipeline::check(const GenerateParams& params) const {
  const absl::Status status = validate(params);
  if (status.ok()) return {};
  const absl::string_view message = status.message();
  const size_t colon = message.find(": ");
  if (colon == absl::string_view::npos) return {{"request", std::string(message)}};
  return {{std::string(message.substr(0, colon)), std::string(message.substr(colon + 2))}};
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
