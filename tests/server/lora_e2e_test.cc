// LoRA adapters end to end on the real flux2_server (tiny klein checkpoint, CPU) with --lora-dir
// holding copies of tests/data/tiny-klein/loras: lora_cases.json pipeline case 0 over gRPC and
// HTTP and case 1 (editing) over the HTTP edits form match diffusers' images
// (lora_pipeline.safetensors), a request without adapters is unchanged, concurrent requests with
// different adapters, refusals, the budget beside pinned adapters, ListLoras, GET /v1/loras,
// --lora-preload, the load log line and the metrics. Run: ctest --test-dir build -R LoraE2E
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/server/test_support.h"

namespace flux2::server::testing {
namespace {

namespace v1 = flux2::v1;
namespace fs = std::filesystem;
using nlohmann::json;

const std::string kData = FLUX2_TEST_DATA_DIR;
const char* const kPrompt = "a red fox in the snow, in the adapter's style";  // lora_cases case 0

// Fails unless `png` is the golden case0.image_u8 (expect_golden_png).
void expect_golden(const std::string& png) {
  expect_golden_png(png, kData + "/tiny-klein/lora_pipeline.safetensors", "case0.image_u8", 64, 64);
}

class LoraE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("flux2_lora_e2e_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "styles");
    const std::string loras = kData + "/tiny-klein/loras/";
    fs::copy_file(loras + "style_diffusers.safetensors", dir_ / "style.safetensors");
    fs::copy_file(loras + "bfl_aitoolkit.safetensors", dir_ / "bfl.safetensors");
    fs::copy_file(loras + "kohya.safetensors", dir_ / "styles/kohya.safetensors");
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }
  void start(std::vector<std::string> args = {}) {
    args.insert(args.end(), {"--max-sequence-length", "64", "--warmup-steps", "0"});
    server_ = ServerProcess::start(FLUX2_SERVER_BINARY, args, log_path());
    ASSERT_NE(server_, nullptr);
    channel_ = local_channel(server_->grpc_port());
    stub_ = v1::ImageGeneration::NewStub(channel_);
    ASSERT_TRUE(wait_for_health(channel_, "readiness", "SERVING"));
  }
  void start_with_loras(std::vector<std::string> args = {}) {
    args.insert(args.end(), {"--lora-dir", dir_.string()});
    start(args);
  }
  grpc::Status generate(const v1::GenerateImageRequest& request, v1::GenerateImageResponse* out) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kTestWaitLimit);
    return stub_->GenerateImage(&context, request, out);
  }
  static v1::GenerateImageRequest case0(std::vector<std::pair<std::string, double>> loras) {
    v1::GenerateImageRequest request;
    request.set_prompt(kPrompt);
    request.set_width(64);
    request.set_height(64);
    request.set_num_inference_steps(4);
    request.set_seed(600);
    request.set_guidance_scale(4.0);
    for (const auto& [name, scale] : loras) {
      v1::LoraAdapter* lora = request.add_loras();
      lora->set_name(name);
      lora->set_scale(scale);
    }
    return request;
  }
  std::pair<int, json> post(const json& body) {
    httplib::Client client("127.0.0.1", server_->http_port());
    client.set_read_timeout(120);
    httplib::Result r = client.Post("/v1/images/generations", body.dump(), "application/json");
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  std::string metrics() { return http_get(server_->metrics_port(), "/metrics"); }
  // The server's log (stderr), kept beside the adapters.
  std::string log_path() const { return (dir_ / "server.log").string(); }
  std::string log() const {
    std::ifstream in(log_path());
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  fs::path dir_;
  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ImageGeneration::Stub> stub_;
};

TEST_F(LoraE2E, Case0MatchesDiffusersOverGrpcAndHttp) {
  start_with_loras();
  v1::GenerateImageResponse response;
  const grpc::Status status = generate(case0({{"style", 0.8}, {"bfl", -0.5}}), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.images_size(), 1);
  expect_golden(response.images(0).data());
  ASSERT_EQ(response.loras_size(), 2);
  EXPECT_EQ(response.loras(0).name(), "style");
  EXPECT_EQ(response.loras(0).scale(), 0.8);
  EXPECT_EQ(response.loras(0).format(), "diffusers");
  EXPECT_EQ(response.loras(0).rank(), 8);  // 38 modules at rank 4, one at 8
  EXPECT_EQ(response.loras(0).sha256_prefix().size(), 12u);
  EXPECT_EQ(response.loras(1).name(), "bfl");
  EXPECT_EQ(response.loras(1).format(), "bfl");

  const json body = {
      {"prompt", kPrompt},
      {"size", "64x64"},
      {"num_inference_steps", 4},
      {"seed", 600},
      {"guidance_scale", 4.0},
      {"loras", {{{"name", "style"}, {"scale", 0.8}}, {{"path", "bfl"}, {"scale", -0.5}}}}};
  const auto [code, reply] = post(body);
  ASSERT_EQ(code, 200) << reply.dump();
  std::string png;
  ASSERT_TRUE(absl::Base64Unescape(reply["data"][0]["b64_json"].get<std::string>(), &png));
  EXPECT_EQ(png, response.images(0).data());  // the same bytes through either front end
  ASSERT_EQ(reply["loras"].size(), 2u);
  EXPECT_EQ(reply["loras"][1]["name"], "bfl");
  EXPECT_EQ(reply["loras"][1]["sha256_prefix"], response.loras(1).sha256_prefix());

  const std::string text = metrics();
  EXPECT_EQ(metric_value(text, "flux2_lora_requests_total", {{"adapters", "2"}}), 2.0);
  EXPECT_EQ(
      metric_value(text, "flux2_lora_cache_requests_total", {{"tier", "host"}, {"result", "miss"}}),
      2.0);
  EXPECT_EQ(
      metric_value(text, "flux2_lora_cache_requests_total", {{"tier", "host"}, {"result", "hit"}}),
      2.0);
  EXPECT_GE(
      metric_value(text, "flux2_lora_cache_requests_total", {{"tier", "device"}, {"result", "hit"}})
          .value_or(0),
      2.0);
}

// lora_cases.json pipeline case 1 (editing: one reference, the kohya adapter) through the HTTP
// edits form, whose `loras` field holds JSON text: diffusers' image.
TEST_F(LoraE2E, EditCaseMatchesDiffusersOverTheHttpEditsForm) {
  start_with_loras();
  std::ifstream in(kData + "/tiny-klein/references/ref0_64x64.png", std::ios::binary);
  const std::string reference(std::istreambuf_iterator<char>(in), {});
  ASSERT_FALSE(reference.empty());
  httplib::Client client("127.0.0.1", server_->http_port());
  client.set_read_timeout(120);
  const httplib::MultipartFormDataItems items = {
      {"prompt", "make the fox blue", "", ""},
      {"image", reference, "ref0_64x64.png", "image/png"},
      {"num_inference_steps", "3", "", ""},
      {"seed", "601", "", ""},
      {"guidance_scale", "4.0", "", ""},
      {"loras", R"([{"name": "styles/kohya", "scale": 1.0}])", "", ""}};
  httplib::Result r = client.Post("/v1/images/edits", items);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json reply = json::parse(r->body, nullptr, false);
  std::string png;
  ASSERT_TRUE(absl::Base64Unescape(reply["data"][0]["b64_json"].get<std::string>(), &png));
  expect_golden_png(png, kData + "/tiny-klein/lora_pipeline.safetensors", "case1.image_u8", 64, 64);
  ASSERT_EQ(reply["loras"].size(), 1u);
  EXPECT_EQ(reply["loras"][0]["name"], "styles/kohya");
  EXPECT_EQ(reply["loras"][0]["format"], "kohya");
}

TEST_F(LoraE2E, ARequestWithoutAdaptersIsUnchangedAndConcurrentAdaptersDoNotMix) {
  v1::GenerateImageResponse plain_before;
  start();  // no --lora-dir
  ASSERT_TRUE(generate(case0({}), &plain_before).ok());
  v1::GenerateImageResponse refused;
  const grpc::Status off = generate(case0({{"style", 1.0}}), &refused);
  EXPECT_EQ(off.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(off.error_message(), "loras: this server has no --lora-dir");
  server_.reset();

  start_with_loras();
  v1::GenerateImageResponse plain, style_alone, kohya_alone;
  ASSERT_TRUE(generate(case0({}), &plain).ok());
  EXPECT_EQ(plain.images(0).data(), plain_before.images(0).data());
  EXPECT_EQ(plain.loras_size(), 0);
  ASSERT_TRUE(generate(case0({{"style", 1.0}}), &style_alone).ok());
  ASSERT_TRUE(generate(case0({{"styles/kohya", 1.0}}), &kohya_alone).ok());
  EXPECT_NE(style_alone.images(0).data(), plain.images(0).data());
  EXPECT_NE(style_alone.images(0).data(), kohya_alone.images(0).data());
  auto run = [this](const char* name) {
    v1::GenerateImageResponse response;
    EXPECT_TRUE(generate(case0({{name, 1.0}}), &response).ok());
    return response.images_size() > 0 ? response.images(0).data() : std::string();
  };
  auto a = std::async(std::launch::async, run, "style");
  auto b = std::async(std::launch::async, run, "styles/kohya");
  EXPECT_EQ(a.get(), style_alone.images(0).data());
  EXPECT_EQ(b.get(), kohya_alone.images(0).data());
}

TEST_F(LoraE2E, RefusalsNameTheAdapterOverGrpcAndHttp) {
  std::ofstream(dir_ / "junk.safetensors") << "not safetensors";
  start_with_loras({"--max-lora-rank", "6"});
  v1::GenerateImageResponse response;
  grpc::Status status = generate(case0({{"foo", 1.0}}), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "loras[0].name: no adapter 'foo' under --lora-dir");
  EXPECT_EQ(bad_request_fields(status).at(0), "loras[0].name");
  // kohya's rank 6 fits; bfl has rank 8.
  status = generate(case0({{"styles/kohya", 1.0}, {"bfl", 1.0}}), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("loras[1]: bfl: rank 8 at "), std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find("exceeds --max-lora-rank 6"), std::string::npos);
  status = generate(case0({{"junk", 1.0}}), &response);
  EXPECT_NE(status.error_message().find("loras[0]: junk: not a safetensors file"),
            std::string::npos)
      << status.error_message();
  status = generate(case0({{"style", 1.0}, {"style", 2.0}}), &response);
  EXPECT_EQ(status.error_message(), "loras[1].name: 'style' repeated");

  auto [code, error] = post({{"prompt", "x"}, {"loras", {{{"url", "https://x/y.safetensors"}}}}});
  EXPECT_EQ(code, 400);
  EXPECT_EQ(error["error"]["param"], "loras[0].url") << error.dump();
  std::tie(code, error) =
      post({{"prompt", "x"}, {"size", "64x64"}, {"loras", {{{"name", "../x"}}}}});
  EXPECT_EQ(code, 400);
  EXPECT_EQ(error["error"]["param"], "loras[0].name") << error.dump();
  std::tie(code, error) =
      post({{"prompt", "x"}, {"size", "64x64"}, {"loras", {{{"name", "nope"}}}}});
  EXPECT_EQ(code, 400);
  EXPECT_EQ(error["error"]["message"], "loras[0].name: no adapter 'nope' under --lora-dir");
  const std::string text = metrics();
  EXPECT_GE(
      metric_value(text, "flux2_lora_load_failures_total", {{"reason", "not_found"}}).value_or(0),
      2.0);
  EXPECT_EQ(metric_value(text, "flux2_lora_load_failures_total", {{"reason", "rank"}}), 1.0);
  EXPECT_EQ(metric_value(text, "flux2_lora_load_failures_total", {{"reason", "format"}}), 1.0);
}

TEST_F(LoraE2E, ListsAdaptersAndPreloadsThem) {
  start_with_loras({"--lora-preload", "styles/kohya"});
  grpc::ClientContext info_context;
  v1::GetModelInfoResponse info;
  ASSERT_TRUE(stub_->GetModelInfo(&info_context, {}, &info).ok());
  EXPECT_EQ(info.limits().max_loras_per_request(), 4);
  EXPECT_EQ(info.limits().max_lora_rank(), 256);
  EXPECT_EQ(info.limits().max_lora_scale(), 8.0);
  EXPECT_EQ(info.lora_options().at("lora-dir"), dir_.string());
  EXPECT_EQ(info.lora_options().at("lora-preload"), "styles/kohya");
  grpc::ClientContext context;
  v1::ListLorasResponse listing;
  ASSERT_TRUE(stub_->ListLoras(&context, {}, &listing).ok());
  ASSERT_EQ(listing.loras_size(), 3);
  EXPECT_EQ(listing.loras(0).name(), "bfl");
  EXPECT_FALSE(listing.loras(0).loaded());
  EXPECT_EQ(listing.loras(2).name(), "styles/kohya");
  EXPECT_TRUE(listing.loras(2).loaded());
  EXPECT_TRUE(listing.loras(2).resident());
  EXPECT_TRUE(listing.loras(2).pinned());
  EXPECT_EQ(listing.loras(2).format(), "kohya");
  const json loras = json::parse(http_get(server_->http_port(), "/v1/loras"), nullptr, false);
  ASSERT_TRUE(loras.is_object());
  ASSERT_EQ(loras["data"].size(), 3u);
  EXPECT_EQ(loras["data"][2]["pinned"], true);
  // One log line per adapter loaded: name, hash prefix, layout, ranks, modules, bytes, seconds.
  const std::string text = log();
  const size_t line = text.find("loaded LoRA adapter styles/kohya: sha256 ");
  ASSERT_NE(line, std::string::npos) << text;
  const std::string loaded = text.substr(line, text.find('\n', line) - line);
  for (const std::string& part :
       {absl::StrCat("sha256 ", listing.loras(2).sha256_prefix(), ", layout kohya, max rank ",
                     listing.loras(2).rank()),
        absl::StrCat(listing.loras(2).modules(), " modules, ", listing.loras(2).bytes(),
                     " bytes in ")}) {
    EXPECT_NE(loaded.find(part), std::string::npos) << part << " in: " << loaded;
  }
}

// The device tier's bytes now (flux2_lora_cache_bytes{tier="device"}).
double device_cache_bytes(const std::string& metrics_text) {
  return metric_value(metrics_text, "flux2_lora_cache_bytes", {{"tier", "device"}}).value_or(-1);
}

// Pinned adapters never leave the device cache: a request whose adapters fit --lora-cache-bytes
// alone but not beside them is refused in the handler (RESOURCE_EXHAUSTED, lora_cache), before it
// queues; it never reaches the engine (no engine fault). The pinned adapter itself still serves.
TEST_F(LoraE2E, ARequestThatDoesNotFitBesideThePinnedAdaptersIsRefusedBeforeQueueing) {
  // The adapters' device bytes, measured on a server with room for both.
  start_with_loras({"--lora-preload", "styles/kohya"});
  const double pinned = device_cache_bytes(metrics());
  v1::GenerateImageResponse response;
  ASSERT_TRUE(generate(case0({{"style", 1.0}}), &response).ok());
  const double style = device_cache_bytes(metrics()) - pinned;
  ASSERT_GT(pinned, 0);
  ASSERT_GT(style, 0);
  server_.reset();

  const int64_t capacity = static_cast<int64_t>(pinned + style) - 1;  // each alone fits
  start_with_loras(
      {"--lora-preload", "styles/kohya", "--lora-cache-bytes", std::to_string(capacity)});
  grpc::Status status = generate(case0({{"style", 1.0}}), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(
      status.error_message(),
      absl::StrCat("loras: ", static_cast<int64_t>(style),
                   " bytes of adapters do not fit --lora-cache-bytes ", capacity, " beside the ",
                   static_cast<int64_t>(pinned), " bytes of --lora-preload's adapters"));
  EXPECT_TRUE(generate(case0({{"styles/kohya", 1.0}}), &response).ok());
  const std::string text = metrics();
  EXPECT_EQ(metric_value(text, "flux2_resource_exhausted_total", {{"reason", "lora_cache"}}), 1.0);
  for (const char* kind : {"device_memory", "device_error", "stall"}) {
    EXPECT_EQ(metric_value(text, "flux2_engine_faults_total", {{"kind", kind}}), 0.0) << kind;
  }
}

// Both tiers evict the least recently used adapter when the next one does not fit, and
// /metrics says so: evictions, misses, bytes and capacity per tier.
TEST_F(LoraE2E, EachTierEvictsTheLeastRecentlyUsedAndReportsIt) {
  // Each adapter's bytes in each tier, measured on a server with room for both.
  start_with_loras();
  v1::GenerateImageResponse response;
  auto tier_bytes = [&](const char* tier) {
    return metric_value(metrics(), "flux2_lora_cache_bytes", {{"tier", tier}}).value_or(-1);
  };
  ASSERT_TRUE(generate(case0({{"style", 1.0}}), &response).ok());
  const double style_host = tier_bytes("host"), style_device = tier_bytes("device");
  ASSERT_TRUE(generate(case0({{"bfl", 1.0}}), &response).ok());
  const double bfl_host = tier_bytes("host") - style_host;
  const double bfl_device = tier_bytes("device") - style_device;
  ASSERT_GT(std::min({style_host, style_device, bfl_host, bfl_device}), 0);
  server_.reset();

  // Room for one adapter in each tier: style, bfl, style evicts twice in each.
  const auto host = static_cast<int64_t>(std::max(style_host, bfl_host));
  const auto device = static_cast<int64_t>(std::max(style_device, bfl_device));
  start_with_loras({"--lora-host-cache-bytes", std::to_string(host), "--lora-cache-bytes",
                    std::to_string(device)});
  for (const char* name : {"style", "bfl", "style"}) {
    ASSERT_TRUE(generate(case0({{name, 1.0}}), &response).ok()) << name;
  }
  const std::string text = metrics();
  for (const char* tier : {"host", "device"}) {
    SCOPED_TRACE(tier);
    EXPECT_EQ(metric_value(text, "flux2_lora_cache_evictions_total", {{"tier", tier}}), 2.0);
    EXPECT_EQ(
        metric_value(text, "flux2_lora_cache_requests_total", {{"tier", tier}, {"result", "miss"}}),
        3.0);
    EXPECT_EQ(metric_value(text, "flux2_lora_cache_bytes", {{"tier", tier}}),
              std::string(tier) == "host" ? style_host : style_device);
    EXPECT_EQ(metric_value(text, "flux2_lora_cache_capacity_bytes", {{"tier", tier}}),
              static_cast<double>(std::string(tier) == "host" ? host : device));
  }
}

TEST_F(LoraE2E, APreloadThatFailsRefusesStartUpNamingTheAdapter) {
  std::vector<std::string> args = {"--lora-dir", dir_.string(),    "--lora-preload",
                                   "missing",    "--warmup-steps", "0"};
  server_ = ServerProcess::start(FLUX2_SERVER_BINARY, args, log_path());
  ASSERT_NE(server_, nullptr);  // the ports are bound before the model loads
  EXPECT_EQ(server_->wait_exit(std::chrono::seconds(120)), 1);
  EXPECT_NE(log().find("--lora-preload: missing: "), std::string::npos) << log();
}

}  // namespace
}  // namespace flux2::server::testing
