// Request validation (server/request_validation.h) and the absl -> gRPC status mapping
// (server/rpc_status.h): defaults, seeds, one table row per invalid field (the violation names it),
// and the BadRequest details in the grpc-status-details-bin payload.
// Run: build/bin/server_unit_tests --gtest_filter='RequestValidation*:RpcStatus*'
#include "server/request_validation.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "gtest/gtest.h"
#include "server/rpc_status.h"
#include "tests/server/test_support.h"

namespace flux2::server {
namespace {

namespace v1 = flux2::v1;

RequestLimits test_limits() {
  RequestLimits limits;
  limits.pixel_multiple = 16;
  limits.max_pixels = 1024 * 1024;
  limits.max_steps = 50;
  limits.max_images = 4;
  limits.max_prompt_bytes = 64;
  limits.uses_cfg = false;
  limits.quality_high_enabled = false;
  return limits;
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
  RequestLimits limits = test_limits();
  limits.max_pixels = 1024 * 1024;
  absl::StatusOr<JobSpec> spec = validate_generate_request(request, limits, /*random_seed=*/777);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->params.width, kDefaultImageSide);
  EXPECT_EQ(spec->params.height, kDefaultImageSide);
  EXPECT_EQ(spec->params.num_inference_steps, 0);  // the model default
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
}

TEST(RequestValidation, QualityHighAndNegativePromptWhenAllowed) {
  RequestLimits limits = test_limits();
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

TEST(RequestValidation, EngineErrorsBecomeFieldViolations) {
  const absl::Status status =
      engine_validation_status(absl::InvalidArgumentError("height: 40 is not a multiple"));
  ASSERT_TRUE(absl::IsInvalidArgument(status));
  const std::vector<FieldViolation> violations = field_violations_of(status);
  ASSERT_EQ(violations.size(), 1u);
  EXPECT_EQ(violations[0].field, "height");
  EXPECT_EQ(violations[0].description, "40 is not a multiple");
  EXPECT_TRUE(engine_validation_status(absl::OkStatus()).ok());
  EXPECT_TRUE(absl::IsInternal(engine_validation_status(absl::InternalError("x"))));
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
  EXPECT_EQ(grpc_code_name(grpc::StatusCode::RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(grpc_code_name(grpc::StatusCode::OK), "OK");
  EXPECT_EQ(grpc_code_name(grpc::StatusCode::DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED");
}

}  // namespace
}  // namespace flux2::server
