// The FLUX.2 pipelines (klein, klein-KV, dev): loading with a memory plan (generation is
// pipeline_generate.cc); see pipeline.h. Tested by `flux2 check-golden --only pipeline` and
// tests/host/pipeline_test.cc.
#include "model/pipeline.h"

#include <chrono>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/base/elapsed.h"
#include "kernels/base/status.h"
#include "model/bfl_checkpoint.h"
#include "model/checkpoint.h"
#include "model/flux2_presets.h"
#include "model/json_util.h"
#include "model/text_encoder_checkpoint.h"
#include "model/transformer_checkpoint.h"
#include "model/weight_loader.h"

namespace flux2 {
namespace {

using Clock = std::chrono::steady_clock;

// Runs one component's load (`load` returns the bytes it holds) between its two progress reports.
// `source` says what it is read from (LoadProgress::source).
absl::Status load_component(const LoadProgressFn& progress, const char* component,
                            int64_t planned_bytes,
                            const std::function<absl::StatusOr<int64_t>()>& load,
                            const std::string& source = "") {
  if (progress) progress(LoadProgress{component, planned_bytes, -1.0, source});
  const Clock::time_point start = Clock::now();
  FLUX_ASSIGN_OR_RETURN(const int64_t bytes, load());
  if (progress) progress(LoadProgress{component, bytes, seconds_since(start), source});
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

// transformer/, or options.transformer_file (a BFL single file, bf16 or FP8, or a transformer
// folder) with transformer/config.json (dev without one: the published shapes).
absl::StatusOr<TransformerCheckpoint> open_transformer(const std::string& model_dir,
                                                       const PipelineOptions& options, bool dev) {
  if (options.transformer_file.empty()) return open_transformer_folder(model_dir + "/transformer");
  if (std::filesystem::is_directory(options.transformer_file))
    return open_transformer_folder(options.transformer_file);
  // Its config: transformer/config.json when the directory has one; a dev directory without a
  // transformer/ folder (a ComfyUI-style layout) takes the published FLUX.2-dev shapes.
  std::string config_path = model_dir + "/transformer/config.json";
  nlohmann::json config;
  if (std::filesystem::exists(config_path) || !dev) {
    FLUX_ASSIGN_OR_RETURN(config, read_json_file(config_path));
    // A ModelOpt transformer/ folder's config describes its own files, not this one.
    config.erase("quantization_config");
  } else {
    FLUX_ASSIGN_OR_RETURN(const Flux2Config preset, flux2_preset("dev"));
    config = flux2_config_json(preset);
    config_path = "the published FLUX.2-dev transformer config (flux2_preset dev)";
  }
  return open_transformer_file(options.transformer_file, std::move(config), config_path);
}

// text_encoder/, or options.text_encoder_file (one safetensors file, bf16 or FP8) with
// text_encoder/config.json.
absl::StatusOr<TextEncoderCheckpoint> open_text_encoder(const std::string& model_dir,
                                                        const PipelineOptions& options) {
  if (options.text_encoder_file.empty())
    return open_text_encoder_folder(model_dir + "/text_encoder");
  const std::string config_path = model_dir + "/text_encoder/config.json";
  FLUX_ASSIGN_OR_RETURN(nlohmann::json config, read_json_file(config_path));
  return open_text_encoder_file(options.text_encoder_file, std::move(config), config_path);
}

// Every tensor of `weights` at `value_bytes` bytes per value (all of them are loaded).
int64_t component_bytes(const ComponentWeights& weights, int64_t value_bytes) {
  int64_t values = 0;
  for (const auto& [name, ref] : weights.tensors()) values += shape_numel(ref.entry->shape);
  return values * value_bytes;
}

// The memory plan's transformer and FP8 bytes: a bf16 checkpoint's values, plus an estimated half
// for quality=high's copies; an FP8 checkpoint's projections as stored (FP8 bytes and row scales)
// with --fp8-lossless=per_layer, else their values plus, at quality=high, their stored bytes.
absl::Status plan_transformer(const TransformerCheckpoint& checkpoint,
                              const PipelineOptions& options, int64_t value_bytes,
                              MemoryPlan& plan) {
  const ComponentWeights& weights = checkpoint.weights;
  if (checkpoint.fp8_layout == Fp8Layout::kNone) {
    plan.transformer = component_bytes(weights, value_bytes);
    plan.fp8 = options.enable_quality_high ? plan.transformer / 2 : 0;
    return absl::OkStatus();
  }
  FLUX_ASSIGN_OR_RETURN(const Flux2Config config,
                        Flux2Config::from_json(weights.config(), weights.config_path()));
  Flux2Weights shapes;
  const std::vector<WeightSpec> table = shapes.table(config);
  const std::set<const Weight*> stored = stored_fp8_weights(weights, table);
  const int64_t as_stored = planned_weight_bytes(table, stored, value_bytes).device;
  const int64_t as_values = planned_weight_bytes(table, {}, value_bytes).device;
  int64_t codes = 0;  // the stored projections' FP8 bytes and row scales
  for (const WeightSpec& spec : table) {
    if (spec.fp8 != nullptr && stored.count(spec.fp8) != 0)
      codes += shape_numel(spec.shape) + spec.shape[0] * int64_t{4};
  }
  const bool per_layer = options.fp8_lossless == Fp8Lossless::kPerLayer;
  plan.transformer = per_layer ? as_stored : as_values;
  // quality=high runs on the stored codes: kept beside the values (resident), or the weights.
  plan.fp8 = options.enable_quality_high && !per_layer ? codes : 0;
  return absl::OkStatus();
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
  pipeline->lora_cache_.set_capacity(options.lora_cache_bytes);
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
  FLUX_ASSIGN_OR_RETURN(const TextEncoderCheckpoint text_checkpoint,
                        open_text_encoder(model_dir, options));
  const ComponentWeights& text_weights = text_checkpoint.weights;
  FLUX_ASSIGN_OR_RETURN(TransformerCheckpoint transformer_checkpoint,
                        open_transformer(model_dir, options, dev));
  const ComponentWeights& transformer_weights = transformer_checkpoint.weights;
  FLUX_RETURN_IF_ERROR(check_fp8_input_scale(options.fp8_input_scale, options.enable_quality_high,
                                             transformer_checkpoint.fp8_layout != Fp8Layout::kNone,
                                             transformer_checkpoint.format,
                                             count_input_scales(transformer_weights)));
  pipeline->info_.transformer_format = transformer_checkpoint.format;
  pipeline->info_.transformer_checkpoint_bytes = transformer_checkpoint.checkpoint_bytes;
  pipeline->info_.fp8_lossless = options.fp8_lossless;
  pipeline->info_.text_encoder_format = text_checkpoint.format;
  pipeline->info_.text_encoder_checkpoint_bytes = text_checkpoint.checkpoint_bytes;
  FLUX_ASSIGN_OR_RETURN(ComponentWeights vae_weights, ComponentWeights::open(model_dir + "/vae"));
  const std::vector<int64_t> taps = text_encoder_taps(dev);
  const int64_t value_bytes = dtype_size(backend.weight_dtype());
  MemoryPlan plan;
  FLUX_ASSIGN_OR_RETURN(
      std::tie(plan.text_encoder_device, plan.text_encoder_host),
      TextEncoder::planned_bytes(text_weights, taps, options.text_encoder_residency, value_bytes));
  FLUX_RETURN_IF_ERROR(plan_transformer(transformer_checkpoint, options, value_bytes, plan));
  plan.vae = component_bytes(vae_weights, value_bytes);
  plan.prompt_cache = options.prompt_cache_bytes;
  plan.lora_cache = options.lora_cache_bytes;
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
      },
      text_checkpoint.describe()));
  FLUX_RETURN_IF_ERROR(load_component(
      options.on_progress, "transformer", plan.transformer,
      [&]() -> absl::StatusOr<int64_t> {
        // An FP8 checkpoint's projections go up as stored (1 byte a value); finish_load makes
        // their values on the device for --fp8-lossless=resident.
        FLUX_ASSIGN_OR_RETURN(
            p.transformer_,
            Flux2Transformer::load(backend, transformer_weights,
                                   transformer_checkpoint.fp8_layout == Fp8Layout::kNone
                                       ? Fp8Placement::kDequantized
                                       : Fp8Placement::kStored));
        return p.transformer_->load_report().device_bytes;
      },
      transformer_checkpoint.describe()));
  FLUX_RETURN_IF_ERROR(
      load_component(options.on_progress, "vae", plan.vae, [&]() -> absl::StatusOr<int64_t> {
        FLUX_ASSIGN_OR_RETURN(p.vae_, VaeDecoder::load(backend, vae_weights));
        FLUX_ASSIGN_OR_RETURN(p.vae_encoder_, VaeEncoder::load(backend, vae_weights));
        return p.vae_->device_bytes() + p.vae_encoder_->device_bytes();
      }));

