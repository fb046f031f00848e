// Request validation (server/serving/validate.h, driven through the gRPC conversion of
// server/grpc/request_conversion.h), the field violations in a status
// (server/serving/field_violations.h) and the absl -> gRPC status mapping
// (server/grpc/rpc_status.h): defaults, seeds, one table row per invalid field (the violation names
// it), the BadRequest details in the grpc-status-details-bin payload, and reference images (each
// bad one named reference_images[i]; a good one prepared and setting the output size), encoded by
// tests/server/test_support.h), and the unary response-size bound (against the real encoders on
// incompressible noise).
// Run: build/bin/server_unit_tests --gtest_filter='RequestValidation*:RpcStatus*:FieldViolations*'
#include "server/serving/validate.h"

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "gtest/gtest.h"
#include "model/image_encode.h"
#include "server/grpc/request_conversion.h"
#include "server/grpc/rpc_status.h"
#include "server/serving/access_log.h"
#include "tests/server/test_support.h"

namespace flux2::server {
namespace {

namespace v1 = flux2::v1;

Limits test_limits() {
  Limits limits;
  limits.pixel_multiple = 16;
  limits.max_pixels = 1024 * 1024;
  limits.max_steps = 50;
  limits.max_images = 4;
  limits.max_prompt_bytes = 64;
  limits.uses_cfg = false;
  limits.quality_high_enabled = false;
  return limits;
}

// The gRPC request converted as the service converts it, then validated.
absl::StatusOr<JobSpec> validate_generate_request(const v1::GenerateImageRequest& proto,
                                                  const Limits& limits, uint64_t random_seed) {
  absl::StatusOr<GenerateRequest> request = request_from_proto(proto);
  if (!request.ok()) return request.status();
  return validate(*request, limits, random_seed);
}

v1::GenerateImageRequest valid_request() {
  v1::GenerateImageRequest request;
  request.set_prompt("a cat");
  request.set_width(512);
  request.set_height(256);
  return request;
}

TEST(RequestValidation, DefaultsAndRandomSeed) {
  v1::GenerateImageRequest request;
  request.set_prompt("a cat");
  Limits limits = test_limits();
  limits.max_pixels = 1024 * 1024;
  limits.default_steps = 4;
  absl::StatusOr<JobSpec> spec = validate_generate_request(request, limits, /*random_seed=*/777);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->params.width, kDefaultImageSide);
  EXPECT_EQ(spec->params.height, kDefaultImageSide);
  EXPECT_EQ(spec->params.num_inference_steps, 4);  // the model default, resolved
  EXPECT_LT(spec->params.guidance_scale, 0.0);     // the model default
  EXPECT_EQ(spec->params.seed, 777u);              // absent: the random one
  EXPECT_EQ(spec->params.quality, Quality::kLossless);
  EXPECT_EQ(spec->num_images, 1);
  EXPECT_EQ(spec->format, ImageFormat::kPng);
}

TEST(RequestValidation, CopiesEveryField) {
  v1::GenerateImageRequest request = valid_request();
  request.set_num_inference_steps(7);
  request.set_guidance_scale(0.0);  // present and zero is not "absent"
  request.set_seed(std::numeric_limits<uint64_t>::max());
  request.set_quality(v1::QUALITY_LOSSLESS);
  request.set_output_format(v1::OUTPUT_FORMAT_JPEG);
  request.set_num_images(3);
  request.set_request_id("req-42");
  absl::StatusOr<JobSpec> spec = validate_generate_request(request, test_limits(), 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->params.prompt, "a cat");
  EXPECT_EQ(spec->params.width, 512);
  EXPECT_EQ(spec->params.height, 256);
  EXPECT_EQ(spec->params.num_inference_steps, 7);
  EXPECT_EQ(spec->params.guidance_scale, 0.0);
  EXPECT_EQ(spec->params.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(spec->format, ImageFormat::kJpeg);
  EXPECT_EQ(spec->num_images, 3);
  EXPECT_EQ(spec->request_id, "req-42");
  EXPECT_EQ(spec->encoder_quality, kDefaultEncoderQuality);
}

// The fields the violations of `status` name, in order.
std::vector<std::string> bad_fields(const absl::Status& status) {
  std::vector<std::string> fields;
  for (const FieldViolation& violation : field_violations_of(status))
    fields.push_back(violation.field);
  return fields;
}

TEST(RequestValidation, WebpAndOutputQuality) {
  v1::GenerateImageRequest request = valid_request();
  request.set_output_format(v1::OUTPUT_FORMAT_WEBP);
  request.set_output_quality(70);
  absl::StatusOr<JobSpec> spec = validate_generate_request(request, test_limits(), 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->format, ImageFormat::kWebp);
  EXPECT_EQ(spec->encoder_quality, 70);
  request.set_output_quality(0);
  EXPECT_EQ(bad_fields(validate_generate_request(request, test_limits(), 1).status()),
            std::vector<std::string>{"output_quality"});
  request.set_output_quality(101);
  EXPECT_EQ(bad_fields(validate_generate_request(request, test_limits(), 1).status()),
            std::vector<std::string>{"output_quality"});
  // PNG is lossless: a quality is a mistake, not ignored.
  request.set_output_format(v1::OUTPUT_FORMAT_PNG);
  request.set_output_quality(90);
  EXPECT_EQ(bad_fields(validate_generate_request(request, test_limits(), 1).status()),
            std::vector<std::string>{"output_quality"});
  // WebP sides stop at 16383 (VP8's 14 bits): 16384 x 16 within the pixel budget is refused up
  // front, naming the format.
  request.clear_output_quality();
  request.set_output_format(v1::OUTPUT_FORMAT_WEBP);
  request.set_width(16384);
  request.set_height(16);
  EXPECT_EQ(bad_fields(validate_generate_request(request, test_limits(), 1).status()),
            std::vector<std::string>{"output_format"});
  request.set_output_format(v1::OUTPUT_FORMAT_PNG);
  EXPECT_TRUE(validate_generate_request(request, test_limits(), 1).ok());
}

TEST(RequestValidation, QualityHighAndNegativePromptWhenAllowed) {
  Limits limits = test_limits();
  limits.quality_high_enabled = true;
  limits.uses_cfg = true;
  v1::GenerateImageRequest request = valid_request();
  request.set_quality(v1::QUALITY_HIGH);
  request.set_negative_prompt("blurry");
  absl::StatusOr<JobSpec> spec = validate_generate_request(request, limits, 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->params.quality, Quality::kHigh);
  EXPECT_EQ(spec->params.negative_prompt, "blurry");
}

// FLUX.2-dev's limits (the server copies PipelineInfo::uses_cfg, false for dev): an explicit
// guidance_scale reaches the engine (its guidance embedder), a negative prompt is refused naming
// the field.
TEST(RequestValidation, DevTakesGuidanceButNoNegativePrompt) {
  Limits limits = test_limits();
  limits.uses_cfg = false;
  v1::GenerateImageRequest request = valid_request();
  request.set_guidance_scale(2.5);
  absl::StatusOr<JobSpec> spec = validate_generate_request(request, limits, 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->params.guidance_scale, 2.5);
  request.set_negative_prompt("blurry");
  spec = validate_generate_request(request, limits, 1);
  ASSERT_FALSE(spec.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(spec.status())) << spec.status();
  const std::vector<FieldViolation> violations = field_violations_of(spec.status());
  ASSERT_EQ(violations.size(), 1u);
  EXPECT_EQ(violations[0].field, "negative_prompt");
}

struct InvalidCase {
  const char* name;
  std::function<void(v1::GenerateImageRequest&)> mutate;
  const char* field;
};

TEST(RequestValidation, EachInvalidFieldIsNamed) {
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<InvalidCase> cases = {
      {"empty prompt", [](auto& r) { r.set_prompt(""); }, "prompt"},
      {"long prompt", [](auto& r) { r.set_prompt(std::string(65, 'a')); }, "prompt"},
      {"width not x16", [](auto& r) { r.set_width(500); }, "width"},
      {"negative width", [](auto& r) { r.set_width(-16); }, "width"},
      {"height not x16", [](auto& r) { r.set_height(250); }, "height"},
      {"negative height", [](auto& r) { r.set_height(-32); }, "height"},
      {"pixel budget",
       [](auto& r) {
         r.set_width(2048);
         r.set_height(1024);
       },
       "width"},
      {"pixel budget (height)",
       [](auto& r) {
         r.set_width(1024);
         r.set_height(2048);
       },
       "height"},
      {"default size over budget",
       [](auto& r) {
         r.set_width(0);
         r.set_height(2048);
       },
       "height"},
      {"steps too many", [](auto& r) { r.set_num_inference_steps(51); }, "num_inference_steps"},
      {"steps negative", [](auto& r) { r.set_num_inference_steps(-1); }, "num_inference_steps"},
      {"guidance NaN", [nan](auto& r) { r.set_guidance_scale(nan); }, "guidance_scale"},
      {"guidance +inf", [inf](auto& r) { r.set_guidance_scale(inf); }, "guidance_scale"},
      {"guidance -inf", [inf](auto& r) { r.set_guidance_scale(-inf); }, "guidance_scale"},
      {"guidance negative", [](auto& r) { r.set_guidance_scale(-0.5); }, "guidance_scale"},
      {"guidance too large", [](auto& r) { r.set_guidance_scale(100.5); }, "guidance_scale"},
      {"unknown quality", [](auto& r) { r.set_quality(static_cast<v1::Quality>(7)); }, "quality"},
      {"quality high disabled", [](auto& r) { r.set_quality(v1::QUALITY_HIGH); }, "quality"},
      {"unknown format", [](auto& r) { r.set_output_format(static_cast<v1::OutputFormat>(9)); },
       "output_format"},
      {"num_images too many", [](auto& r) { r.set_num_images(5); }, "num_images"},
      {"num_images negative", [](auto& r) { r.set_num_images(-1); }, "num_images"},
      {"negative prompt without CFG", [](auto& r) { r.set_negative_prompt("blurry"); },
       "negative_prompt"},
      {"request id too long", [](auto& r) { r.set_request_id(std::string(129, 'x')); },
       "request_id"},
      {"request id not printable", [](auto& r) { r.set_request_id("a\nb"); }, "request_id"},
      {"sigmas count != steps",
       [](auto& r) {
         r.set_num_inference_steps(3);
         r.add_sigmas(1.0);
         r.add_sigmas(0.5);
       },
       "sigmas"},
      {"sigmas over max steps",
       [](auto& r) {
         for (int i = 0; i < 51; ++i) r.add_sigmas(1.0 - i / 64.0);
       },
       "sigmas"},
      {"sigma zero",
       [](auto& r) {
         r.add_sigmas(1.0);
         r.add_sigmas(0.0);
       },
       "sigmas[1]"},
      {"sigma above one", [](auto& r) { r.add_sigmas(1.5); }, "sigmas[0]"},
      {"sigma NaN", [nan](auto& r) { r.add_sigmas(nan); }, "sigmas[0]"},
      {"sigmas increase",
       [](auto& r) {
         r.add_sigmas(0.5);
         r.add_sigmas(0.75);
       },
       "sigmas[1]"},
      {"sigmas equal as float32",
       [](auto& r) {
         r.add_sigmas(0.5);
         r.add_sigmas(0.5 - 1e-12);
       },
       "sigmas[1]"},
  };
  for (const InvalidCase& c : cases) {
    v1::GenerateImageRequest request = valid_request();
    c.mutate(request);
    absl::StatusOr<JobSpec> spec = validate_generate_request(request, test_limits(), 1);
    ASSERT_FALSE(spec.ok()) << c.name;
    EXPECT_TRUE(absl::IsInvalidArgument(spec.status())) << c.name;
    EXPECT_NE(spec.status().message().find(c.field), std::string::npos)
        << c.name << ": " << spec.status();
    bool named = false;
    for (const FieldViolation& v : field_violations_of(spec.status())) named |= v.field == c.field;
    EXPECT_TRUE(named) << c.name << ": no violation names " << c.field;
  }
}

TEST(RequestValidation, CustomSigmasSetTheStepsAndReachTheJob) {
  v1::GenerateImageRequest request = valid_request();
  for (double sigma : {1.0, 0.6509, 0.4374, 0.00031}) request.add_sigmas(sigma);
  absl::StatusOr<JobSpec> spec = validate_generate_request(request, test_limits(), 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->params.num_inference_steps, 4);  // no steps given: one per sigma
  EXPECT_EQ(spec->params.sigmas, (std::vector<double>{1.0, 0.6509, 0.4374, 0.00031}));
  request.set_num_inference_steps(4);  // or as many as the steps
  EXPECT_TRUE(validate_generate_request(request, test_limits(), 1).ok());
  request.set_sigmas(2, 0.7);
  spec = validate_generate_request(request, test_limits(), 1);
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find(
                "sigmas[2]: 0.7 does not decrease from sigmas[1] = 0.6509 (compared in float32)"),
            std::string::npos)
      << spec.status();
}

// Step caching over gRPC: DBCache with sglang's defaults unless given, the schedule preset made
// for the steps that run, refusals naming the field (8 steps or fewer: `cache`).
TEST(RequestValidation, StepCacheReachesTheJobOrIsRefusedNamingTheField) {
  v1::GenerateImageRequest request = valid_request();
  request.set_num_inference_steps(12);
  request.mutable_cache()->set_threshold(0.5);
  absl::StatusOr<JobSpec> spec = validate_generate_request(request, test_limits(), 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->params.cache.mode, StepCacheOptions::Mode::kDbCache);
  EXPECT_EQ(spec->params.cache.warmup_steps, 4);
  EXPECT_EQ(spec->params.cache.max_consecutive_cached, 3);
  EXPECT_EQ(spec->params.cache.threshold, 0.5);

  request.mutable_cache()->set_mode(v1::StepCache::MODE_SCHEDULE);
  request.mutable_cache()->set_schedule_preset("dbcache-default");
  spec = validate_generate_request(request, test_limits(), 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->params.cache.schedule, step_cache_default_schedule(12));

  auto refused = [&](const v1::GenerateImageRequest& r, const std::string& message) {
    absl::StatusOr<JobSpec> s = validate_generate_request(r, test_limits(), 1);
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(s.status()));
    EXPECT_NE(s.status().message().find(message), std::string::npos) << s.status();
  };
  v1::GenerateImageRequest short_run = valid_request();
  short_run.set_num_inference_steps(8);
  short_run.mutable_cache()->set_mode(v1::StepCache::MODE_DBCACHE);
  refused(short_run, "cache: step caching needs more than 8 steps; this run has 8");
  v1::GenerateImageRequest bad = valid_request();
  bad.set_num_inference_steps(20);
  bad.mutable_cache()->set_threshold(-1);
  refused(bad, "cache.threshold: -1 is not a finite value in 0..1");
  bad.mutable_cache()->clear_threshold();
  bad.mutable_cache()->set_warmup_steps(21);
  refused(bad, "cache.warmup_steps: 21 is outside 0..20");
  bad.mutable_cache()->clear_warmup_steps();
  bad.mutable_cache()->set_mode(v1::StepCache::MODE_SCHEDULE);
  bad.mutable_cache()->add_schedule(true);
  refused(bad, "cache.schedule: 1 flags for a run of 20 steps");
  bad.mutable_cache()->set_schedule_preset("fast");
  refused(bad, "cache.schedule_preset: \"fast\" is not a known preset");
  v1::GenerateImageRequest off = valid_request();
  off.set_num_inference_steps(4);
  off.mutable_cache()->set_mode(v1::StepCache::MODE_OFF);
  spec = validate_generate_request(off, test_limits(), 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->params.cache.enabled());
}

