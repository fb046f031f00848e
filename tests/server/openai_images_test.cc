// The OpenAI Images API translation (server/http/openai_images.h) without a server: every field of
// the JSON body and the multipart form reaches the GenerateImageRequest, each bad one is refused
// under its API name (`size`, `n`, `image[1]`), errors have OpenAI's shape and the HTTP status that
// fits, and the response and event JSON carry the images and timings. Run:
// build/bin/server_unit_tests --gtest_filter='OpenAiImages*'
#include "server/http/openai_images.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/serving/field_violations.h"

namespace flux2::server {
namespace {

using nlohmann::json;

constexpr char kModel[] = "tiny-klein";

// The API names of the fields a status's violations name.
std::vector<std::string> params_of(const absl::Status& status) {
  std::vector<std::string> fields;
  for (const FieldViolation& v : field_violations_of(status)) fields.push_back(v.field);
  return fields;
}

TEST(OpenAiImagesTest, GenerationsBodyFillsEveryField) {
  absl::StatusOr<OpenAiImageRequest> parsed = parse_generations_body(
      R"({"model": "tiny-klein", "prompt": "a fox", "n": 2, "size": "256x128",
          "response_format": "b64_json", "output_format": "webp", "output_compression": 80,
          "quality": "high", "stream": true, "partial_images": 0, "background": "opaque",
          "moderation": "low", "user": "u1", "seed": 18446744073709551615,
          "num_inference_steps": 3, "guidance_scale": 2.5, "negative_prompt": "blur",
          "sigmas": [1, 0.5, 0.25],
          "cache": {"warmup_steps": 2, "max_consecutive_cached": -1, "threshold": 0.5}})",
      kModel);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const GenerateRequest& r = parsed->request;
  EXPECT_EQ(r.prompt, "a fox");
  EXPECT_EQ(r.num_images, 2);
  EXPECT_EQ(r.width, 256);
  EXPECT_EQ(r.height, 128);
  EXPECT_EQ(r.output_format, ImageFormat::kWebp);
  EXPECT_EQ(r.output_quality, 80);
  EXPECT_EQ(r.quality, Quality::kHigh);
  EXPECT_EQ(r.seed, 18446744073709551615ull);
  EXPECT_EQ(r.num_inference_steps, 3);
  EXPECT_EQ(r.guidance_scale, 2.5);
  EXPECT_EQ(r.negative_prompt, "blur");
  EXPECT_EQ(r.sigmas, (std::vector<double>{1.0, 0.5, 0.25}));
  EXPECT_EQ(r.cache.mode, StepCacheOptions::Mode::kDbCache);
  EXPECT_EQ(r.cache.warmup_steps, 2);
  EXPECT_EQ(r.cache.max_consecutive_cached, -1);
  EXPECT_EQ(r.cache.threshold, 0.5);
  EXPECT_TRUE(parsed->stream);
}

TEST(OpenAiImagesTest, DefaultsLeaveTheServerDefaults) {
  absl::StatusOr<OpenAiImageRequest> parsed =
      parse_generations_body(R"({"prompt": "a fox", "size": "auto", "quality": "auto"})", kModel);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->request.width, 0);
  EXPECT_EQ(parsed->request.height, 0);
  EXPECT_FALSE(parsed->request.seed.has_value());
  EXPECT_FALSE(parsed->request.guidance_scale.has_value());
  EXPECT_FALSE(parsed->request.output_quality.has_value());
  EXPECT_EQ(parsed->request.quality, Quality::kLossless);
  EXPECT_EQ(parsed->request.output_format, ImageFormat::kPng);
  EXPECT_FALSE(parsed->stream);
}

