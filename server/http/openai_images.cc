// OpenAI Images API bodies, errors and events; see openai_images.h.
// Tested by tests/server/openai_images_test.cc.
#include "server/http/openai_images.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "kernels/base/status.h"
#include "model/json_util.h"
#include "model/tokenizer_utf8.h"
#include "server/http/json_body.h"
#include "server/http/openai_cache.h"
#include "server/http/openai_loras.h"
#include "server/ops/metrics.h"
#include "server/serving/field_violations.h"

namespace flux2::server {
namespace {

// An error's OpenAI `param` when it names no field violation (a wrong `model`).
constexpr char kOpenAiParamPayload[] = "flux2/openai-param";

using nlohmann::json;

bool valid_utf8(const std::string& text) {
  return utf8_replace_invalid(text) == text;
}

// How a form field's text becomes a JSON value (the JSON body carries typed values already).
enum class FieldType : uint8_t { kString, kInteger, kNumber, kBoolean, kArray, kObject };

// Every parameter the two endpoints take, with its type.
const std::map<std::string, FieldType, std::less<>>& known_fields() {
  static const auto* fields = new std::map<std::string, FieldType, std::less<>>{
      {"prompt", FieldType::kString},
      {"model", FieldType::kString},
      {"n", FieldType::kInteger},
      {"size", FieldType::kString},
      {"response_format", FieldType::kString},
      {"output_format", FieldType::kString},
      {"output_compression", FieldType::kInteger},
      {"quality", FieldType::kString},
      {"stream", FieldType::kBoolean},
      {"partial_images", FieldType::kInteger},
      {"background", FieldType::kString},
      {"moderation", FieldType::kString},
      {"user", FieldType::kString},
      {"seed", FieldType::kInteger},
      {"num_inference_steps", FieldType::kInteger},
      {"guidance_scale", FieldType::kNumber},
      {"negative_prompt", FieldType::kString},
      {"loras", FieldType::kArray},   // server/http/openai_loras.h; a form field holds JSON text
      {"sigmas", FieldType::kArray},  // numbers; a form field holds JSON text
      {"cache", FieldType::kObject},  // server/http/openai_cache.h; a form field holds JSON text
  };
  return *fields;
}

absl::string_view type_name(FieldType type) {
  switch (type) {
    case FieldType::kString:
      return "a string";
    case FieldType::kInteger:
      return "an integer";
    case FieldType::kNumber:
      return "a number";
    case FieldType::kBoolean:
      return "a boolean";
    case FieldType::kArray:
      return "an array";
    case FieldType::kObject:
      return "an object";
  }
  return "a value";
}

bool has_type(const json& value, FieldType type) {
  switch (type) {
    case FieldType::kString:
      return value.is_string();
    case FieldType::kInteger:
      return value.is_number_integer();
    case FieldType::kNumber:
      return value.is_number();
    case FieldType::kBoolean:
      return value.is_boolean();
    case FieldType::kArray:
      return value.is_array();
    case FieldType::kObject:
      return value.is_object();
  }
  return false;
}

// A form field's text as the JSON value of its type, or null when it does not parse.
json form_value(const std::string& text, FieldType type) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  switch (type) {
    case FieldType::kString:
      return text;
    case FieldType::kInteger: {
      int64_t signed_value = 0;
      uint64_t unsigned_value = 0;
      if (absl::SimpleAtoi(trimmed, &signed_value)) return signed_value;
      if (absl::SimpleAtoi(trimmed, &unsigned_value)) return unsigned_value;
      return nullptr;
    }
    case FieldType::kNumber: {
      double value = 0;
      if (absl::SimpleAtod(trimmed, &value)) return value;
      return nullptr;
    }
    case FieldType::kBoolean:
      if (trimmed == "true") return true;
      if (trimmed == "false") return false;
      return nullptr;
    case FieldType::kArray:
    case FieldType::kObject: {
      json value = json::parse(trimmed.begin(), trimmed.end(), nullptr, false);
      if (type == FieldType::kArray ? !value.is_array() : !value.is_object()) return nullptr;
      return value;
    }
  }
  return nullptr;
}

// An integer field's value; values beyond int64 (JSON allows up to 2^64 - 1 as an integer) are a
// violation quoting the value sent, not a silent clamp or wrap.
std::optional<int64_t> integer_value(const std::string& name, const json& value,
                                     std::vector<FieldViolation>* violations) {
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    violations->push_back({name, absl::StrCat(value.get<uint64_t>(), " is out of range")});
    return std::nullopt;
  }
  return value.get<int64_t>();
}