  pipeline->prompt_cache_ = PromptCache(options.prompt_cache_bytes);
  FLUX_RETURN_IF_ERROR(pipeline->finish_load(model_dir, options.enable_quality_high,
                                             options.fp8_input_scale, start, options.on_progress));
  return pipeline;
}

std::string describe(const LoadProgress& progress) {
  const std::string bytes = progress.bytes >= 1e9 ? absl::StrFormat("%.3f GB", progress.bytes / 1e9)
                            : progress.bytes > 0  ? absl::StrFormat("%.1f MB", progress.bytes / 1e6)
                                                  : "";
  if (progress.seconds < 0) {
    return absl::StrCat("loading ", progress.component,
                        bytes.empty() ? "" : absl::StrCat(" (", bytes, ")"),
                        progress.source.empty() ? "" : " from " + progress.source);
  }
  const std::string rate =
      progress.bytes > 0 && progress.seconds > 0
          ? absl::StrFormat(" (%.2f GB/s)", progress.bytes / 1e9 / progress.seconds)
          : "";
  return absl::StrCat("loaded ", progress.component, bytes.empty() ? "" : ": " + bytes,
                      absl::StrFormat(" in %.2f s", progress.seconds), rate,
                      progress.source.empty() ? "" : " from " + progress.source);
}