TEST(OpenAiImagesTest, BadFieldsAreRefusedByTheirApiNames) {
  struct Case {
    const char* body;
    std::vector<std::string> params;
  };
  const Case cases[] = {
      {R"({"prompt": "x", "size": "1024"})", {"size"}},
      {R"({"prompt": "x", "size": "axb"})", {"size"}},
      {R"({"prompt": "x", "size": "-16x16"})", {"size"}},
      {R"({"prompt": "x", "response_format": "url"})", {"response_format"}},
      {R"({"prompt": "x", "output_format": "gif"})", {"output_format"}},
      {R"({"prompt": "x", "quality": "medium"})", {"quality"}},
      {R"({"prompt": "x", "partial_images": 2})", {"partial_images"}},
      {R"({"prompt": "x", "background": "transparent"})", {"background"}},
      {R"({"prompt": "x", "seed": -1})", {"seed"}},
      {R"({"prompt": "x", "n": "2"})", {"n"}},
      {R"({"prompt": "x", "stream": 1})", {"stream"}},
      {R"({"prompt": "x", "style": "vivid"})", {"style"}},
      {R"({"prompt": "x", "sigmas": 0.5})", {"sigmas"}},
      {R"({"prompt": "x", "cache": true})", {"cache"}},
      {R"({"prompt": "x", "cache": {"mode": "fast"}})", {"cache.mode"}},
      {R"({"prompt": "x", "cache": {"threshold": "0.2", "ttl": 3}})",
       {"cache.ttl", "cache.threshold"}},
      {R"({"prompt": "x", "cache": {"mode": "schedule", "schedule": [1, 2]}})",
       {"cache.schedule[1]"}},
      {R"({"prompt": "x", "sigmas": [1, "0.5", null]})", {"sigmas[1]", "sigmas[2]"}},
      {R"({"n": 1})", {"prompt"}},
      {R"([1, 2])", {"body"}},
      {R"({"prompt": "x")", {"body"}},
      // Invalid UTF-8 is refused naming the member it is in (the JSON parser knows which).
      {"{\"prompt\": \"\xff\"}", {"prompt"}},
  };
  for (const Case& c : cases) {
    absl::StatusOr<OpenAiImageRequest> parsed = parse_generations_body(c.body, kModel);
    ASSERT_FALSE(parsed.ok()) << c.body;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_EQ(params_of(parsed.status()), c.params) << c.body << ": " << parsed.status();
  }
}

TEST(OpenAiImagesTest, AnotherModelIsNotFound) {
  absl::StatusOr<OpenAiImageRequest> parsed =
      parse_generations_body(R"({"prompt": "x", "model": "dall-e-3"})", kModel);
  ASSERT_EQ(parsed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(http_status_of(parsed.status()), 404);
  const json body = openai_error_body(parsed.status());
  EXPECT_EQ(body["error"]["param"], "model");
  EXPECT_EQ(body["error"]["code"], "model_not_found");
  EXPECT_NE(body["error"]["message"].get<std::string>().find("tiny-klein"), std::string::npos);
}

TEST(OpenAiImagesTest, EditsFormTakesImagesInOrderAndTypedFields) {
  const std::vector<http::FormPart> parts = {
      {"prompt", "", "put the cat on the sofa"},
      {"image[]", "b.png", "second"},
      {"n", "", "2"},
      {"image", "a.png", "first"},
      {"image[]", "c.png", "third"},
      {"seed", "", " 7 "},
      {"guidance_scale", "", "3.5"},
      {"stream", "", "false"},
      {"sigmas", "", "[0.9, 0.4]"},
      {"cache", "", R"({"mode": "schedule", "schedule": "dbcache-default"})"},
  };
  absl::StatusOr<OpenAiImageRequest> parsed = parse_edits_form(parts, kModel);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const GenerateRequest& r = parsed->request;
  ASSERT_EQ(r.reference_images.size(), 3u);
  EXPECT_EQ(r.reference_images[0], "first");
  EXPECT_EQ(r.reference_images[1], "second");
  EXPECT_EQ(r.reference_images[2], "third");
  EXPECT_EQ(r.num_images, 2);
  EXPECT_EQ(r.seed, 7u);
  EXPECT_EQ(r.guidance_scale, 3.5);
  EXPECT_EQ(r.sigmas, (std::vector<double>{0.9, 0.4}));
  EXPECT_EQ(r.cache.mode, StepCacheOptions::Mode::kSchedule);
  EXPECT_TRUE(r.cache_default_schedule);
  EXPECT_FALSE(parsed->stream);
}

TEST(OpenAiImagesTest, EditsFormRefusals) {
  absl::StatusOr<OpenAiImageRequest> no_image = parse_edits_form({{"prompt", "", "x"}}, kModel);
  EXPECT_EQ(params_of(no_image.status()), std::vector<std::string>{"image"});
  absl::StatusOr<OpenAiImageRequest> mask = parse_edits_form(
      {{"prompt", "", "x"}, {"image", "a.png", "a"}, {"mask", "m.png", "m"}}, kModel);
  EXPECT_EQ(params_of(mask.status()), std::vector<std::string>{"mask"});
  absl::StatusOr<OpenAiImageRequest> bad_n =
      parse_edits_form({{"prompt", "", "x"}, {"image", "a.png", "a"}, {"n", "", "two"}}, kModel);
  EXPECT_EQ(params_of(bad_n.status()), std::vector<std::string>{"n"});
}

// `loras` (server/http/openai_loras.h): a JSON array in the body, JSON text in an edits form
// field; `path` is fal's spelling of `name`; scale optional.
TEST(OpenAiImagesTest, LorasReachTheRequestFromTheBodyAndTheEditsForm) {
  absl::StatusOr<OpenAiImageRequest> body = parse_generations_body(
      R"({"prompt": "a fox", "loras": [{"name": "styles/ink", "scale": -0.5},
                                      {"path": "bfl"}, {"name": "x", "path": "x"}]})",
      kModel);
  ASSERT_TRUE(body.ok()) << body.status();
  const std::vector<LoraSpec>& loras = body->request.loras;
  ASSERT_EQ(loras.size(), 3u);
  EXPECT_EQ(loras[0].name, "styles/ink");
  EXPECT_EQ(loras[0].scale, -0.5);
  EXPECT_EQ(loras[1].name, "bfl");
  EXPECT_FALSE(loras[1].scale.has_value());
  EXPECT_EQ(loras[2].name, "x");
  absl::StatusOr<OpenAiImageRequest> form =
      parse_edits_form({{"prompt", "", "x"},
                        {"image", "a.png", "a"},
                        {"loras", "", R"([{"name": "style", "scale": 0.8}, {"name": "kohya"}])"}},
                       kModel);
  ASSERT_TRUE(form.ok()) << form.status();
  ASSERT_EQ(form->request.loras.size(), 2u);
  EXPECT_EQ(form->request.loras[0].name, "style");
  EXPECT_EQ(form->request.loras[0].scale, 0.8);
  EXPECT_EQ(form->request.loras[1].name, "kohya");
}

