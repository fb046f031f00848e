// The OpenAI-compatible HTTP API (server/http/http_api.h) in process: the whole Server with the
// fake engine whose steps the test gates, called over HTTP with cpp-httplib's client. Generation
// with n=2 (the fake engine's exact pixels and seeds), editing with two files (multipart) and a bad
// one refused as `image[1]`, OpenAI-shaped errors with `param`, 401 without the token, 429 +
// Retry-After when the queue is full, 504 past X-Request-Timeout, 413 past --max-request-bytes,
// server-sent events (one per step, then the image), a client hang-up cancelling its request (and
// the worker moving on), health/ready/models/openapi.json, and every outcome counted as the client
// saw it; and a stop right after the start returns.
// Run: build/bin/server_unit_tests --gtest_filter='HttpApiTest*'
#include "server/http/http_api.h"

#include <httplib.h>
#include <netinet/in.h>
#include <stb_image.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <future>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/app/server.h"
#include "tests/server/fake_engine.h"
#include "tests/server/server_fixture.h"
#include "tests/server/test_support.h"

namespace flux2::server {
namespace {

using nlohmann::json;
using testing::fake_pixel;
using testing::FakeEngineControl;
using testing::metric_value;

constexpr char kSmallBody[] =
    R"({"prompt": "a red fox", "size": "64x48", "num_inference_steps": 2, "seed": 5})";

class HttpApiTest : public testing::FakeServerTest {
 protected:
  // The server, ready on HTTP (the fixture's start() waits on gRPC health instead).
  void start_http() {
    start_server();
    if (!server_) return;
    ASSERT_GT(server_->http_port(), 0);
    for (int i = 0; i < 1200 && get("/ready").status != 200; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_EQ(get("/ready").status, 200);
  }

  httplib::Client client() {
    httplib::Client c("127.0.0.1", server_->http_port());
    c.set_read_timeout(120);
    return c;
  }

  struct Reply {
    int status = 0;
    std::string body;
    httplib::Headers headers;
    json json_body() const { return json::parse(body, nullptr, false); }
  };

  Reply get(const std::string& path, const httplib::Headers& headers = {}) {
    httplib::Client c = client();
    httplib::Result r = c.Get(path, headers);
    if (!r) return {};
    return {r->status, r->body, r->headers};
  }

  Reply post_json(const std::string& body, const httplib::Headers& headers = {},
                  const std::string& path = "/v1/images/generations") {
    httplib::Client c = client();
    httplib::Result r = c.Post(path, headers, body, "application/json");
    if (!r) return {};
    return {r->status, r->body, r->headers};
  }

  // Starts a POST on its own thread (for requests the gate holds).
  std::future<Reply> post_async(const std::string& body, const httplib::Headers& headers = {}) {
    return std::async(std::launch::async,
                      [this, body, headers] { return post_json(body, headers); });
  }

  double requests(const std::string& method, const std::string& code) {
    return metric_value(server_->metrics().render(), "flux2_requests_total",
                        {{"method", method}, {"code", code}})
        .value_or(0.0);
  }
};

// Checks one returned image against the fake engine's pixels for `seed`.
void expect_fake_png(const json& image, uint64_t seed, int width, int height) {
  std::string png;
  ASSERT_TRUE(absl::Base64Unescape(image["b64_json"].get<std::string>(), &png));
  int w = 0, h = 0, channels = 0;
  stbi_uc* pixels = stbi_load_from_memory(reinterpret_cast<const stbi_uc*>(png.data()),
                                          static_cast<int>(png.size()), &w, &h, &channels, 3);
  ASSERT_NE(pixels, nullptr);
  EXPECT_EQ(w, width);
  EXPECT_EQ(h, height);
  int wrong = 0;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) wrong += pixels[(y * w + x) * 3 + c] != fake_pixel(seed, x, y, c);
  stbi_image_free(pixels);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(image["seed"], seed);
  EXPECT_EQ(image["size"], absl::StrCat(width, "x", height));
}

TEST_F(HttpApiTest, GeneratesTwoImagesWithConsecutiveSeeds) {
  start_http();
  const Reply reply = post_json(
      R"({"prompt": "a red fox", "n": 2, "size": "64x48", "num_inference_steps": 2,
          "seed": 40, "model": "fake-klein"})",
      {{"X-Request-Id", "req-7"}});
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json body = reply.json_body();
  ASSERT_EQ(body["data"].size(), 2u) << reply.body;
  expect_fake_png(body["data"][0], 40, 64, 48);
  expect_fake_png(body["data"][1], 41, 64, 48);
  EXPECT_EQ(body["seed"], 40);
  EXPECT_EQ(body["request_id"], "req-7");
  EXPECT_EQ(body["output_format"], "png");
  EXPECT_EQ(body["timings"]["step_seconds"].size(), 4u);  // 2 steps x 2 images
  EXPECT_GT(body["created"].get<int64_t>(), 1700000000);
  EXPECT_EQ(requests("images.generations", "OK"), 1.0);
}