// "1024x1024" -> (1024, 1024); "auto" -> (0, 0): the model's default or the first reference's.
// Each side is decimal digits; its range is validation's to check (quoting the value sent).
bool parse_size(const std::string& text, int64_t* width, int64_t* height) {
  if (text == "auto") {
    *width = *height = 0;
    return true;
  }
  const size_t x = text.find('x');
  if (x == std::string::npos || x == 0 || x + 1 == text.size()) return false;
  const absl::string_view w(text.data(), x), h(text.data() + x + 1, text.size() - x - 1);
  for (absl::string_view part : {w, h}) {
    for (char c : part)
      if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return absl::SimpleAtoi(w, width) && absl::SimpleAtoi(h, height);
}

// The size, format and quality fields of `fields` into `request`.
void apply_output_fields(const json& fields, GenerateRequest& request,
                         std::vector<FieldViolation>* violations) {
  auto string_of = [&](const char* name) -> std::string {
    return fields.contains(name) ? fields[name].get<std::string>() : std::string();
  };
  if (fields.contains("size")) {
    const std::string size = string_of("size");
    if (!parse_size(size, &request.width, &request.height)) {
      violations->push_back(
          {"size",
           absl::StrCat("'", size, "' is not WIDTHxHEIGHT in pixels (e.g. 1024x1024) or auto")});
    } else if (size != "auto" && (request.width == 0 || request.height == 0)) {
      violations->push_back(
          {"size", absl::StrCat("'", size, "' has a zero side; use auto for the default size")});
    }
  }
  const std::string response_format = string_of("response_format");
  if (response_format == "url") {
    violations->push_back(
        {"response_format", "'url' is not supported: this server stores no images; use b64_json"});
  } else if (!response_format.empty() && response_format != "b64_json") {
    violations->push_back(
        {"response_format", absl::StrCat("'", response_format, "' is not b64_json")});
  }
  const std::string output_format = string_of("output_format");
  if (output_format == "jpeg" || output_format == "jpg") {
    request.output_format = ImageFormat::kJpeg;
  } else if (output_format == "webp") {
    request.output_format = ImageFormat::kWebp;
  } else if (output_format != "png" && !output_format.empty()) {
    violations->push_back(
        {"output_format", absl::StrCat("'", output_format, "' is not png, jpeg or webp")});
  }
  if (fields.contains("output_compression")) {
    request.output_quality =
        integer_value("output_compression", fields["output_compression"], violations);
  }
  const std::string quality = string_of("quality");
  if (quality == "high") {
    request.quality = Quality::kHigh;
  } else if (!quality.empty() && quality != "auto" && quality != "lossless") {
    violations->push_back(
        {"quality", absl::StrCat("'", quality,
                                 "' is not lossless (the default: bit-exact), high (faster FP8 "
                                 "path, numerically different) or auto (lossless)")});
  }
}

// OpenAI's fields this server accepts but does nothing with, and what it refuses of them.
void check_accepted_fields(const json& fields, std::vector<FieldViolation>* violations) {
  auto string_of = [&](const char* name) -> std::string {
    return fields.contains(name) ? fields[name].get<std::string>() : std::string();
  };
  if (fields.contains("partial_images") && fields["partial_images"] != 0) {
    violations->push_back({"partial_images",
                           "only 0: with stream=true this server sends a progress event per "
                           "denoising step and each finished image, no partial images"});
  }
  const std::string background = string_of("background");
  if (!background.empty() && background != "auto" && background != "opaque") {
    violations->push_back({"background", absl::StrCat("'", background,
                                                      "' is not supported; images are opaque "
                                                      "(auto or opaque)")});
  }
  const std::string moderation = string_of("moderation");
  if (!moderation.empty() && moderation != "auto" && moderation != "low") {
    violations->push_back({"moderation", absl::StrCat("'", moderation, "' is not auto or low")});
  }
}

// NotFound (param `model`) when `fields` names a model other than the served one.
absl::Status check_model(const json& fields, absl::string_view served_model) {
  if (!fields.contains("model")) return absl::OkStatus();
  const std::string model = fields["model"].get<std::string>();
  if (model.empty() || model == served_model) return absl::OkStatus();
  absl::Status status = absl::NotFoundError(absl::StrCat(
      "model: '", model, "' is not served here; this server serves '", served_model, "'"));
  status.SetPayload(kOpenAiParamPayload, absl::Cord("model"));
  return status;
}

// `sigmas`: an array of numbers (validate() checks their values).
void parse_sigmas(const json& array, std::vector<double>* sigmas,
                  std::vector<FieldViolation>* violations) {
  for (size_t i = 0; i < array.size(); ++i) {
    if (!array[i].is_number()) {
      violations->push_back({absl::StrCat("sigmas[", i, "]"), "must be a number"});
      continue;
    }
    sigmas->push_back(array[i].get<double>());
  }
}

// Applies the typed fields of `fields` (already checked against known_fields).
absl::StatusOr<OpenAiImageRequest> build_request(const json& fields,
                                                 absl::string_view served_model) {
  FLUX_RETURN_IF_ERROR(check_model(fields, served_model));
  std::vector<FieldViolation> violations;
  OpenAiImageRequest out;
  GenerateRequest& request = out.request;
  if (!fields.contains("prompt")) {
    violations.push_back({"prompt", "is required"});
  } else {
    request.prompt = fields["prompt"].get<std::string>();
  }
  if (fields.contains("n")) {
    request.num_images = integer_value("n", fields["n"], &violations).value_or(0);
  }
  apply_output_fields(fields, request, &violations);
  check_accepted_fields(fields, &violations);
  if (fields.contains("stream")) out.stream = fields["stream"].get<bool>();
  if (fields.contains("seed")) {
    const json& seed = fields["seed"];
    if (seed.is_number_unsigned() || seed.get<int64_t>() >= 0) {
      request.seed = seed.get<uint64_t>();
    } else {
      violations.push_back({"seed", "must be 0..18446744073709551615"});
    }
  }
  if (fields.contains("num_inference_steps")) {
    request.num_inference_steps =
        integer_value("num_inference_steps", fields["num_inference_steps"], &violations)
            .value_or(0);
  }
  if (fields.contains("guidance_scale")) {
    request.guidance_scale = fields["guidance_scale"].get<double>();
  }
  if (fields.contains("negative_prompt")) {
    request.negative_prompt = fields["negative_prompt"].get<std::string>();
  }
  if (fields.contains("loras")) parse_openai_loras(fields["loras"], &request.loras, &violations);
  if (fields.contains("sigmas")) parse_sigmas(fields["sigmas"], &request.sigmas, &violations);
  if (fields.contains("cache")) parse_openai_cache(fields["cache"], &request, &violations);
  if (!violations.empty()) return invalid_argument_status(violations);
  return out;
}

// Checks names and types of `fields` (a JSON object); form values arrive typed already.
absl::Status check_fields(const json& fields) {
  std::vector<FieldViolation> violations;
  for (const auto& [name, value] : fields.items()) {
    const auto known = known_fields().find(name);
    if (known == known_fields().end()) {
      violations.push_back({name, "unknown parameter"});
    } else if (!has_type(value, known->second)) {
      violations.push_back({name, absl::StrCat("must be ", type_name(known->second))});
    }
  }
  if (!violations.empty()) return invalid_argument_status(violations);
  return absl::OkStatus();
}

absl::string_view error_type(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kNotFound:
      return "invalid_request_error";
    case absl::StatusCode::kUnauthenticated:
      return "authentication_error";
    case absl::StatusCode::kPermissionDenied:
      return "permission_error";
    case absl::StatusCode::kResourceExhausted:
      return "rate_limit_error";
    default:
      return "server_error";
  }
}

