// flux2.v1 <-> serving core conversion; see request_conversion.h.
// Tested by tests/server/validate_test.cc and server_test.cc.
#include "server/grpc/request_conversion.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/fast_path_registry.h"
#include "server/common/gpus_flag.h"
#include "server/serving/field_violations.h"

namespace flux2::server {
namespace {

namespace v1 = flux2::v1;

v1::Quality to_proto(Quality quality) {
  return quality == Quality::kHigh ? v1::QUALITY_HIGH : v1::QUALITY_LOSSLESS;
}

// GenerateImageRequest.cache into `request` (its values checked by validate()).
void cache_from_proto(const v1::StepCache& proto, GenerateRequest* request,
                      std::vector<FieldViolation>* violations) {
  StepCacheOptions& cache = request->cache;
  switch (proto.mode()) {
    case v1::StepCache::MODE_UNSPECIFIED:
    case v1::StepCache::MODE_DBCACHE:
      cache.mode = StepCacheOptions::Mode::kDbCache;
      break;
    case v1::StepCache::MODE_SCHEDULE:
      cache.mode = StepCacheOptions::Mode::kSchedule;
      break;
    case v1::StepCache::MODE_OFF:
      return;
    default:
      violations->push_back(
          {"cache.mode", absl::StrCat(proto.mode(), " is not a known StepCache.Mode value")});
      return;
  }
  if (proto.has_warmup_steps()) cache.warmup_steps = proto.warmup_steps();
  if (proto.has_max_consecutive_cached()) {
    cache.max_consecutive_cached = proto.max_consecutive_cached();
  }
  if (proto.has_threshold()) cache.threshold = proto.threshold();
  cache.schedule.assign(proto.schedule().begin(), proto.schedule().end());
  if (proto.schedule_preset().empty()) return;
  if (proto.schedule_preset() != "dbcache-default") {
    violations->push_back(
        {"cache.schedule_preset", absl::StrCat("\"", proto.schedule_preset(),
                                               "\" is not a known preset (dbcache-default)")});
  } else if (!cache.schedule.empty()) {
    violations->push_back({"cache.schedule_preset", "give schedule or schedule_preset, not both"});
  } else {
    request->cache_default_schedule = true;
  }
}

}  // namespace

absl::StatusOr<GenerateRequest> request_from_proto(const v1::GenerateImageRequest& proto) {
  std::vector<FieldViolation> violations;
  GenerateRequest request;
  request.prompt = proto.prompt();
  request.negative_prompt = proto.negative_prompt();
  request.width = proto.width();
  request.height = proto.height();
  request.num_inference_steps = proto.num_inference_steps();
  if (proto.has_guidance_scale()) request.guidance_scale = proto.guidance_scale();
  if (proto.has_seed()) request.seed = proto.seed();
  if (!v1::Quality_IsValid(proto.quality())) {
    violations.push_back(
        {"quality", absl::StrCat(proto.quality(), " is not a known Quality value")});
  } else if (proto.quality() == v1::QUALITY_HIGH) {
    request.quality = Quality::kHigh;
  }
  if (!v1::OutputFormat_IsValid(proto.output_format())) {
    violations.push_back({"output_format", absl::StrCat(proto.output_format(),
                                                        " is not a known OutputFormat value")});
  } else if (proto.output_format() == v1::OUTPUT_FORMAT_JPEG) {
    request.output_format = ImageFormat::kJpeg;
  } else if (proto.output_format() == v1::OUTPUT_FORMAT_WEBP) {
    request.output_format = ImageFormat::kWebp;
  }
  if (proto.has_output_quality()) request.output_quality = proto.output_quality();
  request.num_images = proto.num_images();
  for (const v1::ReferenceImage& reference : proto.reference_images()) {
    request.reference_images.push_back(reference.data());
  }
  request.request_id = proto.request_id();
  for (const v1::LoraAdapter& lora : proto.loras()) {
    LoraSpec spec{lora.name(), std::nullopt};
    if (lora.has_scale()) spec.scale = lora.scale();
    request.loras.push_back(std::move(spec));
  }
  request.sigmas.assign(proto.sigmas().begin(), proto.sigmas().end());
  if (proto.has_cache()) cache_from_proto(proto.cache(), &request, &violations);
  if (!violations.empty()) return invalid_argument_status(violations);
  return request;
}

void cache_to_proto(const StepCacheCounts& counts, v1::StepCacheUsage* out) {
  out->set_double_computed(static_cast<int32_t>(counts.computed[0]));
  out->set_double_cached(static_cast<int32_t>(counts.cached[0]));
  out->set_single_computed(static_cast<int32_t>(counts.computed[1]));
  out->set_single_cached(static_cast<int32_t>(counts.cached[1]));
}

void set_image_metadata(const EncodedImage& image, v1::Image* out) {
  out->set_mime_type(std::string(image_mime_type(image.format)));
  out->set_width(static_cast<int32_t>(image.width));
  out->set_height(static_cast<int32_t>(image.height));
  out->set_seed(image.seed);
}

void fill_generate_response(const JobSpec& spec, JobResult&& result, const ServingModel& model,
                            double total_seconds, v1::GenerateImageResponse* response) {
  for (EncodedImage& image : result.images) {
    v1::Image* out = response->add_images();
    out->set_data(std::string(image.bytes.begin(), image.bytes.end()));
    set_image_metadata(image, out);
  }
  response->set_seed(spec.params.seed);
  const WorkerReport& report = result.report;
  v1::Timings* timings = response->mutable_timings();
  timings->set_queue_seconds(report.queue_seconds);
  timings->set_tokenize_seconds(report.tokenize_seconds);
  timings->set_text_encode_seconds(report.text_encode_seconds);
  timings->set_reference_encode_seconds(report.reference_encode_seconds);
  timings->set_denoise_seconds(report.denoise_seconds);
  for (double step : report.step_seconds) timings->add_step_seconds(step);
  timings->set_decode_seconds(report.decode_seconds);
  timings->set_encode_seconds(result.encode_seconds);
  timings->set_total_seconds(total_seconds);
  if (report.cache.enabled) cache_to_proto(report.cache, timings->mutable_cache());
  int64_t fallbacks = 0;
  for (const FastPathCounters& path : report.fast_paths) {
    v1::FastPathUsage* usage = response->add_fast_paths();
    usage->set_path(path.path);
    usage->set_invocations(path.invocations);
    for (const auto& [reason, count] : path.fallbacks) {
      (*usage->mutable_fallbacks())[reason] = count;
      fallbacks += count;
    }
  }
  response->set_fast_path_fallbacks(fallbacks);
  response->set_model_name(model.info.model_name);
  response->set_request_id(spec.request_id);
  response->set_quality(to_proto(spec.params.quality));
  for (const AppliedLora& lora : spec.loras) {
    v1::AppliedLora* out = response->add_loras();
    out->set_name(lora.name);
    out->set_scale(lora.scale);
    out->set_format(lora.layout);
    out->set_rank(static_cast<int32_t>(lora.max_rank));
    out->set_sha256_prefix(lora.sha256_prefix);
  }
}

namespace {

void fill_limits(const ServingModel& model, v1::Limits* limits) {
  const Limits& l = model.limits;
  limits->set_pixel_multiple(static_cast<int32_t>(l.pixel_multiple));
  limits->set_max_pixels(l.max_pixels);
  limits->set_max_steps(static_cast<int32_t>(l.max_steps));
  limits->set_min_guidance(l.min_guidance);
  limits->set_max_guidance(l.max_guidance);
  limits->set_max_images(static_cast<int32_t>(l.max_images));
  limits->set_max_prompt_bytes(static_cast<int32_t>(l.max_prompt_bytes));
  limits->set_max_sequence_length(static_cast<int32_t>(l.max_sequence_length));
  limits->set_queue_depth(model.facts.queue_depth);
  limits->set_max_reference_images(static_cast<int32_t>(l.max_reference_images));
  limits->set_max_reference_bytes(l.max_reference_bytes);
  limits->set_max_request_bytes(l.max_request_bytes);
  limits->set_max_response_bytes(l.max_response_bytes);
  limits->set_max_loras_per_request(static_cast<int32_t>(l.max_loras_per_request));
  limits->set_max_lora_rank(static_cast<int32_t>(l.max_lora_rank));
  limits->set_max_lora_scale(l.max_lora_scale);
}

}  // namespace

void fill_model_info(const ServingModel& model, v1::GetModelInfoResponse* response) {
  const PipelineInfo& info = model.info;
  response->set_model_name(info.model_name);
  response->set_variant(info.variant);
  response->set_pipeline_class(info.pipeline_class);
  response->set_backend(info.backend);
  response->set_default_steps(static_cast<int32_t>(info.default_steps));
  response->set_default_guidance(info.default_guidance);
  response->set_uses_cfg(info.uses_cfg);
  response->set_guidance_embedded(info.guidance_embedded);
  fill_limits(model, response->mutable_limits());
  response->add_quality_levels(v1::QUALITY_LOSSLESS);
  if (model.limits.quality_high_enabled) response->add_quality_levels(v1::QUALITY_HIGH);
  response->add_output_formats(v1::OUTPUT_FORMAT_PNG);
  response->add_output_formats(v1::OUTPUT_FORMAT_JPEG);
  response->add_output_formats(v1::OUTPUT_FORMAT_WEBP);
  for (const FastPathCounters& path : fast_path_snapshot()) response->add_fast_paths(path.path);
  response->set_fast_paths_enabled(model.limits.fast_paths);
  for (const auto& [flag, value] : model.facts.backend_options.describe()) {
    (*response->mutable_backend_options())[flag] = value;
  }
  (*response->mutable_backend_options())["gpus"] = absl::StrCat(model.facts.gpus.size());
  (*response->mutable_backend_options())["gpu-ordinals"] = gpu_ordinals_text(model.facts.gpus);
  response->set_server_version(FLUX2_VERSION);
  response->set_weight_bytes(info.device_bytes);
  response->set_text_encoder_streamed(info.text_encoder_streamed);
  response->set_text_encoder_host_bytes(info.text_encoder_host_bytes);
  response->set_prompt_cache_bytes(info.prompt_cache_bytes);
  response->set_transformer_file(model.facts.transformer_file);
  response->set_transformer_format(info.transformer_format);
  response->set_transformer_checkpoint_bytes(info.transformer_checkpoint_bytes);
  response->set_fp8_lossless(std::string(fp8_lossless_name(info.fp8_lossless)));
  response->set_fp8_input_scale(std::string(fp8_input_scale_name(info.fp8_input_scale)));
  response->set_fp8_gemms(static_cast<int32_t>(info.fp8_gemms));
  response->set_fp8_static_scale_gemms(static_cast<int32_t>(info.fp8_static_scale_gemms));
  for (const ComponentInfo& component : info.components) {
    v1::ComponentWeightsInfo* out = response->add_components();
    out->set_name(component.name);
    out->set_format(component.format);
    out->set_device_bytes(component.device_bytes);
    out->set_host_bytes(component.host_bytes);
    out->set_checkpoint_bytes(component.checkpoint_bytes);
  }
  response->set_http_port(model.facts.http_port);
  for (const auto& [flag, value] : model.facts.http_options) {
    (*response->mutable_http_options())[flag] = value;
  }
  response->set_stall_timeout_min_seconds(model.facts.stall.min_seconds);
  response->set_stall_step_multiple(model.facts.stall.step_multiple);
  response->set_test_inject_fault(model.facts.test_inject_fault);
  for (const auto& [flag, value] : model.facts.lora_options) {
    (*response->mutable_lora_options())[flag] = value;
  }
}

void fill_lora_list(const ServingModel& model, v1::ListLorasResponse* response) {
  if (model.loras == nullptr) return;
  const Engine* engine = model.engine;
  for (const LoraListing& entry :
       model.loras->list([engine](const std::string& key) { return engine->lora_resident(key); })) {
    v1::LoraEntry* out = response->add_loras();
    out->set_name(entry.name);
    out->set_bytes(entry.bytes);
    out->set_loaded(entry.loaded);
    out->set_format(entry.layout);
    out->set_rank(static_cast<int32_t>(entry.max_rank));
    out->set_modules(static_cast<int32_t>(entry.modules));
    out->set_sha256_prefix(entry.sha256_prefix);
    out->set_resident(entry.resident);
    out->set_pinned(entry.pinned);
  }
}

}  // namespace flux2::server
