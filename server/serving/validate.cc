// Request validation; see validate.h. Tested by tests/server/validate_test.cc.
#include "server/serving/validate.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/base/decimal.h"
#include "model/image_encode.h"
#include "model/reference_image.h"
#include "model/scheduler.h"
#include "server/serving/lora_registry.h"

namespace flux2::server {
namespace {

void check_side(absl::string_view field, int64_t value, const Limits& limits,
                std::vector<FieldViolation>* violations) {
  if (value < 0 || value % limits.pixel_multiple != 0) {
    violations->push_back(
        {std::string(field),
         absl::StrCat(value, " is not a positive multiple of ", limits.pixel_multiple,
                      " (0 means the first reference image's, else ", kDefaultImageSide, ")")});
  }
}

// The description of a load_reference error: its message without the leading "field: ".
std::string reference_error(const absl::Status& status, absl::string_view field) {
  absl::string_view message = status.message();
  const std::string prefix = absl::StrCat(field, ": ");
  if (absl::StartsWith(message, prefix)) message.remove_prefix(prefix.size());
  return std::string(message);
}

// Decodes and prepares the reference images, in order, into `references`; each bad one is a
// violation of `reference_images[i]`. Returns whether reference 0 (which sets a default output
// size) was prepared.
bool load_references(const GenerateRequest& request, const Limits& limits,
                     std::vector<RgbImage>* references, std::vector<FieldViolation>* violations) {
  const int64_t count = static_cast<int64_t>(request.reference_images.size());
  if (count == 0) return false;
  if (limits.max_reference_images == 0) {
    violations->push_back({"reference_images",
                           "this server does not accept reference images "
                           "(--max-reference-images 0)"});
    return false;
  }
  if (count > limits.max_reference_images) {
    violations->push_back(
        {"reference_images", absl::StrCat(count, " reference images exceed the limit of ",
                                          limits.max_reference_images)});
    return false;
  }
  bool first_ok = false;
  for (int64_t i = 0; i < count; ++i) {
    const std::string field = absl::StrCat("reference_images[", i, "]");
    const std::string& data = request.reference_images[static_cast<size_t>(i)];
    if (data.empty()) {
      violations->push_back({field, "empty"});
      continue;
    }
    if (static_cast<int64_t>(data.size()) > limits.max_reference_bytes) {
      violations->push_back({field, absl::StrCat(data.size(), " bytes exceed the limit of ",
                                                 limits.max_reference_bytes)});
      continue;
    }
    absl::StatusOr<RgbImage> image = load_reference(data, limits.pixel_multiple, field);
    if (!image.ok()) {
      violations->push_back({field, reference_error(image.status(), field)});
      continue;
    }
    if (i == 0) first_ok = true;
    references->push_back(std::move(*image));
  }
  return first_ok;
}

void check_prompt(absl::string_view field, const std::string& text, const Limits& limits,
                  std::vector<FieldViolation>* violations) {
  if (static_cast<int64_t>(text.size()) > limits.max_prompt_bytes) {
    violations->push_back(
        {std::string(field), absl::StrCat(text.size(), " bytes is longer than the limit of ",
                                          limits.max_prompt_bytes, " bytes")});
  }
}

bool printable_ascii(const std::string& text) {
  for (unsigned char c : text) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

// The output size and the prepared references: the size is unknown when it would come from a
// reference that failed (that violation is reported).
struct SizedReferences {
  GenerateParams sized;  // what output_size() reads: the requested size and the references
  ImageSize size;
  bool size_known = false;
};

SizedReferences check_size(const GenerateRequest& request, const Limits& limits,
                           std::vector<FieldViolation>* violations) {
  check_side("width", request.width, limits, violations);
  check_side("height", request.height, limits, violations);
  SizedReferences out;
  out.sized.width = request.width;
  out.sized.height = request.height;
  const bool first_reference_ok =
      load_references(request, limits, &out.sized.references, violations);
  const bool size_from_reference =
      !request.reference_images.empty() && (request.width == 0 || request.height == 0);
  out.size_known = !size_from_reference || first_reference_ok;
  if (!out.size_known) return out;
  out.size = output_size(out.sized);
  const ImageSize& size = out.size;
  if (request.width >= 0 && request.height >= 0 && size.width * size.height > limits.max_pixels) {
    const std::string description =
        absl::StrCat(size.width, " x ", size.height, " = ", size.width * size.height,
                     " pixels exceeds the budget of ", limits.max_pixels, " pixels (width x height",
                     size_from_reference ? "; 0 takes the size of reference_images[0])" : ")");
    violations->push_back({"width", description});
    violations->push_back({"height", description});
  }
  return out;
}

// The steps a request runs: its own, else as many as its sigmas, else the model's default.
int64_t resolved_steps(const GenerateRequest& request, const Limits& limits) {
  if (request.num_inference_steps > 0) return request.num_inference_steps;
  return request.sigmas.empty() ? limits.default_steps
                                : static_cast<int64_t>(request.sigmas.size());
}

// The request's step caching with its preset resolved for the steps that run.
StepCacheOptions resolved_cache(const GenerateRequest& request, const Limits& limits) {
  StepCacheOptions cache = request.cache;
  if (request.cache_default_schedule) {
    cache.schedule = step_cache_default_schedule(resolved_steps(request, limits));
  }
  return cache;
}

void check_steps_and_guidance(const GenerateRequest& request, const Limits& limits,
                              std::vector<FieldViolation>* violations) {
  if (request.num_inference_steps < 0 || request.num_inference_steps > limits.max_steps) {
    violations->push_back(
        {"num_inference_steps", absl::StrCat(request.num_inference_steps, " is outside 1..",
                                             limits.max_steps, " (0 means the model default)")});
  } else {
    check_custom_sigmas(request.sigmas, resolved_steps(request, limits), limits.max_steps,
                        violations);
    check_step_cache(resolved_cache(request, limits), resolved_steps(request, limits), violations);
  }
  if (!request.guidance_scale) return;
  const double guidance = *request.guidance_scale;
  if (!std::isfinite(guidance)) {
    violations->push_back(
        {"guidance_scale", absl::StrCat(exact_decimal(guidance), " is not a finite number")});
  } else if (guidance < limits.min_guidance || guidance > limits.max_guidance) {
    violations->push_back({"guidance_scale", absl::StrCat(exact_decimal(guidance), " is outside ",
                                                          exact_decimal(limits.min_guidance), "..",
                                                          exact_decimal(limits.max_guidance))});
  }
}

void check_output(const GenerateRequest& request, const Limits& limits,
                  const SizedReferences& sized, std::vector<FieldViolation>* violations) {
  if (request.quality == Quality::kHigh && !limits.quality_high_enabled) {
    violations->push_back(
        {"quality", "QUALITY_HIGH is not enabled on this server (--enable-quality-high)"});
  }
  const ImageFormat format = request.output_format;
  // The formats' own side limits (PNG's 2^31 is beyond max_pixels).
  const int64_t max_side = format == ImageFormat::kWebp   ? kMaxWebpSide
                           : format == ImageFormat::kJpeg ? kMaxJpegSide
                                                          : int64_t{1} << 31;
  const ImageSize& size = sized.size;
  if (sized.size_known && std::max(size.width, size.height) > max_side) {
    violations->push_back(
        {"output_format", absl::StrCat(image_format_name(format), " sides are at most ", max_side,
                                       "; ", size.width, " x ", size.height, " does not fit")});
  }
  if (request.output_quality) {
    if (format == ImageFormat::kPng) {
      violations->push_back({"output_quality", "applies to JPEG and WebP only (PNG is lossless)"});
    } else if (*request.output_quality < 1 || *request.output_quality > 100) {
      violations->push_back(
          {"output_quality", absl::StrCat(*request.output_quality, " is outside 1..100")});
    }
  }
}

void check_the_rest(const GenerateRequest& request, const Limits& limits,
                    std::vector<FieldViolation>* violations) {
  if (request.num_images < 0 || request.num_images > limits.max_images) {
    violations->push_back({"num_images", absl::StrCat(request.num_images, " is outside 1..",
                                                      limits.max_images, " (0 means 1)")});
  }
  if (!request.negative_prompt.empty() && !limits.uses_cfg) {
    violations->push_back({"negative_prompt",
                           "this model does not use classifier-free guidance, so it "
                           "takes no negative prompt"});
  }
  check_prompt("negative_prompt", request.negative_prompt, limits, violations);
  if (request.request_id.size() > kMaxRequestIdBytes || !printable_ascii(request.request_id)) {
    violations->push_back({"request_id", absl::StrCat("must be at most ", kMaxRequestIdBytes,
                                                      " bytes of printable ASCII")});
  }
}

// The adapters' count, names and scales; resolving the files is ServingCore's (lora_registry.h).
void check_loras(const GenerateRequest& request, const Limits& limits,
                 std::vector<FieldViolation>* violations) {
  if (request.loras.empty()) return;
  if (!limits.lora_enabled) {
    violations->push_back({"loras", "this server has no --lora-dir"});
    return;
  }
  const int64_t count = static_cast<int64_t>(request.loras.size());
  if (count > limits.max_loras_per_request) {
    violations->push_back(
        {"loras", absl::StrCat(count, " adapters exceed ", limits.max_loras_per_request)});
    return;
  }
  for (size_t i = 0; i < request.loras.size(); ++i) {
    const LoraSpec& lora = request.loras[i];
    const std::string field = absl::StrCat("loras[", i, "]");
    if (absl::Status name = check_lora_name(lora.name); !name.ok()) {
      violations->push_back({field + ".name", std::string(name.message())});
    } else {
      for (size_t j = 0; j < i; ++j) {
        if (request.loras[j].name != lora.name) continue;
        violations->push_back({field + ".name", absl::StrCat("'", lora.name, "' repeated")});
        break;
      }
    }
    if (!lora.scale) continue;
    const double scale = *lora.scale;
    if (!std::isfinite(scale)) {
      violations->push_back(
          {field + ".scale", absl::StrCat(exact_decimal(scale), " is not finite")});
    } else if (std::abs(scale) > limits.max_lora_scale) {
      violations->push_back(
          {field + ".scale",
           absl::StrCat(exact_decimal(scale), " is outside -", exact_decimal(limits.max_lora_scale),
                        "..", exact_decimal(limits.max_lora_scale))});
    }
  }
}

// The job of a request that passed every check.
JobSpec make_spec(const GenerateRequest& request, const Limits& limits, SizedReferences sized,
                  uint64_t random_seed) {
  JobSpec spec;
  GenerateParams& params = spec.params;
  params.prompt = request.prompt;
  params.negative_prompt = request.negative_prompt;
  params.width = sized.size.width;  // resolved: the engine sees the output size, never 0
  params.height = sized.size.height;
  params.references = std::move(sized.sized.references);
  params.max_sequence_length = limits.max_sequence_length;
  // Resolved here so the log, the response bound and the engine all see the steps that run.
  params.num_inference_steps = resolved_steps(request, limits);
  params.sigmas = request.sigmas;
  params.cache = resolved_cache(request, limits);
  params.guidance_scale = request.guidance_scale.value_or(-1.0);  // < 0: the model default
  params.seed = request.seed.value_or(random_seed);
  params.quality = request.quality;
  params.fast_paths = limits.fast_paths;
  spec.num_images = request.num_images == 0 ? 1 : static_cast<int>(request.num_images);
  spec.format = request.output_format;
  if (request.output_quality) spec.encoder_quality = static_cast<int>(*request.output_quality);
  spec.request_id = request.request_id;
  return spec;
}

}  // namespace

absl::StatusOr<JobSpec> validate(const GenerateRequest& request, const Limits& limits,
                                 uint64_t random_seed) {
  std::vector<FieldViolation> violations;
  if (request.prompt.empty()) violations.push_back({"prompt", "is empty; a prompt is required"});
  check_prompt("prompt", request.prompt, limits, &violations);
  SizedReferences sized = check_size(request, limits, &violations);
  check_steps_and_guidance(request, limits, &violations);
  check_output(request, limits, sized, &violations);
  check_the_rest(request, limits, &violations);
  check_loras(request, limits, &violations);
  if (!violations.empty()) return invalid_argument_status(violations);
  return make_spec(request, limits, std::move(sized), random_seed);
}

// PNG (model/image_encode.cc encode_png): H rows of 1 filter byte + 3W RGB bytes, S = H (3W + 1)
// bytes, cut into c = max(1, min(H / 32, 2 x threads)) <= max(1, H / 32) row chunks, each deflated
// raw at level 1. zlib's deflate never emits more than stored blocks would, and deflateBound's
// tight bound for the default window and memLevel (zlib 1.2.12+) is n + n/4096 + n/16384 +
// n/2^25 + 7 bytes for n raw-deflate bytes; each chunk but the last also ends with a full flush
// (an empty stored block: at most 5 bytes). The chunks' floors sum to at most the floors of S, so
// all chunks take at most S + S/4096 + S/16384 + S/2^25 + 12c bytes. Then the zlib header and
// Adler-32 (6) and the PNG framing: signature 8, IHDR 25, one IDAT chunk header + CRC 12, IEND
// 12 (57). For 768 x 768 that is 1771131 bytes: two fit in 4 MiB, three do not.
// JPEG (libjpeg-turbo, 4:4:4 at any quality): libjpeg-turbo's tjBufSize worst case for 4:4:4, 6
// bytes per pixel of the 8 x 8-padded image + 2048, that library's documented bound for its own
// encoder. WebP (lossy VP8) has no documented bound; the same one is used (twice the raw RGB
// size: VP8's coded residuals stay far below that even at quality 100), and GenerateImage still
// checks the real response against the limit.
int64_t encoded_image_bound_bytes(ImageFormat format, int64_t width, int64_t height) {
  if (format != ImageFormat::kPng) {
    const int64_t padded_w = (width + 7) / 8 * 8, padded_h = (height + 7) / 8 * 8;
    return padded_w * padded_h * 6 + 2048;
  }
  const int64_t raw = height * (3 * width + 1);
  const int64_t chunks = std::max<int64_t>(1, height / 32);
  return raw + (raw >> 12) + (raw >> 14) + (raw >> 25) + 12 * chunks + 6 + 57;
}

int64_t unary_response_bound_bytes(const JobSpec& spec, int64_t max_steps) {
  const GenerateParams& params = spec.params;
  const int64_t steps = params.num_inference_steps > 0 ? params.num_inference_steps : max_steps;
  // Per image: the Image message's tag and length (6), mime_type (12), width, height and seed
  // varints (24): 64 with room. Per step: one packed double (8).
  const int64_t per_image =
      encoded_image_bound_bytes(spec.format, params.width, params.height) + 64 + 8 * steps;
  return spec.num_images * per_image + kResponseMetadataBytes;
}

absl::Status check_unary_response_size(const JobSpec& spec, const Limits& limits) {
  const int64_t bound = unary_response_bound_bytes(spec, limits.max_steps);
  if (bound <= limits.max_response_bytes) return absl::OkStatus();
  const int64_t one = encoded_image_bound_bytes(spec.format, spec.params.width, spec.params.height);
  return invalid_argument_status(
      {{"num_images", absl::StrCat(spec.num_images, " x ", spec.params.width, " x ",
                                   spec.params.height, " ", image_format_name(spec.format),
                                   " images may reach ", bound, " bytes (up to ", one,
                                   " per image), over this server's "
                                   "GenerateImage response limit of ",
                                   limits.max_response_bytes,
                                   " bytes (--max-response-bytes, gRPC's default client "
                                   "receive limit); use GenerateImageStream (one image per "
                                   "message), fewer or smaller images, or a client with "
                                   "a larger max receive message size and a server with "
                                   "a larger --max-response-bytes")}});
}

}  // namespace flux2::server
