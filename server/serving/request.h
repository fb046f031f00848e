// A generation request as both front ends fill it: the gRPC service from
// flux2.v1.GenerateImageRequest (server/grpc/request_conversion.h), the HTTP API from OpenAI's JSON
// and multipart bodies (server/http/openai_images.h). Plain values as the client sent them, not
// yet checked: validate() (server/serving/validate.h) checks every field against the one limits
// table and names the fields it refuses by the names below. Adding a request field: README
// "Adding a request field". Tested by tests/server/validate_test.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "model/step_cache.h"

namespace flux2::server {

// Encoding of the returned images.
enum class ImageFormat : uint8_t {
  kPng,   // lossless PNG
  kJpeg,  // JPEG (4:4:4) at JobSpec::encoder_quality
  kWebp,  // lossy WebP at JobSpec::encoder_quality
};

// The MIME type of `format` ("image/png", "image/jpeg", "image/webp").
absl::string_view image_mime_type(ImageFormat format);
// Its name in messages: "PNG", "JPEG", "WebP".
absl::string_view image_format_name(ImageFormat format);

// One LoRA adapter a request applies (README "LoRA adapters"): a name under --lora-dir and its
// weight (set_adapters' adapter_weights; PEFT scaling = scale x alpha / rank).
struct LoraSpec {
  std::string name;             // "styles/pixel-art": styles/pixel-art.safetensors under --lora-dir
  std::optional<double> scale;  // none: 1
};

struct GenerateRequest {
  std::string prompt;
  std::string negative_prompt;  // CFG models only
  // Output pixels, positive multiples of the model's pixel multiple; 0 (both or one): the first
  // reference's prepared size, else kDefaultImageSide.
  int64_t width = 0;
  int64_t height = 0;
  int64_t num_inference_steps = 0;       // 0: the model default
  std::optional<double> guidance_scale;  // none: the model default
  std::optional<uint64_t> seed;          // none: a random one (returned with the images)
  Quality quality = Quality::kLossless;  // kHigh needs --enable-quality-high
  ImageFormat output_format = ImageFormat::kPng;
  std::optional<int64_t> output_quality;      // JPEG / WebP encoder quality 1..100
  int64_t num_images = 0;                     // 0: 1; image i uses seed + i
  std::vector<std::string> reference_images;  // PNG or JPEG bytes, in order (editing)
  std::string request_id;                     // logged and echoed; printable ASCII
  std::vector<LoraSpec> loras;                // applied in this order; names unique
  // Custom base sigmas, one per step (GenerateParams::sigmas); empty: the default schedule.
  std::vector<double> sigmas;
  // Step caching (GenerateParams::cache, model/step_cache.h); off by default. With
  // `cache_default_schedule` (the "dbcache-default" preset) the schedule is
  // step_cache_default_schedule of the steps that run.
  StepCacheOptions cache;
  bool cache_default_schedule = false;
};

}  // namespace flux2::server