std::string PipelineInfo::load_summary() const {
  return absl::StrFormat(
      "loaded %s (%s) on %s in %.2f s: text_encoder %.3f GB, transformer %.3f GB (from %s), vae "
      "%.3f GB%s",
      model_name, variant, backend, load_seconds, text_encoder_bytes / 1e9, transformer_bytes / 1e9,
      transformer_format, vae_bytes / 1e9,
      absl::StrCat(absl::StrFormat(", text encoder %s %.3f GB of host memory",
                                   text_encoder_streamed ? "streamed from" : "embedding in",
                                   text_encoder_host_bytes / 1e9),
                   quality_high ? absl::StrFormat(", fp8 copies for quality=high %.3f GB (%s)",
                                                  fp8_bytes / 1e9, fp8_gemms_summary())
                                : ""));
}

std::string PipelineInfo::fp8_gemms_summary() const {
  if (fp8_input_scale == Fp8InputScale::kDynamic) {
    return absl::StrFormat("%d FP8 GEMMs, activations per token", fp8_gemms);
  }
  return absl::StrFormat(
      "%d FP8 GEMMs, --fp8-input-scale static: %d under the checkpoint's input_scale, %d per "
      "token",
      fp8_gemms, fp8_static_scale_gemms, fp8_gemms - fp8_static_scale_gemms);
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
  info_.hard_limits.pixel_multiple = info_.pixel_multiple;
  info_.hard_limits.max_pixels = kMaxImageTokens * info_.pixel_multiple * info_.pixel_multiple;
  info_.hard_limits.max_sequence_length = info_.max_sequence_length;
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
  // The random FP8 weights all carry an input scale (allocate_random_stored_fp8).
  FLUX_RETURN_IF_ERROR(
      check_fp8_input_scale(spec.fp8_input_scale, spec.enable_quality_high, spec.fp8_weights,
                            spec.fp8_weights ? "random_fp8" : "random", spec.fp8_weights ? 1 : 0));
  std::unique_ptr<Pipeline> pipeline(new Pipeline(backend));
  pipeline->describe("(random weights)", spec.name, spec.pipeline_class,
                     spec.is_distilled || spec.kv_cache, spec.kv_cache);
  pipeline->info_.fp8_lossless = spec.fp8_lossless;
  if (spec.fp8_weights) {
    pipeline->info_.transformer_format = "random_fp8";
    if (spec.text_encoder_residency == WeightResidency::kDevice)
      pipeline->info_.text_encoder_format = "random_fp8";
  }
  FLUX_RETURN_IF_ERROR(load_component(spec.on_progress, "tokenizer", 0, [&] {
    return load_tokenizer(spec.tokenizer_dir, pipeline->tokenizer_);
  }));
  Pipeline& p = *pipeline;
  FLUX_RETURN_IF_ERROR(
      load_component(spec.on_progress, "text_encoder", 0, [&]() -> absl::StatusOr<int64_t> {
        FLUX_ASSIGN_OR_RETURN(p.text_encoder_, TextEncoder::create_random(
                                                   backend, spec.text_encoder, spec.taps, spec.seed,
                                                   spec.text_encoder_residency, spec.fp8_weights));
        return p.text_encoder_->device_bytes() + p.text_encoder_->host_bytes();
      }));
  pipeline->prompt_cache_ = PromptCache(spec.prompt_cache_bytes);
  FLUX_RETURN_IF_ERROR(
      load_component(spec.on_progress, "transformer", 0, [&]() -> absl::StatusOr<int64_t> {
        FLUX_ASSIGN_OR_RETURN(p.transformer_,
                              Flux2Transformer::create_random(backend, spec.transformer,
                                                              spec.seed + 1, spec.fp8_weights));
        return p.transformer_->load_report().device_bytes;
      }));
  FLUX_RETURN_IF_ERROR(load_component(spec.on_progress, "vae", 0, [&]() -> absl::StatusOr<int64_t> {
    FLUX_ASSIGN_OR_RETURN(p.vae_, VaeDecoder::create_random(backend, spec.vae, spec.seed + 2));
    FLUX_ASSIGN_OR_RETURN(p.vae_encoder_,
                          VaeEncoder::create_random(backend, spec.vae, spec.seed + 3));
    return p.vae_->device_bytes() + p.vae_encoder_->device_bytes();
  }));
  FLUX_RETURN_IF_ERROR(pipeline->finish_load(spec.name, spec.enable_quality_high,
                                             spec.fp8_input_scale, start, spec.on_progress));
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
  info_.weight_value_bytes = dtype_size(backend_.weight_dtype());
  info_.device_pci_bus_id = backend_.device_pci_bus_id();
  // load() and the random presets pass served classes only.
  prompt_format_ = prompt_format_for_pipeline(pipeline_class).value_or(PromptFormat::kQwen3Chat);
}