TEST(RequestValidation, GuidanceErrorShowsTheValueSent) {
  v1::GenerateImageRequest request = valid_request();
  request.set_guidance_scale(100.0001);  // %g would print "100"
  absl::StatusOr<JobSpec> spec = validate_generate_request(request, test_limits(), 1);
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("guidance_scale: 100.0001 is outside 0..100"),
            std::string::npos)
      << spec.status();
}

TEST(RequestValidation, ReportsEveryViolationAtOnce) {
  v1::GenerateImageRequest request = valid_request();
  request.set_prompt("");
  request.set_width(17);
  request.set_num_images(9);
  absl::StatusOr<JobSpec> spec = validate_generate_request(request, test_limits(), 1);
  ASSERT_FALSE(spec.ok());
  std::vector<std::string> fields;
  for (const FieldViolation& v : field_violations_of(spec.status())) fields.push_back(v.field);
  EXPECT_EQ(fields, (std::vector<std::string>{"prompt", "width", "num_images"}));
}

TEST(FieldViolations, RoundTripAnyBytesInTheStatus) {
  // Descriptions may quote what the client sent, NUL and invalid UTF-8 included.
  constexpr char kQuoted[] = "'\xff\0:3' is not an integer";  // NUL inside: sized by sizeof
  const std::vector<FieldViolation> sent = {{"height", "40 is not a multiple"},
                                            {"n", std::string(kQuoted, sizeof(kQuoted) - 1)}};
  const absl::Status status = invalid_argument_status(sent);
  ASSERT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_EQ(status.message().substr(0, 28), "height: 40 is not a multiple");
  const std::vector<FieldViolation> got = field_violations_of(status);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].field, "height");
  EXPECT_EQ(got[0].description, "40 is not a multiple");
  EXPECT_EQ(got[1].field, "n");
  EXPECT_EQ(got[1].description, sent[1].description);
  EXPECT_TRUE(field_violations_of(absl::InternalError("x")).empty());
}