TEST(OpenAiImagesTest, LoraRefusalsNameTheMember) {
  struct Case {
    const char* loras;
    std::vector<std::string> params;
    const char* message;
  };
  const Case cases[] = {
      {R"({"name": "x"})", {"loras"}, "loras: must be an array"},
      {R"(["x"])", {"loras[0]"}, "loras[0]: must be an object {\"name\": ..., \"scale\": ...}"},
      {R"([{"scale": 1}])", {"loras[0].name"}, "loras[0].name: is required"},
      {R"([{"name": 3}])", {"loras[0].name"}, "loras[0].name: must be a string"},
      {R"([{"name": "a"}, {"name": "b", "path": "c"}])",
       {"loras[1].path"},
       "loras[1].path: differs from the adapter's other name / path"},
      {R"([{"name": "a", "scale": "1"}])", {"loras[0].scale"}, "loras[0].scale: must be a number"},
      {R"([{"name": "a", "weight": 1}])",
       {"loras[0].weight"},
       "loras[0].weight: unknown parameter (name, path, scale)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.loras);
    absl::StatusOr<OpenAiImageRequest> parsed =
        parse_generations_body(absl::StrCat(R"({"prompt": "x", "loras": )", c.loras, "}"), kModel);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(params_of(parsed.status()), c.params);
    EXPECT_NE(parsed.status().message().find(c.message), absl::string_view::npos)
        << parsed.status().message();
  }
  absl::StatusOr<OpenAiImageRequest> form = parse_edits_form(
      {{"prompt", "", "x"}, {"image", "a.png", "a"}, {"loras", "", "style"}}, kModel);
  ASSERT_FALSE(form.ok());
  EXPECT_EQ(params_of(form.status()), std::vector<std::string>{"loras"});
}

TEST(OpenAiImagesTest, ValidationFieldsGetApiNames) {
  EXPECT_EQ(openai_param("width"), "size");
  EXPECT_EQ(openai_param("height"), "size");
  EXPECT_EQ(openai_param("num_images"), "n");
  EXPECT_EQ(openai_param("reference_images[1]"), "image[1]");
  EXPECT_EQ(openai_param("output_quality"), "output_compression");
  EXPECT_EQ(openai_param("request_id"), "X-Request-Id");
  EXPECT_EQ(openai_param("guidance_scale"), "guidance_scale");
  // One budget violation reported for width and height is one `size` violation.
  const absl::Status renamed = with_openai_params(
      invalid_argument_status({{"width", "too big"}, {"height", "too big"}, {"num_images", "9"}}));
  EXPECT_EQ(params_of(renamed), (std::vector<std::string>{"size", "n"}));
  EXPECT_EQ(renamed.message(), "size: too big; n: 9");
  const absl::Status other = absl::UnavailableError("loading");
  EXPECT_EQ(with_openai_params(other), other);
}

TEST(OpenAiImagesTest, HttpStatusesAndErrorShape) {
  EXPECT_EQ(http_status_of(absl::InvalidArgumentError("x")), 400);
  EXPECT_EQ(http_status_of(absl::UnauthenticatedError("x")), 401);
  EXPECT_EQ(http_status_of(absl::ResourceExhaustedError("x")), 429);
  EXPECT_EQ(http_status_of(absl::UnavailableError("x")), 503);
  EXPECT_EQ(http_status_of(absl::DeadlineExceededError("x")), 504);
  EXPECT_EQ(http_status_of(absl::InternalError("x")), 500);
  const json bad = openai_error_body(invalid_argument_status({{"size", "'1' is not WxH"}}));
  EXPECT_EQ(bad, json::parse(R"({"error": {"message": "size: '1' is not WxH",
      "type": "invalid_request_error", "param": "size", "code": "invalid_argument"}})"));
  const json full = openai_error_body(absl::ResourceExhaustedError("the queue is full"));
  EXPECT_EQ(full["error"]["type"], "rate_limit_error");
  EXPECT_TRUE(full["error"]["param"].is_null());
  EXPECT_EQ(full["error"]["code"], "resource_exhausted");
}

