// The one limits table, end to end (server/serving/limits.h): for every limit a request can meet,
// the value GetModelInfo reports is accepted and the value one past it is refused naming the
// field, over gRPC (a BadRequest field violation) and over HTTP (OpenAI's `param`); the `ready`
// line, /v1/models and GetModelInfo report the same numbers; and a flag beyond the pipeline's own
// bound is refused at start-up naming both numbers. Fake engine, in process.
// Run: build/bin/server_unit_tests --gtest_filter='LimitsTest*'
#include <httplib.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/json_util.h"
#include "nlohmann/json.hpp"
#include "server/app/server_options.h"
#include "server/serving/limits.h"
#include "tests/server/server_fixture.h"
#include "tests/server/test_support.h"

namespace flux2::server {
namespace {

namespace v1 = flux2::v1;
using nlohmann::json;

// The side of the square pixel budget the tests serve (options_.max_pixels = kSide x kSide).
constexpr int kSide = 256;  // --max-pixels allows no less than 256 x 256

// One bounded request field: how to set it to a value on each wire, and the names a refusal
// must carry.
struct LimitCase {
  std::string limit;  // the GetModelInfo.limits field
  std::function<void(v1::GenerateImageRequest&, double)> set_grpc;
  std::function<void(json&, double)> set_http;
  std::string grpc_field, http_param;
  double step = 1;  // "one past": the next integer, or the next double for guidance
};

// The four tiny-klein adapters (tests/data/tiny-klein/loras) by the names the cases use; a fifth
// name only ever meets the count check.
const char* const kLoraNames[] = {"style", "bfl", "fal", "kohya", "fifth"};

void set_loras(v1::GenerateImageRequest& r, double count, double scale) {
  r.clear_loras();
  for (int i = 0; i < static_cast<int>(count); ++i) {
    v1::LoraAdapter* lora = r.add_loras();
    lora->set_name(kLoraNames[i]);
    lora->set_scale(scale);
  }
}

void set_loras(json& b, double count, double scale) {
  b["loras"] = json::array();
  for (int i = 0; i < static_cast<int>(count); ++i) {
    b["loras"].push_back({{"name", kLoraNames[i]}, {"scale", scale}});
  }
}

class LimitsTest : public testing::FakeServerTest {
 protected:
  void SetUp() override {
    FakeServerTest::SetUp();
    options_.max_pixels = kSide * kSide;  // small: every accepted request runs for real
    options_.max_steps = 6;
    options_.max_images = 3;
    options_.max_prompt_bytes = 40;
    control_->open_gate();
    // --lora-dir with the tiny adapters; the fake engine parses them for the tiny transformer.
    const std::string data = FLUX2_TEST_DATA_DIR "/tiny-klein/";
    lora_dir_ = std::filesystem::temp_directory_path() /
                ("flux2_limits_loras_" + std::to_string(::getpid()));
    std::filesystem::remove_all(lora_dir_);
    std::filesystem::create_directories(lora_dir_);
    const std::pair<const char*, const char*> files[] = {{"style", "style_diffusers"},
                                                         {"bfl", "bfl_aitoolkit"},
                                                         {"fal", "fal_peft"},
                                                         {"kohya", "kohya"}};
    for (const auto& [name, file] : files) {
      std::filesystem::copy_file(data + "loras/" + file + ".safetensors",
                                 lora_dir_ / (std::string(name) + ".safetensors"));
    }
    absl::StatusOr<json> config = read_json_file(data + "checkpoint/transformer/config.json");
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<Flux2Config> transformer = Flux2Config::from_json(*config, "tiny-klein");
    ASSERT_TRUE(transformer.ok()) << transformer.status();
    control_->lora_config = *transformer;
    options_.lora_dir = lora_dir_.string();
  }
  void TearDown() override {
    FakeServerTest::TearDown();
    std::filesystem::remove_all(lora_dir_);
  }

  std::filesystem::path lora_dir_;

  v1::GetModelInfoResponse model_info() {
    grpc::ClientContext context;
    v1::GetModelInfoResponse info;
    EXPECT_TRUE(stub_->GetModelInfo(&context, {}, &info).ok());
    return info;
  }