// ---- reference images ---------------------------------------------------------------------------

using testing::gradient_pixels;

std::string png(int64_t width, int64_t height) {
  return testing::gradient_png(width, height);
}
std::string jpeg(int64_t width, int64_t height) {
  return testing::gradient_jpeg(width, height);
}

// An editing request without a size: the output takes the first reference's.
v1::GenerateImageRequest edit_request(const std::vector<std::string>& references) {
  v1::GenerateImageRequest request;
  request.set_prompt("make it night");
  for (const std::string& data : references) request.add_reference_images()->set_data(data);
  return request;
}

std::vector<std::string> violation_fields(const absl::Status& status) {
  std::vector<std::string> fields;
  for (const FieldViolation& v : field_violations_of(status)) fields.push_back(v.field);
  return fields;
}

TEST(RequestValidation, ReferenceSetsTheOutputSizeAndIsPrepared) {
  // 100 x 72 is not a multiple of 16: center-cropped to 96 x 64 (no resampling).
  absl::StatusOr<JobSpec> spec =
      validate_generate_request(edit_request({png(100, 72), jpeg(64, 80)}), test_limits(), 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const GenerateParams& params = spec->params;
  ASSERT_EQ(params.references.size(), 2u);
  EXPECT_EQ(params.references[0].width, 96);
  EXPECT_EQ(params.references[0].height, 64);
  EXPECT_EQ(params.references[0].pixels.size(), 96u * 64u * 3u);
  EXPECT_EQ(params.references[1].width, 64);
  EXPECT_EQ(params.references[1].height, 80);
  // The crop keeps the center: pixel (0, 0) of the prepared image is (2, 4) of the original.
  const std::vector<uint8_t> original = gradient_pixels(100, 72);
  EXPECT_EQ(params.references[0].pixels[0], original[(4 * 100 + 2) * 3]);
  EXPECT_EQ(params.width, 96);  // width = height = 0: the first reference's prepared size
  EXPECT_EQ(params.height, 64);
  EXPECT_EQ(params.max_sequence_length, test_limits().max_sequence_length);

  // A size in the request wins over the reference's.
  v1::GenerateImageRequest sized = edit_request({png(100, 72)});
  sized.set_width(64);
  sized.set_height(48);
  spec = validate_generate_request(sized, test_limits(), 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->params.width, 64);
  EXPECT_EQ(spec->params.height, 48);
  EXPECT_EQ(spec->params.references.size(), 1u);
}

TEST(RequestValidation, LargeReferenceIsResizedToTheAreaAndSizesTheOutput) {
  // 2048 x 1024 (2 MP) -> diffusers' int(side x sqrt(1 MP / area)) = 1448 x 724 -> cropped to
  // multiples of 16: 1440 x 720, the output size.
  Limits limits = test_limits();
  limits.max_pixels = 2048 * 2048;
  absl::StatusOr<JobSpec> spec =
      validate_generate_request(edit_request({png(2048, 1024)}), limits, 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->params.references[0].width, 1440);
  EXPECT_EQ(spec->params.references[0].height, 720);
  EXPECT_EQ(spec->params.width, 1440);
  EXPECT_EQ(spec->params.height, 720);
}

TEST(RequestValidation, PixelBudgetAppliesToTheReferenceSize) {
  Limits limits = test_limits();
  limits.max_pixels = 64 * 64;
  absl::StatusOr<JobSpec> spec = validate_generate_request(edit_request({png(100, 72)}), limits, 1);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(violation_fields(spec.status()), (std::vector<std::string>{"width", "height"}));
  EXPECT_NE(spec.status().message().find("96 x 64 = 6144 pixels exceeds the budget of 4096"),
            std::string::npos)
      << spec.status();
  EXPECT_NE(spec.status().message().find("reference_images[0]"), std::string::npos);
}

struct BadReferenceCase {
  const char* name;
  std::vector<std::string> references;
  Limits limits;
  const char* field;
  const char* message;  // the status message (starts with the violation)
};

TEST(RequestValidation, EachBadReferenceIsNamed) {
  const std::string good = png(64, 64);
  std::string truncated = png(80, 80);
  truncated.resize(truncated.size() / 2);
  Limits no_editing = test_limits();
  no_editing.max_reference_images = 0;
  const std::vector<BadReferenceCase> cases = {
      {"too many", std::vector<std::string>(5, good), test_limits(), "reference_images",
       "reference_images: 5 reference images exceed the limit of 4"},
      {"too many bytes",
       {good, good, std::string(12000000, 'x')},
       test_limits(),
       "reference_images[2]",
       "reference_images[2]: 12000000 bytes exceed the limit of 10485760"},
      {"empty", {""}, test_limits(), "reference_images[0]", "reference_images[0]: empty"},
      {"not an image",
       {good, "GIF89a not really"},
       test_limits(),
       "reference_images[1]",
       "reference_images[1]: not a PNG or JPEG image"},
      {"under 64 px",
       {png(32, 32)},
       test_limits(),
       "reference_images[0]",
       "reference_images[0]: 32x32 is under 64 px a side"},
      {"aspect 12:1",
       {png(768, 64)},
       test_limits(),
       "reference_images[0]",
       "reference_images[0]: aspect ratio 12.0 exceeds 8"},
      {"truncated PNG", {truncated}, test_limits(), "reference_images[0]", "reference_images[0]: "},
      {"editing off",
       {good},
       no_editing,
       "reference_images",
       "reference_images: this server does not accept reference images"},
  };
  for (const BadReferenceCase& c : cases) {
    absl::StatusOr<JobSpec> spec =
        validate_generate_request(edit_request(c.references), c.limits, 1);
    ASSERT_FALSE(spec.ok()) << c.name;
    EXPECT_TRUE(absl::IsInvalidArgument(spec.status())) << c.name << ": " << spec.status();
    EXPECT_EQ(spec.status().message().substr(0, std::string(c.message).size()), c.message)
        << c.name << ": " << spec.status();
    EXPECT_EQ(violation_fields(spec.status()), std::vector<std::string>{c.field})
        << c.name << ": " << spec.status();
  }
}

TEST(RequestValidation, EveryBadReferenceGetsItsOwnViolation) {
  v1::GenerateImageRequest request = edit_request({"", png(64, 64), "junk", png(32, 32)});
  request.set_num_inference_steps(-1);
  absl::StatusOr<JobSpec> spec = validate_generate_request(request, test_limits(), 1);
  ASSERT_FALSE(spec.ok());
  // In field order; the size is unknown (reference 0 is bad), so no width/height violation.
  EXPECT_EQ(violation_fields(spec.status()),
            (std::vector<std::string>{"reference_images[0]", "reference_images[2]",
                                      "reference_images[3]", "num_inference_steps"}));
  EXPECT_EQ(spec.status().message().substr(0, 25), "reference_images[0]: empt");
}

TEST(RpcStatus, InvalidArgumentCarriesBadRequestDetails) {
  const absl::Status status =
      invalid_argument_status({{"width", "odd"}, {"guidance_scale", "NaN"}});
  const grpc::Status rpc = to_grpc_status(status);
  EXPECT_EQ(rpc.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(rpc.error_message(), "width: odd; guidance_scale: NaN");
  google::rpc::Status details;
  ASSERT_TRUE(details.ParseFromString(rpc.error_details()));
  EXPECT_EQ(details.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(details.message(), rpc.error_message());
  ASSERT_EQ(details.details_size(), 1);
  EXPECT_EQ(details.details(0).type_url(), kBadRequestTypeUrl);
  EXPECT_EQ(testing::bad_request_fields(rpc),
            (std::vector<std::string>{"width", "guidance_scale"}));
}

TEST(RpcStatus, CodesAndMessagesPassThrough) {
  EXPECT_TRUE(to_grpc_status(absl::OkStatus()).ok());
  const grpc::Status full = to_grpc_status(absl::ResourceExhaustedError("queue full"));
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(full.error_message(), "queue full");
  EXPECT_TRUE(full.error_details().empty());
  EXPECT_EQ(to_grpc_status(absl::DeadlineExceededError("")).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(to_grpc_status(absl::UnavailableError("")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(to_grpc_status(absl::UnauthenticatedError("")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(status_code_name(absl::ResourceExhaustedError("x")), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(status_code_name(absl::OkStatus()), "OK");
  EXPECT_EQ(status_code_name(absl::DeadlineExceededError("x")), "DEADLINE_EXCEEDED");
}

// The PNG bound as derived in validate.cc: 768 x 768 gives 1771131 bytes, so two fit gRPC's
// default 4 MiB and three do not.
TEST(ResponseBound, PngAndJpegFigures) {
  EXPECT_EQ(encoded_image_bound_bytes(ImageFormat::kPng, 768, 768), 1771131);
  EXPECT_EQ(encoded_image_bound_bytes(ImageFormat::kJpeg, 768, 768), 768 * 768 * 6 + 2048);
  EXPECT_EQ(encoded_image_bound_bytes(ImageFormat::kJpeg, 20, 10), 24 * 16 * 6 + 2048);
  Limits limits = test_limits();
  limits.max_response_bytes = int64_t{4} << 20;
  JobSpec spec;
  spec.params.width = 768;
  spec.params.height = 768;
  spec.params.num_inference_steps = 4;
  spec.num_images = 2;
  EXPECT_TRUE(check_unary_response_size(spec, limits).ok());
  spec.num_images = 3;
  const absl::Status refused = check_unary_response_size(spec, limits);
  EXPECT_TRUE(absl::IsInvalidArgument(refused));
  ASSERT_EQ(field_violations_of(refused).size(), 1u);
  EXPECT_EQ(field_violations_of(refused)[0].field, "num_images");
  EXPECT_NE(refused.message().find("GenerateImageStream"), std::string::npos) << refused;
  EXPECT_GT(unary_response_bound_bytes(spec, 50), 3 * 1771131);
  // The smallest --max-response-bytes still takes one small image (it is not a limit that refuses
  // every unary call).
  limits.max_response_bytes = kMinMaxResponseBytes;
  spec.num_images = 1;
  spec.params.width = 128;
  spec.params.height = 128;
  EXPECT_TRUE(check_unary_response_size(spec, limits).ok());
  spec.params.width = 768;
  spec.params.height = 768;
  spec.num_images = 3;
  // num_inference_steps 0 (model default) counts the limit's max_steps timings.
  spec.params.num_inference_steps = 0;
  EXPECT_EQ(unary_response_bound_bytes(spec, 50) - unary_response_bound_bytes(spec, 10),
            3 * 8 * 40);
}

// The bound holds for the real encoders on their worst input (uniform noise, incompressible), and
// the PNG one is tight (within 1%): sizes that do not divide evenly into rows, chunks or blocks.
TEST(ResponseBound, HoldsForTheEncodersOnNoise) {
  std::mt19937 rng(7);
  for (const auto& [width, height] : std::vector<std::pair<int64_t, int64_t>>{
           {16, 16}, {64, 48}, {333, 97}, {768, 768}, {1024, 1040}}) {
    std::vector<uint8_t> rgb(static_cast<size_t>(width * height * 3));
    for (uint8_t& v : rgb) v = static_cast<uint8_t>(rng());
    absl::StatusOr<std::vector<uint8_t>> png = encode_png(rgb, width, height);
    ASSERT_TRUE(png.ok()) << png.status();
    const int64_t png_bound = encoded_image_bound_bytes(ImageFormat::kPng, width, height);
    EXPECT_LE(static_cast<int64_t>(png->size()), png_bound) << width << " x " << height;
    EXPECT_GE(static_cast<double>(png->size()), 0.99 * static_cast<double>(png_bound))
        << width << " x " << height;
    absl::StatusOr<std::vector<uint8_t>> jpeg =
        encode_jpeg(rgb, width, height, kDefaultEncoderQuality);
    ASSERT_TRUE(jpeg.ok()) << jpeg.status();
    EXPECT_LE(static_cast<int64_t>(jpeg->size()),
              encoded_image_bound_bytes(ImageFormat::kJpeg, width, height))
        << width << " x " << height;
  }
}

}  // namespace
}  // namespace flux2::server