std::string size_text(int64_t width, int64_t height) {
  return absl::StrCat(width, "x", height);
}

absl::string_view format_name(ImageFormat format) {
  return image_mime_type(format).substr(6);  // after "image/"
}

std::string sse_event(absl::string_view name, const json& data) {
  return absl::StrCat("event: ", name, "\ndata: ", dump_json(data), "\n\n");
}

}  // namespace

absl::StatusOr<OpenAiImageRequest> parse_generations_body(absl::string_view body,
                                                          absl::string_view served_model) {
  absl::StatusOr<json> parsed =
      http::parse_json_body(std::string_view(body.data(), body.size()), kMaxJsonDepth);
  if (!parsed.ok()) {
    // The parser's message starts with the member it names ("n: 1e400 is out of range").
    const std::string param = http::json_error_param(parsed.status());
    std::string message(parsed.status().message());
    if (absl::StartsWith(message, param + ": ")) message.erase(0, param.size() + 2);
    return invalid_argument_status({{param.empty() ? "body" : param, message}});
  }
  const json& fields = *parsed;
  if (!fields.is_object()) {
    return invalid_argument_status({{"body",
                                     "is not a JSON object; send Content-Type: application/json "
                                     "with {\"prompt\": ...}"}});
  }
  if (absl::Status status = check_fields(fields); !status.ok()) return status;
  return build_request(fields, served_model);
}