TEST_F(HttpApiTest, JpegAndWebpOutput) {
  start_http();
  for (const char* format : {"jpeg", "webp"}) {
    const Reply reply = post_json(absl::StrCat(
        R"({"prompt": "a fox", "size": "64x48", "num_inference_steps": 1, "output_format": ")",
        format, R"(", "output_compression": 90})"));
    ASSERT_EQ(reply.status, 200) << reply.body;
    const json image = reply.json_body()["data"][0];
    EXPECT_EQ(image["mime_type"], absl::StrCat("image/", format));
    std::string bytes;
    ASSERT_TRUE(absl::Base64Unescape(image["b64_json"].get<std::string>(), &bytes));
    if (std::string(format) == "jpeg") {
      EXPECT_EQ(bytes.substr(0, 2), "\xff\xd8");
    } else {
      EXPECT_EQ(bytes.substr(8, 4), "WEBP");
    }
  }
  const Reply png_quality =
      post_json(R"({"prompt": "a fox", "size": "64x48", "output_compression": 90})");
  EXPECT_EQ(png_quality.status, 400);
  EXPECT_EQ(png_quality.json_body()["error"]["param"], "output_compression");
}

TEST_F(HttpApiTest, BadRequestsGetOpenAiErrorsNamingTheParam) {
  start_http();
  struct Case {
    std::string body;
    int status;
    std::string param;
  };
  const std::vector<Case> cases = {
      {R"({"prompt": "x", "size": "100x100"})", 400, "size"},  // not a multiple of 16
      {R"({"prompt": "x", "size": "big"})", 400, "size"},
      {R"({"prompt": "x", "size": "4096x4096"})", 400, "size"},  // over the pixel budget
      {R"({"prompt": "x", "n": 9})", 400, "n"},
      {R"({"prompt": ""})", 400, "prompt"},
      {R"({"prompt": "x", "response_format": "url"})", 400, "response_format"},
      {R"({"prompt": "x", "model": "dall-e-3"})", 404, "model"},
      {"not json", 400, "body"},
  };
  for (const Case& c : cases) {
    const Reply reply = post_json(c.body);
    EXPECT_EQ(reply.status, c.status) << c.body << " -> " << reply.body;
    const json error = reply.json_body()["error"];
    EXPECT_EQ(error["param"], c.param) << reply.body;
    EXPECT_FALSE(error["message"].get<std::string>().empty());
    EXPECT_TRUE(error["type"].is_string());
    EXPECT_TRUE(error["code"].is_string());
  }
  EXPECT_EQ(requests("images.generations", "INVALID_ARGUMENT"), 7.0);
  EXPECT_EQ(requests("images.generations", "NOT_FOUND"), 1.0);
  const Reply no_route = get("/v1/nothing");
  EXPECT_EQ(no_route.status, 404);
  EXPECT_EQ(no_route.json_body()["error"]["code"], "not_found");
}

TEST_F(HttpApiTest, EditsTakeTwoFilesAndNameABadOne) {
  start_http();
  const std::string a = testing::gradient_png(96, 64), b = testing::gradient_jpeg(64, 64);
  httplib::Client c = client();
  httplib::MultipartFormDataItems items = {
      {"prompt", "put the cat of image 1 on the sofa of image 2", "", ""},
      {"image[]", a, "a.png", "image/png"},
      {"image[]", b, "b.jpg", "image/jpeg"},
      {"n", "1", "", ""},
      {"num_inference_steps", "1", "", ""},
      {"seed", "9", "", ""}};
  httplib::Result r = c.Post("/v1/images/edits", items);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json body = json::parse(r->body);
  // No size: the first reference's (96 x 64, already multiples of 16).
  expect_fake_png(body["data"][0], 9, 96, 64);
  ASSERT_FALSE(control_->references().empty());
  EXPECT_EQ(control_->references().back().size(), 2u);

  items[2] = {"image[]", "not an image", "b.png", "image/png"};
  httplib::Result bad = c.Post("/v1/images/edits", items);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "image[1]") << bad->body;
  httplib::Result json_body = c.Post("/v1/images/edits", "{}", "application/json");
  ASSERT_TRUE(json_body);
  EXPECT_EQ(json_body->status, 400);
  EXPECT_EQ(requests("images.edits", "OK"), 1.0);
  EXPECT_EQ(requests("images.edits", "INVALID_ARGUMENT"), 2.0);
}

