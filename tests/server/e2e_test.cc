// End-to-end tests of the real flux2_server binary on the embedded tiny FLUX.2-klein checkpoint
// (CPU): both RPCs with PNG/JPEG decoding (size, same bytes for the same seed, different for
// another), seed echo, timings, progress events and /metrics (prompt-cache hits included);
// table-driven invalid requests; overload; a 50 ms deadline; a real request's deadline overrun;
// cancellation; SIGTERM drain with exit code 0; probe mode; reflection; --gpus 3 and --gpus 4,6,9
// on CPU ranks (the collective time per step on /metrics by gpu label).
// Slow requests come from the TEST-ONLY flag --test-step-delay-ms. Assertions are orderings and
// counts, never absolute durations (the overrun bound is relative to stage times measured in the
// same test). Run: ctest --test-dir build -R server_e2e --output-on-failure
#include <signal.h>
#include <spawn.h>
#include <stb_image.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <thread>

#include "grpc/reflection/v1/reflection.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/server/test_support.h"

extern char** environ;

namespace flux2::server::testing {
namespace {

namespace v1 = flux2::v1;

const char* const kServerBinary = FLUX2_SERVER_BINARY;

struct Decoded {
  int width = 0, height = 0;
  bool ok = false;
};

Decoded decode(const std::string& bytes) {
  Decoded d;
  int channels = 0;
  stbi_uc* pixels =
      stbi_load_from_memory(reinterpret_cast<const stbi_uc*>(bytes.data()),
                            static_cast<int>(bytes.size()), &d.width, &d.height, &channels, 3);
  d.ok = pixels != nullptr;
  if (pixels) stbi_image_free(pixels);
  return d;
}

// The RGB values of an encoded image; empty when it does not decode.
std::vector<uint8_t> decode_rgb(const std::string& bytes) {
  int width = 0, height = 0, channels = 0;
  stbi_uc* pixels =
      stbi_load_from_memory(reinterpret_cast<const stbi_uc*>(bytes.data()),
                            static_cast<int>(bytes.size()), &width, &height, &channels, 3);
  if (pixels == nullptr) return {};
  std::vector<uint8_t> rgb(pixels, pixels + static_cast<size_t>(width) * height * 3);
  stbi_image_free(pixels);
  return rgb;
}

// Runs a command to completion; returns its exit code (128 + signal when killed).
int run_command(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class E2E : public ::testing::Test {
 protected:
  void start(std::vector<std::string> args = {}) {
    server_ = ServerProcess::start(kServerBinary, args);
    ASSERT_NE(server_, nullptr);
    channel_ = local_channel(server_->grpc_port());
    stub_ = v1::ImageGeneration::NewStub(channel_);
    ASSERT_TRUE(wait_for_health(channel_, "readiness", "SERVING"));
  }
  std::string metrics() { return http_get(server_->metrics_port(), "/metrics"); }
  std::optional<double> metric(const std::string& name,
                               const std::map<std::string, std::string>& labels = {}) {
    return metric_value(metrics(), name, labels);
  }
  bool wait_metric(const std::string& name, const std::map<std::string, std::string>& labels,
                   double value) {
    return wait_for_metric(server_->metrics_port(), name, labels, value);
  }
  grpc::Status generate(const v1::GenerateImageRequest& request,
                        v1::GenerateImageResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kTestWaitLimit);
    return stub_->GenerateImage(&context, request, response);
  }

  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ImageGeneration::Stub> stub_;
};

// Backend flags steer the backend and GetModelInfo reports them, with the fast-path switch; the
// defaults are reported too (nothing else, no environment variable, steers the backend). The
// model-loading flags (the streamed text encoder, the prompt cache) are reported as well.
TEST_F(E2E, GetModelInfoReportsTheBackendOptionsTheFlagsSet) {
  start({"--cpu-threads", "2", "--gemm-autotune", "on", "--fast-paths", "off",
         "--text-encoder-offload", "--prompt-cache-bytes", "0"});
  grpc::ClientContext context;
  v1::GetModelInfoResponse info;
  ASSERT_TRUE(stub_->GetModelInfo(&context, {}, &info).ok());
  EXPECT_FALSE(info.fast_paths_enabled());
  EXPECT_EQ(info.backend_options().at("cpu-threads"), "2");
  EXPECT_EQ(info.backend_options().at("gemm-autotune"), "on");
  EXPECT_EQ(info.backend_options().at("fp8-attention"), "on");
  EXPECT_EQ(info.backend_options().at("gpus"), "1");  // --gpus' default
  EXPECT_TRUE(info.text_encoder_streamed());
  EXPECT_GT(info.text_encoder_host_bytes(), 0);
  EXPECT_EQ(info.prompt_cache_bytes(), 0);
  EXPECT_EQ(info.transformer_file(), "");
  EXPECT_EQ(info.transformer_format(), "diffusers");  // the checkpoint's transformer/ folder
  EXPECT_GT(info.transformer_checkpoint_bytes(), 0);
  EXPECT_FALSE(info.guidance_embedded());  // klein
  v1::GenerateImageResponse response;
  EXPECT_TRUE(generate(small_request(7, 1), &response).ok());
  EXPECT_TRUE(generate(small_request(7, 1), &response).ok());
  // The cache is off: both requests encoded their prompt.
  EXPECT_EQ(metric("flux2_prompt_cache_requests_total", {{"result", "miss"}}), 2.0);
  EXPECT_EQ(metric("flux2_prompt_cache_requests_total", {{"result", "hit"}}), 0.0);
  EXPECT_EQ(metric("flux2_prompt_cache_capacity_bytes"), 0.0);
}

TEST_F(E2E, GeneratesImagesAndReportsThemInMetrics) {
  start();
  // GetModelInfo: the tiny distilled klein checkpoint on the CPU.
  {
    grpc::ClientContext context;
    v1::GetModelInfoResponse info;
    ASSERT_TRUE(stub_->GetModelInfo(&context, {}, &info).ok());
    EXPECT_EQ(info.variant(), "klein-distilled");
    EXPECT_EQ(info.backend(), "cpu");
    EXPECT_EQ(info.default_steps(), 4);
    EXPECT_FALSE(info.uses_cfg());
    EXPECT_EQ(info.limits().pixel_multiple(), 16);
    EXPECT_EQ(info.limits().max_pixels(), 4194304);
    EXPECT_EQ(info.limits().queue_depth(), 8);
    EXPECT_GT(info.weight_bytes(), 0);
    EXPECT_FALSE(info.guidance_embedded());
    EXPECT_FALSE(info.text_encoder_streamed());
    EXPECT_EQ(info.prompt_cache_bytes(), int64_t{256} << 20);  // --prompt-cache-bytes' default
  }
  const int steps = 3;
  // Unary, seed 42, 64 x 48 (not square, so width and height cannot be swapped unnoticed).
  v1::GenerateImageResponse first;
  ASSERT_TRUE(generate(small_request(42, steps), &first).ok());
  ASSERT_EQ(first.images_size(), 1);
  EXPECT_EQ(first.seed(), 42u);
  EXPECT_EQ(first.images(0).seed(), 42u);
  EXPECT_EQ(first.images(0).mime_type(), "image/png");
  const Decoded png = decode(first.images(0).data());
  ASSERT_TRUE(png.ok);
  EXPECT_EQ(png.width, 64);
  EXPECT_EQ(png.height, 48);
  EXPECT_EQ(first.images(0).width(), 64);
  EXPECT_EQ(first.images(0).height(), 48);
  const v1::Timings& t = first.timings();
  ASSERT_EQ(t.step_seconds_size(), steps);
  double step_sum = 0.0;
  for (double s : t.step_seconds()) {
    EXPECT_GT(s, 0.0);
    step_sum += s;
  }
  EXPECT_GE(t.denoise_seconds(), step_sum);  // denoise = set-up + every step
  EXPECT_GT(t.text_encode_seconds(), 0.0);
  EXPECT_GT(t.decode_seconds(), 0.0);
  EXPECT_GT(t.encode_seconds(), 0.0);
  EXPECT_GE(t.queue_seconds(), 0.0);
  EXPECT_GE(t.total_seconds(),
            t.queue_seconds() + t.text_encode_seconds() + t.denoise_seconds() + t.decode_seconds());

  // Same seed, same bytes; another seed, other bytes.
  v1::GenerateImageResponse same, other;
  ASSERT_TRUE(generate(small_request(42, steps), &same).ok());
  ASSERT_TRUE(generate(small_request(43, steps), &other).ok());
  EXPECT_EQ(same.images(0).data(), first.images(0).data());
  EXPECT_NE(other.images(0).data(), first.images(0).data());

  // The stream: one progress event per step, in order, then the result with the same image.
  StreamCall stream(stub_.get(), small_request(42, steps));
  ASSERT_TRUE(stream.finish().ok());
  EXPECT_EQ(stream.event_kinds(), "pppir");
  const std::vector<v1::Progress> progress = stream.progress();
  for (int i = 0; i < steps; ++i) {
    EXPECT_EQ(progress[i].step_index(), i);
    EXPECT_EQ(progress[i].step_count(), steps);
    EXPECT_GT(progress[i].step_seconds(), 0.0);
    if (i > 0) {
      EXPECT_GE(progress[i].elapsed_seconds(), progress[i - 1].elapsed_seconds());
    }
  }
  ASSERT_EQ(stream.images().size(), 1u);
  EXPECT_EQ(stream.images()[0].data(), first.images(0).data());
  EXPECT_TRUE(stream.result().images(0).data().empty());  // the bytes came in the image event

  // No seed: the server picks one, returns it, and that seed reproduces the image.
  v1::GenerateImageRequest unseeded = small_request(0, steps);
  unseeded.clear_seed();
  v1::GenerateImageResponse random, replay;
  ASSERT_TRUE(generate(unseeded, &random).ok());
  ASSERT_TRUE(generate(small_request(random.seed(), steps), &replay).ok());
  EXPECT_EQ(replay.images(0).data(), random.images(0).data());

  // Two images: seeds s and s + 1, the second equal to a separate generation with s + 1.
  v1::GenerateImageRequest pair = small_request(42, steps);
  pair.set_num_images(2);
  v1::GenerateImageResponse two;
  ASSERT_TRUE(generate(pair, &two).ok());
  ASSERT_EQ(two.images_size(), 2);
  EXPECT_EQ(two.images(0).data(), first.images(0).data());
  EXPECT_EQ(two.images(1).seed(), 43u);
  EXPECT_EQ(two.images(1).data(), other.images(0).data());

  // JPEG.
  v1::GenerateImageRequest jpeg = small_request(42, steps);
  jpeg.set_output_format(v1::OUTPUT_FORMAT_JPEG);
  v1::GenerateImageResponse jpeg_response;
  ASSERT_TRUE(generate(jpeg, &jpeg_response).ok());
  EXPECT_EQ(jpeg_response.images(0).mime_type(), "image/jpeg");
  const Decoded jpg = decode(jpeg_response.images(0).data());
  ASSERT_TRUE(jpg.ok);
  EXPECT_EQ(jpg.width, 64);
  EXPECT_EQ(jpg.height, 48);

  // /metrics: 7 GenerateImage calls (first, same, other, random, replay, two, jpeg) and 1 stream,
  // generating 8 + 1 = 9 images with `steps` steps each; the warm-up is not counted.
  const std::string text = metrics();
  EXPECT_EQ(
      metric_value(text, "flux2_requests_total", {{"method", "GenerateImage"}, {"code", "OK"}}),
      7.0);
  EXPECT_EQ(metric_value(text, "flux2_requests_total",
                         {{"method", "GenerateImageStream"}, {"code", "OK"}}),
            1.0);
  EXPECT_EQ(
      metric_value(text, "flux2_requests_total", {{"method", "GetModelInfo"}, {"code", "OK"}}),
      1.0);
  EXPECT_EQ(
      metric_value(text, "flux2_request_duration_seconds_count", {{"method", "GenerateImage"}}),
      7.0);
  EXPECT_EQ(
      metric_value(text, "flux2_denoise_step_duration_seconds_count", {{"quality", "lossless"}}),
      9.0 * steps);
  EXPECT_EQ(metric_value(text, "flux2_images_generated_total"), 9.0);
  EXPECT_EQ(metric_value(text, "flux2_pixels_generated_total"), 9.0 * 64 * 48);
  EXPECT_EQ(metric_value(text, "flux2_queue_duration_seconds_count"), 8.0);
  // One prompt throughout: the first request encodes it, the 7 others find it in the cache.
  EXPECT_EQ(metric_value(text, "flux2_prompt_cache_requests_total", {{"result", "miss"}}), 1.0);
  EXPECT_EQ(metric_value(text, "flux2_prompt_cache_requests_total", {{"result", "hit"}}), 7.0);
  EXPECT_EQ(metric_value(text, "flux2_prompt_cache_capacity_bytes"), 268435456.0);
  for (const char* stage : {"tokenize", "text_encode", "denoise", "decode", "encode"}) {
    EXPECT_EQ(metric_value(text, "flux2_stage_duration_seconds_count", {{"stage", stage}}), 8.0)
        << stage;
    EXPECT_GT(
        metric_value(text, "flux2_stage_duration_seconds_sum", {{"stage", stage}}).value_or(0.0),
        0.0)
        << stage;
  }
  EXPECT_EQ(metric_value(text, "flux2_ready"), 1.0);
  EXPECT_EQ(metric_value(text, "flux2_queue_depth"), 0.0);
  EXPECT_EQ(metric_value(text, "flux2_requests_in_flight"), 0.0);
  EXPECT_GT(metric_value(text, "flux2_model_load_duration_seconds").value_or(0.0), 0.0);
  EXPECT_EQ(metric_value(text, "flux2_build_info", {{"backend", "cpu"}}), 1.0);
}

struct BadCase {
  const char* name;
  std::function<void(v1::GenerateImageRequest&)> mutate;
  const char* field;
};

TEST_F(E2E, EachInvalidFieldGivesInvalidArgumentNamingIt) {
  start();
  const std::vector<BadCase> cases = {
      {"empty prompt", [](auto& r) { r.set_prompt(""); }, "prompt"},
      {"prompt too long", [](auto& r) { r.set_prompt(std::string(8193, 'a')); }, "prompt"},
      {"width not x16", [](auto& r) { r.set_width(72 + 1); }, "width"},
      {"width negative", [](auto& r) { r.set_width(-64); }, "width"},
      {"height not x16", [](auto& r) { r.set_height(50); }, "height"},
      {"over the pixel budget",
       [](auto& r) {
         r.set_width(4096);
         r.set_height(2048);
       },
       "width"},
      {"steps above the limit", [](auto& r) { r.set_num_inference_steps(201); },
       "num_inference_steps"},
      {"steps negative", [](auto& r) { r.set_num_inference_steps(-3); }, "num_inference_steps"},
      {"guidance NaN", [](auto& r) { r.set_guidance_scale(std::nan("")); }, "guidance_scale"},
      {"guidance inf",
       [](auto& r) { r.set_guidance_scale(std::numeric_limits<double>::infinity()); },
       "guidance_scale"},
      {"guidance out of range", [](auto& r) { r.set_guidance_scale(1e6); }, "guidance_scale"},
      {"negative prompt on a distilled model", [](auto& r) { r.set_negative_prompt("blurry"); },
       "negative_prompt"},
      {"num_images above the limit", [](auto& r) { r.set_num_images(5); }, "num_images"},
      {"unknown quality", [](auto& r) { r.set_quality(static_cast<v1::Quality>(42)); }, "quality"},
      {"QUALITY_HIGH not enabled", [](auto& r) { r.set_quality(v1::QUALITY_HIGH); }, "quality"},
      {"unknown output format",
       [](auto& r) { r.set_output_format(static_cast<v1::OutputFormat>(9)); }, "output_format"},
      {"request id not printable", [](auto& r) { r.set_request_id("id\x01"); }, "request_id"},
  };
  for (const BadCase& c : cases) {
    v1::GenerateImageRequest request = small_request(1);
    c.mutate(request);
    v1::GenerateImageResponse response;
    const grpc::Status status = generate(request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_NE(status.error_message().find(c.field), std::string::npos)
        << c.name << ": " << status.error_message();
    const std::vector<std::string> fields = bad_request_fields(status);
    EXPECT_NE(std::find(fields.begin(), fields.end(), c.field), fields.end()) << c.name;
  }
  // Still serving, and every rejection counted.
  v1::GenerateImageResponse response;
  EXPECT_TRUE(generate(small_request(1), &response).ok());
  EXPECT_EQ(
      metric("flux2_requests_total", {{"method", "GenerateImage"}, {"code", "INVALID_ARGUMENT"}}),
      static_cast<double>(cases.size()));
  EXPECT_EQ(metric("flux2_images_generated_total"), 1.0);
}

TEST_F(E2E, OverloadRejectsTheExcessAtOnceAndCountsIt) {
  // Queue depth Q = 2; every step sleeps 100 ms (test-only flag) so the first request holds the
  // worker for 200 x 0.1 = 20 s, far longer than the rest of the test needs.
  start({"--queue-depth", "2", "--test-step-delay-ms", "100"});
  StreamCall running(stub_.get(), small_request(1, 200));
  ASSERT_TRUE(running.wait_progress(1));
  UnaryCall queued_1(stub_.get(), small_request(2, 1));
  UnaryCall queued_2(stub_.get(), small_request(3, 1));
  ASSERT_TRUE(wait_metric("flux2_queue_depth", {}, 2.0));
  // N = 6 > Q + 1 concurrent requests: the 3 beyond the running one and the full queue fail at
  // once, while the first request is still running.
  std::vector<std::unique_ptr<UnaryCall>> excess;
  for (int i = 0; i < 3; ++i)
    excess.push_back(std::make_unique<UnaryCall>(stub_.get(), small_request(10 + i, 1)));
  for (auto& call : excess)
    EXPECT_EQ(call->finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_FALSE(running.done());
  EXPECT_EQ(
      metric("flux2_requests_total", {{"method", "GenerateImage"}, {"code", "RESOURCE_EXHAUSTED"}}),
      3.0);
  running.cancel();
  EXPECT_EQ(running.finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(queued_1.finish().ok());
  EXPECT_TRUE(queued_2.finish().ok());
}

TEST_F(E2E, FiftyMillisecondDeadlineIsExceeded) {
  // Steps sleep 200 ms (test-only flag), so a 50 ms deadline passes during the first step.
  start({"--test-step-delay-ms", "200"});
  UnaryCall hurried(stub_.get(), small_request(1, 4), std::chrono::milliseconds(50));
  EXPECT_EQ(hurried.finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(wait_metric("flux2_requests_total",
                          {{"method", "GenerateImage"}, {"code", "DEADLINE_EXCEEDED"}}, 1.0));
  // The worker stopped at the next step boundary: the following request is served.
  v1::GenerateImageResponse response;
  EXPECT_TRUE(generate(small_request(2, 1), &response).ok());

  // While queued behind a running request, an expired request leaves the queue at once.
  StreamCall running(stub_.get(), small_request(3, 100));
  ASSERT_TRUE(running.wait_progress(1));
  UnaryCall queued(stub_.get(), small_request(4, 1), std::chrono::milliseconds(50));
  EXPECT_EQ(queued.finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(wait_metric("flux2_requests_total",
                          {{"method", "GenerateImage"}, {"code", "DEADLINE_EXCEEDED"}}, 2.0));
  EXPECT_EQ(metric("flux2_queue_depth"), 0.0);
  EXPECT_FALSE(running.done());
  running.cancel();
}

// A real CPU request (no test delay) past its deadline stops within one stage: the next request,
// sent as the deadline passes, waits in the queue at most one stage (the longest of the text
// encoder, a step and the VAE decode, measured on this server just before). Bound: 2 x that stage
// (stage times vary between requests on a loaded 2-core machine) + 250 ms (RPC and scheduling).
TEST_F(E2E, DeadlineOverrunOfARealRequestIsAtMostOneStage) {
  start();
  v1::GenerateImageRequest calibrate = small_request(1, 4);
  calibrate.set_width(384);
  calibrate.set_height(384);
  v1::GenerateImageResponse measured;
  ASSERT_TRUE(generate(calibrate, &measured).ok());
  const v1::Timings& t = measured.timings();
  double stage = std::max(t.tokenize_seconds() + t.text_encode_seconds(), t.decode_seconds());
  for (double step : t.step_seconds()) stage = std::max(stage, step);
  const double one_image = t.total_seconds() - t.queue_seconds() - t.encode_seconds();

  v1::GenerateImageRequest late_request = calibrate;
  late_request.set_num_images(4);  // about 4 x one_image of work
  late_request.set_seed(2);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(1e3 * 1.5 * one_image) + 1);
  const auto sent = std::chrono::steady_clock::now();
  UnaryCall late(stub_.get(), late_request, timeout);
  std::this_thread::sleep_until(sent + timeout);
  v1::GenerateImageResponse next;
  ASSERT_TRUE(generate(small_request(3, 1), &next).ok());
  EXPECT_EQ(late.finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  const double overrun = next.timings().queue_seconds();
  std::printf("deadline %.3f s, longest stage %.3f s, the next request queued %.3f s\n",
              timeout.count() / 1e3, stage, overrun);
  EXPECT_LE(overrun, 2.0 * stage + 0.25);
}

TEST_F(E2E, CancelMidRunFreesTheWorker) {
  // 200 steps x 200 ms (test-only flag) = 40 s for the victim; the next request's 20 s deadline
  // can only be met if the cancel frees the worker early.
  start({"--test-step-delay-ms", "200"});
  StreamCall victim(stub_.get(), small_request(1, 200));
  ASSERT_TRUE(victim.wait_progress(2));
  UnaryCall next(stub_.get(), small_request(2, 2), std::chrono::seconds(20));
  ASSERT_TRUE(wait_metric("flux2_queue_depth", {}, 1.0));
  victim.cancel();
  EXPECT_EQ(victim.finish().error_code(), grpc::StatusCode::CANCELLED);
  const grpc::Status next_status = next.finish();
  ASSERT_TRUE(next_status.ok()) << next_status.error_message();
  ASSERT_TRUE(wait_metric("flux2_requests_total",
                          {{"method", "GenerateImageStream"}, {"code", "CANCELLED"}}, 1.0));
  // Steps taken: the victim's (stopped early) plus the next request's 2.
  const double steps_taken = metric("flux2_denoise_step_duration_seconds_count").value_or(-1.0);
  EXPECT_GE(steps_taken, 2.0 + 2.0);
  EXPECT_LT(steps_taken, 200.0 + 2.0);
}

TEST_F(E2E, SigtermDrainsInFlightWorkAndExitsZero) {
  start({"--test-step-delay-ms", "100", "--drain-timeout-s", "120"});
  StreamCall running(stub_.get(), small_request(1, 10));
  ASSERT_TRUE(running.wait_progress(1));
  UnaryCall queued(stub_.get(), small_request(2, 2));
  ASSERT_TRUE(wait_metric("flux2_queue_depth", {}, 1.0));
  server_->send_signal(SIGTERM);
  ASSERT_TRUE(wait_for_health(channel_, "readiness", "NOT_SERVING"));
  UnaryCall refused(stub_.get(), small_request(3, 1));
  EXPECT_EQ(refused.finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  const grpc::Status running_status = running.finish();
  EXPECT_TRUE(running_status.ok()) << running_status.error_message();
  EXPECT_EQ(running.progress().size(), 10u);
  EXPECT_EQ(running.result().images_size(), 1);
  const grpc::Status queued_status = queued.finish();
  EXPECT_TRUE(queued_status.ok()) << queued_status.error_message();
  EXPECT_EQ(server_->wait_exit(std::chrono::seconds(120)), 0);
}

// The steps each of `gpus` reported to flux2_denoise_step_collective_seconds, by kind.
void expect_collectives_per_gpu(const std::string& metrics, const std::vector<std::string>& gpus,
                                double steps) {
  const std::string name = "flux2_denoise_step_collective_seconds";
  for (const std::string& gpu : gpus) {
    for (const char* kind : {"all_to_all", "all_gather"}) {
      EXPECT_EQ(metric_value(metrics, name + "_count", {{"gpu", gpu}, {"collective", kind}}), steps)
          << "gpu " << gpu << " " << kind;
    }
    // Sequence ranks exchange q, k, v and the attention output around every block.
    EXPECT_GT(metric_value(metrics, name + "_sum", {{"gpu", gpu}, {"collective", "all_to_all"}})
                  .value_or(0.0),
              0.0)
        << "gpu " << gpu;
  }
}

// --gpus 3 on the CPU backend: one engine over three ranks (threads over the in-process
// communicator; the tiny checkpoint's 3 heads, one per rank) serves through the real binary, the
// same image as one rank, every rank's collective time per step on /metrics (label gpu); --gpus
// 4,6,9 is three ranks named by those ordinals (GetModelInfo, the gpu label), the same bytes as
// --gpus 3; a fault that fails the last rank ends the server with exit 1.
TEST_F(E2E, GpusThreeServesOverThreeRanksAndARankFailureEndsTheServer) {
  start({"--warmup-steps", "0"});
  v1::GenerateImageResponse one;
  ASSERT_TRUE(generate(small_request(11, 2), &one).ok());
  EXPECT_EQ(metrics().find("flux2_denoise_step_collective_seconds"), std::string::npos);
  start({"--gpus", "3", "--warmup-steps", "0"});
  grpc::ClientContext context;
  v1::GetModelInfoResponse info;
  ASSERT_TRUE(stub_->GetModelInfo(&context, {}, &info).ok());
  EXPECT_EQ(info.backend_options().at("gpus"), "3");
  EXPECT_EQ(info.backend_options().at("gpu-ordinals"), "0,1,2");
  v1::GenerateImageResponse three;
  ASSERT_TRUE(generate(small_request(11, 2), &three).ok());
  ASSERT_EQ(three.images_size(), 1);
  EXPECT_EQ(three.images(0).width(), 64);
  expect_collectives_per_gpu(metrics(), {"0", "1", "2"}, 2.0);
  // Sequence shards meet the float32 bar, not bits (model/README.md): every value within one
  // level of one rank's, at most 0.5% of them off by one.
  const std::vector<uint8_t> pixels = decode_rgb(three.images(0).data());
  const std::vector<uint8_t> reference = decode_rgb(one.images(0).data());
  ASSERT_EQ(pixels.size(), reference.size());
  ASSERT_FALSE(pixels.empty());
  size_t off_by_one = 0;
  for (size_t i = 0; i < pixels.size(); ++i) {
    ASSERT_LE(std::abs(int{pixels[i]} - int{reference[i]}), 1) << "value " << i;
    off_by_one += pixels[i] != reference[i];
  }
  EXPECT_LE(static_cast<double>(off_by_one), 0.005 * static_cast<double>(pixels.size()));
  start({"--gpus", "4,6,9", "--warmup-steps", "0"});
  grpc::ClientContext listed_context;
  ASSERT_TRUE(stub_->GetModelInfo(&listed_context, {}, &info).ok());
  EXPECT_EQ(info.backend_options().at("gpus"), "3");
  EXPECT_EQ(info.backend_options().at("gpu-ordinals"), "4,6,9");
  v1::GenerateImageResponse listed;
  ASSERT_TRUE(generate(small_request(11, 2), &listed).ok());
  ASSERT_EQ(listed.images_size(), 1);
  EXPECT_EQ(decode_rgb(listed.images(0).data()), pixels) << "the same P gives the same bits";
  const std::string listed_metrics = metrics();
  expect_collectives_per_gpu(listed_metrics, {"4", "6", "9"}, 2.0);
  EXPECT_EQ(
      metric_value(listed_metrics, "flux2_denoise_step_collective_seconds_count", {{"gpu", "0"}}),
      std::nullopt);
  start({"--gpus", "3", "--warmup-steps", "0", "--test-inject-fault", "illegal_address@1"});
  v1::GenerateImageResponse failed;
  const grpc::Status status = generate(small_request(11, 2), &failed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL) << status.error_message();
  EXPECT_NE(status.error_message().find("rank 2 of 3"), std::string::npos)
      << status.error_message();
  EXPECT_EQ(server_->wait_exit(std::chrono::seconds(120)), 1);
}

TEST_F(E2E, ProbeModeReportsHealth) {
  start();
  const std::string addr = "127.0.0.1:" + std::to_string(server_->grpc_port());
  EXPECT_EQ(run_command({kServerBinary, "--probe", "readiness", "--addr", addr}), 0);
  EXPECT_EQ(run_command({kServerBinary, "--probe", "liveness", "--addr", addr}), 0);
  server_->send_signal(SIGTERM);
  EXPECT_EQ(server_->wait_exit(std::chrono::seconds(120)), 0);
  // Nothing listens there any more.
  EXPECT_EQ(run_command({kServerBinary, "--probe", "liveness", "--addr", addr}), 1);
}

TEST_F(E2E, LoadFailureExitsNonZero) {
  server_ = ServerProcess::start(kServerBinary, {"--model-dir", "/nonexistent/flux2-model"});
  ASSERT_NE(server_, nullptr);
  EXPECT_EQ(server_->wait_exit(std::chrono::seconds(120)), 1);
}

// Server reflection (what grpcurl uses): v1alpha's ServerReflectionInfo with list_services, called
// generically (Debian ships no reflection .proto) and decoded with the v1 messages, which share
// v1alpha's wire format: the same services as v1 lists (server_test.cc ReflectionV1*).
TEST_F(E2E, ReflectionListsTheServices) {
  start();
  grpc::GenericStub stub(channel_);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  auto* const kTag = reinterpret_cast<void*>(1);
  call->StartCall(kTag);
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  const char request_bytes[] = {0x3a, 0x00};  // field 7 (list_services), length-delimited, ""
  grpc::Slice slice(request_bytes, sizeof(request_bytes));
  grpc::ByteBuffer request(&slice, 1);
  call->WriteLast(request, grpc::WriteOptions(), kTag);
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::ByteBuffer response;
  call->Read(&response, kTag);
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  grpc::reflection::v1::ServerReflectionResponse decoded;
  ASSERT_TRUE(decoded.ParseFromString(bytes));
  std::vector<std::string> names;
  for (const auto& service : decoded.list_services_response().service())
    names.push_back(service.name());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"flux2.v1.ImageGeneration", "grpc.health.v1.Health",
                                             "grpc.reflection.v1.ServerReflection",
                                             "grpc.reflection.v1alpha.ServerReflection"}));
  context.TryCancel();
  grpc::Status status;
  call->Finish(&status, kTag);
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace flux2::server::testing