absl::StatusOr<OpenAiImageRequest> parse_edits_form(const std::vector<http::FormPart>& parts,
                                                    absl::string_view served_model) {
  json fields = json::object();
  std::vector<FieldViolation> violations;
  std::vector<const http::FormPart*> images, bracketed;
  for (const http::FormPart& part : parts) {
    if (part.name == "image") {
      images.push_back(&part);
    } else if (part.name == "image[]") {
      bracketed.push_back(&part);
    } else if (part.name == "mask") {
      violations.push_back(
          {"mask", "is not supported: FLUX.2 edits from the reference images and the prompt"});
    } else {
      const auto known = known_fields().find(part.name);
      if (known == known_fields().end()) {
        violations.push_back({part.name, "unknown parameter"});
        continue;
      }
      if (!valid_utf8(part.content)) {
        violations.push_back({part.name, "is not valid UTF-8"});
        continue;
      }
      const json value = form_value(part.content, known->second);
      if (value.is_null()) {
        violations.push_back(
            {part.name, absl::StrCat("'", part.content, "' is not ", type_name(known->second))});
      } else {
        fields[part.name] = value;
      }
    }
  }
  images.insert(images.end(), bracketed.begin(), bracketed.end());
  if (images.empty()) violations.push_back({"image", "is required: one or more image files"});
  if (!violations.empty()) return invalid_argument_status(violations);
  absl::StatusOr<OpenAiImageRequest> out = build_request(fields, served_model);
  if (!out.ok()) return out.status();
  for (const http::FormPart* image : images)
    out->request.reference_images.push_back(image->content);
  return out;
}

std::string openai_param(absl::string_view field) {
  if (field == "width" || field == "height") return "size";
  if (field == "num_images") return "n";
  if (field == "output_quality") return "output_compression";
  if (field == "request_id") return "X-Request-Id";
  if (absl::ConsumePrefix(&field, "reference_images")) return absl::StrCat("image", field);
  return std::string(field);
}