TEST_F(HttpApiTest, FullQueueIs429WithRetryAfter) {
  options_.queue_depth = 1;
  start_http();
  control_->close_gate();
  const int before = control_->steps_started();
  std::future<Reply> running = post_async(kSmallBody);
  ASSERT_TRUE(control_->wait_steps_started(before + 0));
  control_->allow_steps(1);
  ASSERT_TRUE(control_->wait_steps_started(before + 1));  // the worker holds it
  std::future<Reply> queued = post_async(kSmallBody);
  ASSERT_TRUE(testing::wait_for_metric(server_->metrics_port(), "flux2_queue_depth", {}, 1.0));
  const Reply refused = post_json(kSmallBody);
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_EQ(refused.json_body()["error"]["type"], "rate_limit_error");
  auto retry_after = refused.headers.find("Retry-After");
  ASSERT_NE(retry_after, refused.headers.end());
  EXPECT_EQ(retry_after->second, "1");
  EXPECT_EQ(requests("images.generations", "RESOURCE_EXHAUSTED"), 1.0);
  EXPECT_EQ(metric_value(server_->metrics().render(), "flux2_resource_exhausted_total",
                         {{"reason", "queue_full"}}),
            1.0);
  control_->open_gate();
  EXPECT_EQ(running.get().status, 200);
  EXPECT_EQ(queued.get().status, 200);
}

TEST_F(HttpApiTest, DeadlineHeaderGives504) {
  options_.test_step_delay_s = 0.05;  // 50 steps take 2.5 s; the deadline passes within the 5th
  start_http();
  const Reply late =
      post_json(R"({"prompt": "a red fox", "size": "64x48", "num_inference_steps": 50, "seed": 5})",
                {{"X-Request-Timeout", "0.2"}});
  EXPECT_EQ(late.status, 504) << late.body;
  EXPECT_EQ(late.json_body()["error"]["code"], "deadline_exceeded");
  EXPECT_EQ(requests("images.generations", "DEADLINE_EXCEEDED"), 1.0);
  const Reply bad = post_json(kSmallBody, {{"X-Request-Timeout", "soon"}});
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.json_body()["error"]["param"], "X-Request-Timeout");
}

TEST_F(HttpApiTest, BodyOverTheLimitIs413) {
  options_.max_reference_images = 0;  // lets --max-request-bytes go to its floor
  options_.max_request_bytes = 4 << 20;
  start_http();
  const std::string big = absl::StrCat(R"({"prompt": ")", std::string(5 << 20, 'a'), R"("})");
  const Reply reply = post_json(big);
  EXPECT_EQ(reply.status, 413);
  EXPECT_EQ(reply.json_body()["error"]["code"], "resource_exhausted") << reply.body;
  EXPECT_EQ(metric_value(server_->metrics().render(), "flux2_resource_exhausted_total",
                         {{"reason", "request_too_large"}}),
            1.0);
  EXPECT_EQ(requests("images.generations", "RESOURCE_EXHAUSTED"), 1.0);
}

TEST_F(HttpApiTest, StreamSendsOneEventPerStepThenTheImage) {
  start_http();
  httplib::Client c = client();
  std::string events;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/images/generations";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = R"({"prompt": "a fox", "size": "64x48", "num_inference_steps": 3, "seed": 3,
                 "stream": true})";
  req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    events.append(data, size);
    return true;
  };
  httplib::Result r = c.send(req);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  std::vector<json> data;
  std::vector<std::string> names;
  size_t at = 0;
  while ((at = events.find("event: ", at)) != std::string::npos) {
    const size_t line_end = events.find('\n', at);
    names.push_back(events.substr(at + 7, line_end - at - 7));
    const size_t data_start = events.find("data: ", line_end) + 6;
    const size_t data_end = events.find("\n\n", data_start);
    data.push_back(json::parse(events.substr(data_start, data_end - data_start)));
    at = data_end;
  }
  ASSERT_EQ(names.size(), 4u) << events;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(names[i], "image_generation.progress");
    EXPECT_EQ(data[i]["step_index"], i);
    EXPECT_EQ(data[i]["step_count"], 3);
  }
  EXPECT_EQ(names[3], "image_generation.completed");
  expect_fake_png(data[3], 3, 64, 48);
  EXPECT_EQ(requests("images.generations", "OK"), 1.0);
}

// Sends `body` to /v1/images/generations on a raw socket and returns the socket (open).
int send_raw_request(int port, const std::string& body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) return -1;
  const std::string request = absl::StrCat(
      "POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: "
      "application/json\r\nContent-Length: ",
      body.size(), "\r\n\r\n", body);
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) return -1;
  return fd;
}