TEST(OpenAiImagesTest, ResponseAndEventsCarryImagesAndTimings) {
  JobSpec spec;
  spec.params.width = 64;
  spec.params.height = 48;
  spec.params.seed = 41;
  spec.num_images = 1;
  spec.request_id = "r-1";
  JobResult result;
  result.images.push_back({{1, 2, 3}, ImageFormat::kPng, 64, 48, 41});
  result.report.step_seconds = {0.5, 0.25};
  const json response = openai_images_response(spec, result, kModel, 1700000000, 1.5);
  EXPECT_EQ(response["created"], 1700000000);
  ASSERT_EQ(response["data"].size(), 1u);
  std::string bytes;
  ASSERT_TRUE(absl::Base64Unescape(response["data"][0]["b64_json"].get<std::string>(), &bytes));
  EXPECT_EQ(bytes, std::string("\x01\x02\x03"));
  EXPECT_EQ(response["data"][0]["seed"], 41);
  EXPECT_EQ(response["data"][0]["size"], "64x48");
  EXPECT_EQ(response["output_format"], "png");
  EXPECT_EQ(response["request_id"], "r-1");
  EXPECT_EQ(response["timings"]["step_seconds"], json::parse("[0.5, 0.25]"));
  EXPECT_EQ(response["timings"]["total_seconds"], 1.5);

  const std::string progress = sse_progress_event({1, 4, 0.5, 2.0, 0, 1, {}});
  ASSERT_EQ(progress.rfind("event: image_generation.progress\ndata: ", 0), 0u) << progress;
  ASSERT_EQ(progress.substr(progress.size() - 2), "\n\n");
  const json data = json::parse(progress.substr(progress.find("data: ") + 6));
  EXPECT_EQ(data["type"], "image_generation.progress");
  EXPECT_EQ(data["step_index"], 1);
  EXPECT_EQ(data["step_count"], 4);
  EXPECT_FALSE(data.contains("cache"));  // only with step caching
  StepCacheCounts cache;
  cache.enabled = true;
  cache.computed[0] = 5, cache.cached[0] = 2, cache.computed[1] = 6, cache.cached[1] = 1;
  const std::string cached = sse_progress_event({6, 50, 0.02, 3.0, 0, 1, cache});
  const json cached_data = json::parse(cached.substr(cached.find("data: ") + 6));
  EXPECT_EQ(cached_data["cache"], json::parse(R"({"double_computed": 5, "double_cached": 2,
                                                  "single_computed": 6, "single_cached": 1})"));
  const std::string image = sse_image_event(result.images[0], 0, 1, spec, 1700000000);
  EXPECT_EQ(image.rfind("event: image_generation.completed\ndata: ", 0), 0u);
  const std::string error = sse_error_event(absl::DeadlineExceededError("late"));
  EXPECT_EQ(error.rfind("event: error\ndata: ", 0), 0u);
  EXPECT_NE(error.find("\"code\":\"deadline_exceeded\""), std::string::npos) << error;
}

}  // namespace
}  // namespace flux2::server