absl::Status with_openai_params(const absl::Status& status) {
  const std::vector<FieldViolation> violations = field_violations_of(status);
  if (violations.empty()) return status;
  std::vector<FieldViolation> renamed;
  for (const FieldViolation& violation : violations) {
    FieldViolation named{openai_param(violation.field), violation.description};
    // width and height with one description (the pixel budget) are one `size` violation.
    const bool repeated = !renamed.empty() && renamed.back().field == named.field &&
                          renamed.back().description == named.description;
    if (!repeated) renamed.push_back(std::move(named));
  }
  return invalid_argument_status(renamed);
}

int http_status_of(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

json openai_error_body(const absl::Status& status) {
  json error;
  error["message"] = std::string(status.message());
  error["type"] = std::string(error_type(status.code()));
  const std::vector<FieldViolation> violations = field_violations_of(status);
  const absl::optional<absl::Cord> param = status.GetPayload(kOpenAiParamPayload);
  if (!violations.empty()) {
    error["param"] = violations.front().field;
  } else if (param) {
    error["param"] = std::string(*param);
  } else {
    error["param"] = nullptr;
  }
  if (absl::IsNotFound(status) && param && *param == "model") {
    error["code"] = "model_not_found";
  } else {
    error["code"] = absl::AsciiStrToLower(absl::StatusCodeToString(status.code()));
  }
  return json{{"error", error}};
}

json openai_image_json(const EncodedImage& image) {
  return json{
      {"b64_json", absl::Base64Escape(absl::string_view(
                       reinterpret_cast<const char*>(image.bytes.data()), image.bytes.size()))},
      {"seed", image.seed},
      {"size", size_text(image.width, image.height)},
      {"mime_type", std::string(image_mime_type(image.format))}};
}

json openai_images_response(const JobSpec& spec, const JobResult& result,
                            absl::string_view model_name, int64_t created, double total_seconds) {
  json data = json::array();
  for (const EncodedImage& image : result.images) data.push_back(openai_image_json(image));
  const WorkerReport& report = result.report;
  json out{{"created", created},
           {"data", std::move(data)},
           {"model", std::string(model_name)},
           {"output_format", std::string(format_name(spec.format))},
           {"quality", std::string(quality_name(spec.params.quality))},
           {"size", size_text(spec.params.width, spec.params.height)},
           {"seed", spec.params.seed},
           {"timings",
            {{"queue_seconds", report.queue_seconds},
             {"tokenize_seconds", report.tokenize_seconds},
             {"text_encode_seconds", report.text_encode_seconds},
             {"reference_encode_seconds", report.reference_encode_seconds},
             {"denoise_seconds", report.denoise_seconds},
             {"step_seconds", report.step_seconds},
             {"decode_seconds", report.decode_seconds},
             {"encode_seconds", result.encode_seconds},
             {"total_seconds", total_seconds}}}};
  if (report.cache.enabled) out["timings"]["cache"] = openai_cache_json(report.cache);
  if (!spec.request_id.empty()) out["request_id"] = spec.request_id;
  if (!spec.loras.empty()) out["loras"] = openai_loras_json(spec.loras);
  return out;
}

std::string sse_progress_event(const ProgressEvent& event) {
  json data{{"type", "image_generation.progress"},
            {"step_index", event.step_index},
            {"step_count", event.step_count},
            {"step_seconds", event.step_seconds},
            {"elapsed_seconds", event.elapsed_seconds},
            {"image_index", event.image_index},
            {"num_images", event.num_images}};
  if (event.cache.enabled) data["cache"] = openai_cache_json(event.cache);
  return sse_event("image_generation.progress", data);
}

std::string sse_image_event(const EncodedImage& image, int image_index, int num_images,
                            const JobSpec& spec, int64_t created) {
  json data = openai_image_json(image);
  data["type"] = "image_generation.completed";
  data["image_index"] = image_index;
  data["num_images"] = num_images;
  data["created_at"] = created;
  data["output_format"] = std::string(format_name(spec.format));
  data["quality"] = std::string(quality_name(spec.params.quality));
  return sse_event("image_generation.completed", data);
}

std::string sse_error_event(const absl::Status& status) {
  json data = openai_error_body(status);
  data["type"] = "error";
  return sse_event("error", data);
}

}  // namespace flux2::server