TEST_F(HttpApiTest, HangUpCancelsTheRequestAndFreesTheWorker) {
  start_http();
  control_->close_gate();
  const int before = control_->steps_started();
  for (bool stream : {false, true}) {
    const int fd = send_raw_request(
        server_->http_port(),
        absl::StrCat(R"({"prompt": "a fox", "size": "64x48", "num_inference_steps": 50,
                         "stream": )",
                     stream ? "true" : "false", "}"));
    ASSERT_GE(fd, 0);
    const int started = control_->steps_started();
    control_->allow_steps(1);
    ASSERT_TRUE(control_->wait_steps_started(started + 1));  // it runs
    close(fd);
    // One step at a time until the request is counted cancelled: the handler notices the hang-up
    // within its 20 ms poll and the job stops at its next step boundary, far before 50 steps.
    const double cancelled = stream ? 2.0 : 1.0;
    int steps = 0;
    while (requests("images.generations", "CANCELLED") < cancelled && steps < 48) {
      control_->allow_steps(1);
      ++steps;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(requests("images.generations", "CANCELLED"), cancelled);
    EXPECT_LE(steps, 3) << (stream ? "stream" : "unary");
  }
  control_->open_gate();
  const Reply next = post_json(kSmallBody);
  EXPECT_EQ(next.status, 200);
  EXPECT_LT(control_->steps_started() - before, 2 * 50);
}

TEST_F(HttpApiTest, TokenGuardsV1ButNotHealth) {
  const std::string path = ::testing::TempDir() + "/flux2_http_token";
  std::ofstream(path) << "s3cret\n";
  options_.auth_token_file = path;
  options_.allow_insecure_token = true;  // plaintext loopback
  start_http();
  EXPECT_EQ(get("/health").status, 200);
  const Reply none = post_json(kSmallBody);
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(none.json_body()["error"]["type"], "authentication_error");
  EXPECT_EQ(post_json(kSmallBody, {{"Authorization", "Bearer guess"}}).status, 401);
  EXPECT_EQ(post_json(kSmallBody, {{"Authorization", "Bearer s3cret"}}).status, 200);
  EXPECT_EQ(get("/v1/models").status, 401);
  const Reply models = get("/v1/models", {{"Authorization", "Bearer s3cret"}});
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.json_body()["data"][0]["object"], "model");
  EXPECT_EQ(requests("images.generations", "UNAUTHENTICATED"), 2.0);
}

TEST_F(HttpApiTest, HealthReadyModelsAndOpenApi) {
  control_->hold_load();
  absl::StatusOr<std::unique_ptr<Server>> server =
      Server::Create(options_, testing::fake_engine_factory(control_));
  ASSERT_TRUE(server.ok());
  server_ = std::move(*server);
  ASSERT_TRUE(server_->Start().ok());
  EXPECT_EQ(get("/health").status, 200);
  const Reply loading = get("/ready");
  EXPECT_EQ(loading.status, 503);
  EXPECT_NE(loading.headers.find("Retry-After"), loading.headers.end());
  EXPECT_EQ(post_json(kSmallBody).status, 503);
  control_->release_load();
  for (int i = 0; i < 1200 && get("/ready").status != 200; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(get("/ready").status, 200);
  const Reply models = get("/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.json_body()["object"], "list");
  const Reply openapi = get("/openapi.json");
  ASSERT_EQ(openapi.status, 200);
  const json doc = openapi.json_body();
  EXPECT_EQ(doc["openapi"], "3.0.3");
  for (const char* route : {"/v1/images/generations", "/v1/images/edits", "/v1/models", "/v1/loras",
                            "/health", "/ready", "/openapi.json"}) {
    EXPECT_TRUE(doc["paths"].contains(route)) << route;
  }
  // Draining: readiness goes, liveness stays until the process exits.
  ASSERT_TRUE(server_->GracefulStop(Clock::now() + std::chrono::seconds(30)).ok());
}

// cpp-httplib's stop() does nothing until its accept loop has begun. A server whose model fails
// at once stops right after it starts (flux2_server --backend cuda without a GPU hung so in CI):
// every stop, however soon after its start, returns.
TEST_F(HttpApiTest, StopRightAfterStartReturns) {
  options_.http_port = -1;  // the test's own HttpApi below, over the server as its host
  start_server();
  ASSERT_NE(server_, nullptr);
  std::promise<void> finished;
  std::future<void> done = finished.get_future();
  absl::Status started;
  std::thread cycles([this, &finished, &started] {
    for (int i = 0; i < 200 && started.ok(); ++i) {
      HttpApi api(server_->core(), "");
      HttpApiOptions options;
      options.host = "127.0.0.1";
      options.port = 0;
      started = api.start(options);
      api.stop(Clock::now());
    }
    finished.set_value();
  });
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    cycles.detach();  // stuck in stop(): fail rather than hang the binary
    FAIL() << "HttpApi::stop() right after start() did not return in 60 s";
  }
  cycles.join();
  EXPECT_TRUE(started.ok()) << started;
}

}  // namespace
}  // namespace flux2::server