  // The limit's value as GetModelInfo reports it.
  double reported(const v1::Limits& limits, const std::string& name) {
    const auto* field = limits.GetDescriptor()->FindFieldByName(name);
    EXPECT_NE(field, nullptr) << name;
    if (field == nullptr) return 0;
    const auto* reflection = limits.GetReflection();
    switch (field->cpp_type()) {
      case google::protobuf::FieldDescriptor::CPPTYPE_INT32:
        return reflection->GetInt32(limits, field);
      case google::protobuf::FieldDescriptor::CPPTYPE_INT64:
        return static_cast<double>(reflection->GetInt64(limits, field));
      default:
        return reflection->GetDouble(limits, field);
    }
  }

  grpc::Status generate_grpc(const v1::GenerateImageRequest& request) {
    grpc::ClientContext context;
    v1::GenerateImageResponse response;
    return stub_->GenerateImage(&context, request, &response);
  }

  std::pair<int, json> generate_http(const json& body) {
    httplib::Client client("127.0.0.1", server_->http_port());
    client.set_read_timeout(120);
    httplib::Result r = client.Post("/v1/images/generations", body.dump(), "application/json");
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
};

std::vector<LimitCase> limit_cases() {
  return {
      {"max_steps", [](auto& r, double v) { r.set_num_inference_steps(static_cast<int>(v)); },
       [](json& b, double v) { b["num_inference_steps"] = static_cast<int64_t>(v); },
       "num_inference_steps", "num_inference_steps"},
      {"max_images", [](auto& r, double v) { r.set_num_images(static_cast<int>(v)); },
       [](json& b, double v) { b["n"] = static_cast<int64_t>(v); }, "num_images", "n"},
      {"max_prompt_bytes",
       [](auto& r, double v) { r.set_prompt(std::string(static_cast<size_t>(v), 'a')); },
       [](json& b, double v) { b["prompt"] = std::string(static_cast<size_t>(v), 'a'); }, "prompt",
       "prompt"},
      {"max_guidance", [](auto& r, double v) { r.set_guidance_scale(v); },
       [](json& b, double v) { b["guidance_scale"] = v; }, "guidance_scale", "guidance_scale",
       std::numeric_limits<double>::infinity()},
      {"min_guidance", [](auto& r, double v) { r.set_guidance_scale(v); },
       [](json& b, double v) { b["guidance_scale"] = v; }, "guidance_scale", "guidance_scale",
       -std::numeric_limits<double>::infinity()},
      // max_pixels: kSide wide, as tall as the pixel count (kSide x kSide is the budget, then
      // kSide x (kSide + pixel_multiple) one past it).
      {"max_pixels",
       [](auto& r, double v) {
         r.set_width(kSide);
         r.set_height(static_cast<int>(v) / kSide);
       },
       [](json& b, double v) {
         b["size"] = std::to_string(kSide) + "x" + std::to_string(static_cast<int>(v) / kSide);
       },
       "width", "size"},
      {"max_loras_per_request", [](auto& r, double v) { set_loras(r, v, 1.0); },
       [](json& b, double v) { set_loras(b, v, 1.0); }, "loras", "loras"},
      {"max_lora_scale", [](auto& r, double v) { set_loras(r, 1, v); },
       [](json& b, double v) { set_loras(b, 1, v); }, "loras[0].scale", "loras[0].scale",
       std::numeric_limits<double>::infinity()},
  };
}

// The value one past `value` for a case: the next integer, or for guidance the next double.
double one_past(const LimitCase& c, double value, double pixel_multiple) {
  if (std::isinf(c.step)) return std::nextafter(value, c.step);
  if (c.limit == "max_pixels") return value + kSide * pixel_multiple;
  return value + c.step;
}

TEST_F(LimitsTest, EveryReportedLimitIsAcceptedAndOnePastIsRefusedNamingTheField) {
  start();
  ASSERT_GT(server_->http_port(), 0);
  const v1::Limits limits = model_info().limits();
  for (const LimitCase& c : limit_cases()) {
    const double at = reported(limits, c.limit);
    const double past = one_past(c, at, limits.pixel_multiple());
    SCOPED_TRACE(c.limit + " = " + std::to_string(at));
    v1::GenerateImageRequest request = testing::small_request(/*seed=*/1, /*steps=*/1);
    c.set_grpc(request, at);
    EXPECT_TRUE(generate_grpc(request).ok()) << generate_grpc(request).error_message();
    c.set_grpc(request, past);
    const grpc::Status refused = generate_grpc(request);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(testing::bad_request_fields(refused).at(0), c.grpc_field) << refused.error_message();

    json body = {{"prompt", "a fox"}, {"size", "64x48"}, {"num_inference_steps", 1}, {"seed", 1}};
    c.set_http(body, at);
    EXPECT_EQ(generate_http(body).first, 200) << generate_http(body).second.dump();
    c.set_http(body, past);
    const auto [status, error] = generate_http(body);
    EXPECT_EQ(status, 400);
    EXPECT_EQ(error["error"]["param"], c.http_param) << error.dump();
  }
}

// max_lora_rank: an adapter of that rank is accepted, and one of a higher rank refused naming it
// (bfl_aitoolkit is rank 8 throughout).
TEST_F(LimitsTest, TheReportedLoraRankIsAcceptedAndAHigherOneRefused) {
  options_.max_lora_rank = 8;
  start();
  EXPECT_EQ(model_info().limits().max_lora_rank(), 8);
  v1::GenerateImageRequest request = testing::small_request(/*seed=*/1, /*steps=*/1);
  request.add_loras()->set_name("bfl");
  EXPECT_TRUE(generate_grpc(request).ok()) << generate_grpc(request).error_message();
}

TEST_F(LimitsTest, ALoraRankPastTheLimitIsRefusedNamingTheAdapter) {
  options_.max_lora_rank = 7;
  start();
  v1::GenerateImageRequest request = testing::small_request(/*seed=*/1, /*steps=*/1);
  request.add_loras()->set_name("bfl");
  const grpc::Status refused = generate_grpc(request);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(testing::bad_request_fields(refused).at(0), "loras[0]");
  EXPECT_NE(refused.error_message().find("exceeds --max-lora-rank 7"), std::string::npos)
      << refused.error_message();
  const auto [status, error] =
      generate_http({{"prompt", "a fox"}, {"size", "64x48"}, {"loras", {{{"name", "bfl"}}}}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["error"]["param"], "loras[0]") << error.dump();
}

TEST_F(LimitsTest, ModelsEndpointReportsTheSameTable) {
  start();
  const v1::Limits limits = model_info().limits();
  httplib::Client client("127.0.0.1", server_->http_port());
  httplib::Result r = client.Get("/v1/models");
  ASSERT_TRUE(r);
  const json models = json::parse(r->body);
  const json& table = models["data"][0]["limits"];
  ASSERT_TRUE(table.is_object()) << r->body;
  Limits defaults;
  for (const LimitEntry& entry : limit_entries(defaults)) {
    ASSERT_TRUE(table.contains(entry.name)) << entry.name;
    EXPECT_EQ(table[entry.name].get<double>(), reported(limits, entry.name)) << entry.name;
  }
}

TEST(LimitFlagsTest, AFlagBeyondThePipelinesBoundIsRefusedAtStartUpNamingBothNumbers) {
  ServerOptions options;
  options.max_steps = static_cast<int>(kMaxInferenceSteps) + 300;  // e.g. --max-steps 500
  const absl::Status status = validate_server_options(options);
  ASSERT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_NE(status.message().find("--max-steps"), std::string::npos) << status;
  EXPECT_NE(status.message().find(std::to_string(options.max_steps)), std::string::npos);
  EXPECT_NE(status.message().find(std::to_string(kMaxInferenceSteps)), std::string::npos);
  options.max_steps = static_cast<int>(kMaxInferenceSteps);  // the bound itself is served
  EXPECT_TRUE(validate_server_options(options).ok());
}

TEST(LimitFlagsTest, ResolveNarrowsTheModelsBoundsAndRefusesWideningThem) {
  PipelineInfo model;
  model.model_name = "tiny";
  model.max_sequence_length = 512;
  LimitFlags flags;
  flags.max_sequence_length = 64;
  absl::StatusOr<Limits> limits = resolve_limits(flags, model);
  ASSERT_TRUE(limits.ok()) << limits.status();
  EXPECT_EQ(limits->max_sequence_length, 64);
  flags.max_sequence_length = 1024;
  limits = resolve_limits(flags, model);
  ASSERT_FALSE(limits.ok());
  EXPECT_NE(limits.status().message().find("--max-sequence-length: 1024 exceeds"),
            std::string::npos)
      << limits.status();
  EXPECT_NE(limits.status().message().find("512"), std::string::npos);
}

}  // namespace
}  // namespace flux2::server