absl::Status Pipeline::dequantize_stored_fp8(const LoadProgressFn& progress) {
  return load_component(
      progress, "fp8_dequantized", 0,
      [&]() -> absl::StatusOr<int64_t> {
        FLUX_ASSIGN_OR_RETURN(const DequantizedBytes bytes,
                              transformer_->dequantize_stored_weights());
        // The codes stay with quality=high's copies (which share them), else they are freed.
        info_.transformer_bytes += bytes.values - bytes.stored;
        if (info_.quality_high) info_.fp8_bytes += bytes.stored;
        info_.device_bytes += bytes.values - (info_.quality_high ? 0 : bytes.stored);
        return bytes.values;
      },
      "--fp8-lossless=resident");
}

absl::Status Pipeline::register_fp8_weights(Fp8InputScale input_scale,
                                            const LoadProgressFn& progress) {
  info_.fp8_input_scale = input_scale;
  LowPrecisionReport report;
  FLUX_RETURN_IF_ERROR(load_component(
      progress, "fp8_weights", info_.transformer_bytes / 2, [&]() -> absl::StatusOr<int64_t> {
        FLUX_ASSIGN_OR_RETURN(report, transformer_->enable_quality_high(input_scale));
        return report.device_bytes;
      }));
  info_.fp8_bytes = report.device_bytes;
  info_.fp8_gemms = report.gemms;
  info_.fp8_static_scale_gemms = report.static_scaled;
  info_.quality_high = true;
  return absl::OkStatus();
}

absl::Status Pipeline::finish_load(const std::string& source, bool enable_quality_high,
                                   Fp8InputScale input_scale,
                                   std::chrono::steady_clock::time_point start,
                                   const LoadProgressFn& progress) {
  FLUX_RETURN_IF_ERROR(connect_components(source));
  if (enable_quality_high) FLUX_RETURN_IF_ERROR(register_fp8_weights(input_scale, progress));
  // An FP8 checkpoint (or bench's random one): its projections were loaded as stored.
  const std::string& format = info_.transformer_format;
  const bool stored_fp8 = format != "diffusers" && format != "bfl" && format != "random";
  if (stored_fp8 && info_.fp8_lossless == Fp8Lossless::kResident)
    FLUX_RETURN_IF_ERROR(dequantize_stored_fp8(progress));
  const bool per_layer_fp8 = stored_fp8 && info_.fp8_lossless == Fp8Lossless::kPerLayer;
  info_.components = {
      {"text_encoder", info_.text_encoder_format, info_.text_encoder_bytes,
       info_.text_encoder_host_bytes, info_.text_encoder_checkpoint_bytes},
      {"transformer",
       per_layer_fp8 ? absl::StrCat(info_.transformer_format, " (stored fp8)")
                     : info_.transformer_format,
       info_.transformer_bytes, 0, info_.transformer_checkpoint_bytes},
      {"vae", info_.model_dir == "(random weights)" ? "random" : "diffusers", info_.vae_bytes, 0,
       0},
  };
  if (info_.quality_high) info_.components.push_back({"fp8_weights", "fp8", info_.fp8_bytes, 0, 0});
  info_.load_seconds = seconds_since(start);
  return absl::OkStatus();
}

absl::string_view fp8_lossless_name(Fp8Lossless mode) {
  return mode == Fp8Lossless::kPerLayer ? "per_layer" : "resident";
}

absl::StatusOr<Fp8Lossless> parse_fp8_lossless(absl::string_view text) {
  if (text == "resident") return Fp8Lossless::kResident;
  if (text == "per_layer") return Fp8Lossless::kPerLayer;
  return absl::InvalidArgumentError(
      absl::StrCat("--fp8-lossless \"", text, "\": expected resident or per_layer"));
}

}  // namespace flux2
