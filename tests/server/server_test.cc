// The whole Server in process (server/app/server.h) over real gRPC, with the fake engine whose
// steps wait at a gate the test opens, so every assertion is an ordering: readiness after load and
// warm-up, a failed load, both generation RPCs, validation with BadRequest details, overload
// (RESOURCE_EXHAUSTED at once, counted), deadlines while queued, cancellation freeing the worker,
// bearer-token auth, and editing (reference
// images through both RPCs, each bad one refused naming it, the receive limit), the response-size
// bound of the unary call, one message per image on the stream, health by service name and
// reflection v1.
// Run: build/bin/server_unit_tests --gtest_filter='ServerTest*'
#include "server/app/server.h"

#include "server/grpc/probe.h"

#include <httplib.h>
#include <stb_image.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "google/protobuf/descriptor.pb.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/server/fake_engine.h"
#include "tests/server/server_fixture.h"
#include "tests/server/test_support.h"

namespace flux2::server {
namespace {

namespace v1 = flux2::v1;
using testing::bad_request_fields;
using testing::fake_pixel;
using testing::FakeEngineControl;
using testing::health_status;
using testing::metric_value;
using testing::small_request;
using testing::StreamCall;
using testing::UnaryCall;
using testing::wait_for_health;

class ServerTest : public testing::FakeServerTest {
 protected:
  std::string metrics_text() { return server_->metrics().render(); }
};

TEST_F(ServerTest, ReadinessWaitsForLoadAndWarmup) {
  control_->hold_load();
  start(/*wait_ready=*/false);
  EXPECT_EQ(health_status(channel_, "liveness"), "SERVING");
  EXPECT_EQ(health_status(channel_, "readiness"), "NOT_SERVING");
  EXPECT_EQ(health_status(channel_, ""), "NOT_SERVING");
  EXPECT_EQ(health_status(channel_, "flux2.v1.ImageGeneration"), "NOT_SERVING");
  grpc::ClientContext context;
  v1::GenerateImageResponse response;
  EXPECT_EQ(stub_->GenerateImage(&context, small_request(1), &response).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  grpc::ClientContext info_context;
  v1::GetModelInfoResponse info;
  EXPECT_EQ(stub_->GetModelInfo(&info_context, {}, &info).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(metric_value(metrics_text(), "flux2_ready"), 0.0);

  control_->release_load();
  ASSERT_TRUE(wait_for_health(channel_, "readiness", "SERVING"));
  EXPECT_EQ(health_status(channel_, ""), "SERVING");
  // The service's own name answers as "" does (grpc_health_probe
  // -service=flux2.v1.ImageGeneration).
  EXPECT_EQ(health_status(channel_, "flux2.v1.ImageGeneration"), "SERVING");
  // The warm-up ran before readiness: text-to-image and, editing being on, with a reference.
  EXPECT_EQ(control_->generations(), 2);
  EXPECT_EQ(metric_value(metrics_text(), "flux2_ready"), 1.0);
}

TEST_F(ServerTest, FailedLoadMakesTheProcessNotLive) {
  control_->fail_load(absl::NotFoundError("no weights here"));
  start(/*wait_ready=*/false);
  const absl::Status stop = server_->WaitForStopRequest();
  EXPECT_TRUE(absl::IsNotFound(stop)) << stop;
  EXPECT_TRUE(wait_for_health(channel_, "liveness", "NOT_SERVING"));
  EXPECT_EQ(health_status(channel_, "readiness"), "NOT_SERVING");
}

TEST_F(ServerTest, PortInUseFailsStartNamingTheFlag) {
  start();
  ServerOptions clash = options_;
  clash.port = server_->grpc_port();
  absl::StatusOr<std::unique_ptr<Server>> second =
      Server::Create(clash, testing::fake_engine_factory(control_));
  ASSERT_TRUE(second.ok());
  const absl::Status started = (*second)->Start();
  EXPECT_TRUE(absl::IsUnavailable(started)) << started;
  EXPECT_NE(started.message().find("--port"), std::string::npos) << started;
  second->reset();  // destroying a server that never started returns at once
  clash.port = 0;
  clash.metrics_port = server_->metrics_port();
  second = Server::Create(clash, testing::fake_engine_factory(control_));
  ASSERT_TRUE(second.ok());
  const absl::Status metrics_clash = (*second)->Start();
  EXPECT_NE(metrics_clash.message().find("--metrics-port"), std::string::npos) << metrics_clash;
}

TEST_F(ServerTest, GenerateImageReturnsTheImageSeedAndTimings) {
  start();
  grpc::ClientContext context;
  v1::GenerateImageRequest request = small_request(/*seed=*/123, /*steps=*/3);
  request.set_num_images(2);
  request.set_request_id("abc-1");
  v1::GenerateImageResponse response;
  const grpc::Status status = stub_->GenerateImage(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.seed(), 123u);
  EXPECT_EQ(response.request_id(), "abc-1");
  EXPECT_EQ(response.model_name(), "fake-klein");
  EXPECT_EQ(response.quality(), v1::QUALITY_LOSSLESS);
  ASSERT_EQ(response.images_size(), 2);
  for (int i = 0; i < 2; ++i) {
    const v1::Image& image = response.images(i);
    EXPECT_EQ(image.seed(), 123u + i);
    EXPECT_EQ(image.mime_type(), "image/png");
    int w = 0, h = 0, n = 0;
    stbi_uc* pixels = stbi_load_from_memory(reinterpret_cast<const stbi_uc*>(image.data().data()),
                                            static_cast<int>(image.data().size()), &w, &h, &n, 3);
    ASSERT_NE(pixels, nullptr);
    EXPECT_EQ(w, 64);
    EXPECT_EQ(h, 48);
    EXPECT_EQ(pixels[(5 * w + 7) * 3 + 1], fake_pixel(123 + i, 7, 5, 1));
    stbi_image_free(pixels);
  }
  EXPECT_EQ(response.timings().step_seconds_size(), 6);
  EXPECT_GT(response.timings().denoise_seconds(), 0.0);
  EXPECT_GT(response.timings().encode_seconds(), 0.0);
  EXPECT_GT(response.timings().total_seconds(), 0.0);  // the fake's step times are not wall time
  EXPECT_EQ(metric_value(metrics_text(), "flux2_requests_total",
                         {{"method", "GenerateImage"}, {"code", "OK"}}),
            1.0);
}

TEST_F(ServerTest, RandomSeedIsReturnedAndReproduces) {
  start();
  v1::GenerateImageRequest request = small_request(0, 1);
  request.clear_seed();
  grpc::ClientContext context;
  v1::GenerateImageResponse first;
  ASSERT_TRUE(stub_->GenerateImage(&context, request, &first).ok());
  request.set_seed(first.seed());
  grpc::ClientContext again_context;
  v1::GenerateImageResponse again;
  ASSERT_TRUE(stub_->GenerateImage(&again_context, request, &again).ok());
  EXPECT_EQ(again.seed(), first.seed());
  EXPECT_EQ(again.images(0).data(), first.images(0).data());
  EXPECT_EQ(control_->seeds().back(), first.seed());
}

TEST_F(ServerTest, StreamSendsOneProgressEventPerStepThenTheResult) {
  start();
  StreamCall call(stub_.get(), small_request(9, /*steps=*/4));
  ASSERT_TRUE(call.finish().ok());
  EXPECT_EQ(call.event_kinds(), "ppppir");
  const std::vector<v1::Progress> progress = call.progress();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(progress[i].step_index(), i);
    EXPECT_EQ(progress[i].step_count(), 4);
  }
  EXPECT_EQ(call.result().seed(), 9u);
  EXPECT_EQ(call.result().images_size(), 1);
  EXPECT_EQ(metric_value(metrics_text(), "flux2_requests_total",
                         {{"method", "GenerateImageStream"}, {"code", "OK"}}),
            1.0);
}

// Several images: each comes in its own `image` message (with its bytes) after its last progress
// event; the result describes them without the bytes; the bytes equal the unary call's.
TEST_F(ServerTest, StreamSendsEachImageInItsOwnMessageAndTheResultWithoutData) {
  start();
  v1::GenerateImageRequest request = small_request(30, /*steps=*/2);
  request.set_num_images(3);
  StreamCall call(stub_.get(), request);
  ASSERT_TRUE(call.finish().ok());
  const std::string kinds = call.event_kinds();
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), 'p'), 6);
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), 'i'), 3);
  EXPECT_EQ(kinds.back(), 'r');
  // Image i follows the last step of image i (progress of image i + 1 may come before it).
  int progress_seen = 0, images_seen = 0;
  for (char kind : kinds) {
    if (kind == 'p') ++progress_seen;
    if (kind == 'i') {
      ++images_seen;
      EXPECT_GE(progress_seen, 2 * images_seen) << kinds;
    }
  }
  const std::vector<v1::Image> images = call.images();
  const v1::GenerateImageResponse result = call.result();
  ASSERT_EQ(images.size(), 3u);
  ASSERT_EQ(result.images_size(), 3);

  grpc::ClientContext context;
  v1::GenerateImageResponse unary;
  ASSERT_TRUE(stub_->GenerateImage(&context, request, &unary).ok());
  ASSERT_EQ(unary.images_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(images[i].seed(), 30u + i);
    EXPECT_EQ(images[i].mime_type(), "image/png");
    EXPECT_EQ(images[i].width(), 64);
    EXPECT_EQ(images[i].height(), 48);
    EXPECT_FALSE(images[i].data().empty());
    EXPECT_EQ(images[i].data(), unary.images(i).data());
    // The result: the same metadata, no bytes.
    EXPECT_TRUE(result.images(i).data().empty());
    EXPECT_EQ(result.images(i).seed(), images[i].seed());
    EXPECT_EQ(result.images(i).mime_type(), images[i].mime_type());
    EXPECT_EQ(result.images(i).width(), 64);
    EXPECT_EQ(result.images(i).height(), 48);
  }
  EXPECT_EQ(result.seed(), 30u);
  EXPECT_EQ(result.timings().step_seconds_size(), 6);
}

// A unary request whose worst-case response exceeds --max-response-bytes (three 768 x 768 PNGs:
// 3 x 1771131 bytes > 4 MiB) is refused before it is queued, naming num_images; the fake engine
// never sees it. Two fit; the stream takes all three; a larger limit admits the unary call.
TEST_F(ServerTest, UnaryOverTheResponseBoundIsRefusedBeforeCompute) {
  start();
  const int warmup_generations = control_->generations();
  v1::GenerateImageRequest request = small_request(40, /*steps=*/1);
  request.set_width(768);
  request.set_height(768);
  request.set_num_images(3);
  grpc::ClientContext context;
  v1::GenerateImageResponse response;
  const grpc::Status status = stub_->GenerateImage(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(bad_request_fields(status), std::vector<std::string>{"num_images"});
  EXPECT_NE(status.error_message().find("num_images: 3 x 768 x 768 PNG images may reach"),
            std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find("4194304"), std::string::npos);
  EXPECT_NE(status.error_message().find("GenerateImageStream"), std::string::npos);
  EXPECT_NE(status.error_message().find("--max-response-bytes"), std::string::npos);
  EXPECT_EQ(control_->generations(), warmup_generations);  // no job reached the engine
  EXPECT_EQ(metric_value(metrics_text(), "flux2_requests_total",
                         {{"method", "GenerateImage"}, {"code", "INVALID_ARGUMENT"}}),
            1.0);

  // JPEG's bound is 6 bytes per pixel: one 768 x 768 fits, two do not.
  request.set_output_format(v1::OUTPUT_FORMAT_JPEG);
  request.set_num_images(2);
  grpc::ClientContext jpeg_context;
  EXPECT_EQ(stub_->GenerateImage(&jpeg_context, request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(control_->generations(), warmup_generations);

  // The stream is not limited: one image per message.
  request.set_output_format(v1::OUTPUT_FORMAT_PNG);
  request.set_num_images(3);
  StreamCall stream(stub_.get(), request);
  ASSERT_TRUE(stream.finish().ok());
  EXPECT_EQ(stream.images().size(), 3u);
  EXPECT_EQ(control_->generations(), warmup_generations + 3);

  request.set_num_images(2);
  grpc::ClientContext fits_context;
  const grpc::Status fits = stub_->GenerateImage(&fits_context, request, &response);
  EXPECT_TRUE(fits.ok()) << fits.error_message();
  EXPECT_EQ(response.images_size(), 2);
}

TEST_F(ServerTest, MaxResponseBytesIsReportedAndRaisesTheUnaryBound) {
  options_.max_response_bytes = 8 << 20;
  start();
  grpc::ClientContext info_context;
  v1::GetModelInfoResponse info;
  ASSERT_TRUE(stub_->GetModelInfo(&info_context, {}, &info).ok());
  EXPECT_EQ(info.limits().max_response_bytes(), 8 << 20);
  v1::GenerateImageRequest request = small_request(50, /*steps=*/1);
  request.set_width(768);
  request.set_height(768);
  request.set_num_images(3);
  grpc::ClientContext context;
  v1::GenerateImageResponse response;
  const grpc::Status status = stub_->GenerateImage(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.images_size(), 3);
  EXPECT_LE(response.ByteSizeLong(), 8u << 20);
}

// grpc.reflection.v1 (server/grpc/reflection_v1.h): the services, the API's file by symbol, and the
// google.rpc error details (what a client needs to decode grpc-status-details-bin).
TEST_F(ServerTest, ReflectionV1ListsTheServicesAndResolvesTheErrorDetails) {
  start();
  auto stub = grpc::reflection::v1::ServerReflection::NewStub(channel_);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub->ServerReflectionInfo(&context);
  grpc::reflection::v1::ServerReflectionRequest request;
  grpc::reflection::v1::ServerReflectionResponse response;

  request.set_list_services("");
  ASSERT_TRUE(stream->Write(request));
  ASSERT_TRUE(stream->Read(&response));
  std::vector<std::string> names;
  for (const auto& service : response.list_services_response().service())
    names.push_back(service.name());
  EXPECT_EQ(names, (std::vector<std::string>{"flux2.v1.ImageGeneration", "grpc.health.v1.Health",
                                             "grpc.reflection.v1alpha.ServerReflection",
                                             "grpc.reflection.v1.ServerReflection"}));

  // The file of a symbol comes first, then its dependencies not yet sent on this stream.
  const auto file_of = [&](const std::string& symbol) {
    request.set_file_containing_symbol(symbol);
    EXPECT_TRUE(stream->Write(request));
    EXPECT_TRUE(stream->Read(&response));
    std::vector<std::string> files;
    for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
      google::protobuf::FileDescriptorProto file;
      EXPECT_TRUE(file.ParseFromString(bytes));
      files.push_back(file.name());
    }
    return files;
  };
  std::vector<std::string> files = file_of("flux2.v1.ImageGeneration");
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(files[0], "flux2/v1/image_generation.proto");
  files = file_of("google.rpc.BadRequest");
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(files[0], "google/rpc/error_details.proto");
  files = file_of("google.rpc.Status");
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(files[0], "google/rpc/status.proto");
  files = file_of("grpc.health.v1.Health");
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(files[0], "grpc/health/v1/health.proto");
  EXPECT_TRUE(file_of("no.such.Symbol").empty());
  EXPECT_EQ(response.error_response().error_code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));

  request.set_file_by_filename("google/rpc/error_details.proto");
  ASSERT_TRUE(stream->Write(request));
  ASSERT_TRUE(stream->Read(&response));
  // Asked again by name: the file itself is always sent (only dependencies are sent once).
  EXPECT_EQ(response.file_descriptor_response().file_descriptor_proto_size(), 1);
  EXPECT_EQ(response.original_request().file_by_filename(), "google/rpc/error_details.proto");
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ServerTest, GetModelInfoDescribesModelAndLimits) {
  options_.enable_quality_high = true;
  options_.queue_depth = 5;
  start();
  grpc::ClientContext context;
  v1::GetModelInfoResponse info;
  ASSERT_TRUE(stub_->GetModelInfo(&context, {}, &info).ok());
  EXPECT_EQ(info.model_name(), "fake-klein");
  EXPECT_EQ(info.variant(), "klein-distilled");
  EXPECT_EQ(info.default_steps(), 4);
  EXPECT_FALSE(info.uses_cfg());
  EXPECT_EQ(info.limits().pixel_multiple(), 16);
  EXPECT_EQ(info.limits().max_pixels(), options_.max_pixels);
  EXPECT_EQ(info.limits().max_images(), options_.max_images);
  EXPECT_EQ(info.limits().queue_depth(), 5);
  EXPECT_EQ(info.limits().max_reference_images(), 4);
  EXPECT_EQ(info.limits().max_reference_bytes(), 10 * 1024 * 1024);
  EXPECT_EQ(info.limits().max_request_bytes(), 48 * 1024 * 1024);
  EXPECT_EQ(info.limits().max_response_bytes(), 4 * 1024 * 1024);
  EXPECT_EQ(info.limits().max_sequence_length(), 512);
  ASSERT_EQ(info.quality_levels_size(), 2);
  EXPECT_EQ(info.quality_levels(1), v1::QUALITY_HIGH);
}

// FLUX.2-dev: the variant, its defaults, embedded guidance, the streamed text encoder and the
// prompt cache as the flags set them; a negative prompt is refused naming the field (no CFG), an
// explicit guidance_scale is accepted, and a repeated prompt counts a prompt-cache hit.
TEST_F(ServerTest, GetModelInfoDescribesDevAndItsRequests) {
  control_->dev = true;
  control_->text_encoder_streamed = true;
  control_->prompt_cache_bytes = 12345;
  options_.checkpoint.transformer_file = "/weights/flux2-dev.safetensors";
  start();
  grpc::ClientContext context;
  v1::GetModelInfoResponse info;
  ASSERT_TRUE(stub_->GetModelInfo(&context, {}, &info).ok());
  EXPECT_EQ(info.variant(), "dev");
  EXPECT_EQ(info.pipeline_class(), "Flux2Pipeline");
  EXPECT_EQ(info.default_steps(), 50);
  EXPECT_EQ(info.default_guidance(), 4.0);
  EXPECT_FALSE(info.uses_cfg());
  EXPECT_TRUE(info.guidance_embedded());
  EXPECT_TRUE(info.text_encoder_streamed());
  EXPECT_EQ(info.text_encoder_host_bytes(), 1 << 20);
  EXPECT_EQ(info.prompt_cache_bytes(), 12345);
  EXPECT_EQ(info.transformer_file(), "flux2-dev.safetensors");

  v1::GenerateImageRequest negative = small_request(1);
  negative.set_negative_prompt("blurry");
  grpc::ClientContext negative_context;
  v1::GenerateImageResponse response;
  const grpc::Status refused = stub_->GenerateImage(&negative_context, negative, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message().rfind("negative_prompt: ", 0), 0u) << refused.error_message();
  EXPECT_EQ(bad_request_fields(refused), std::vector<std::string>{"negative_prompt"});

  for (int i = 0; i < 2; ++i) {
    v1::GenerateImageRequest request = small_request(2);
    request.set_guidance_scale(2.5);
    grpc::ClientContext generate_context;
    EXPECT_TRUE(stub_->GenerateImage(&generate_context, request, &response).ok());
  }
  const std::string text = metrics_text();
  EXPECT_EQ(metric_value(text, "flux2_prompt_cache_requests_total", {{"result", "miss"}}), 1.0);
  EXPECT_EQ(metric_value(text, "flux2_prompt_cache_requests_total", {{"result", "hit"}}), 1.0);
  EXPECT_EQ(metric_value(text, "flux2_prompt_cache_capacity_bytes"), 12345.0);
}

TEST_F(ServerTest, InvalidRequestsNameTheFieldAndTheServerKeepsServing) {
  start();
  const std::vector<std::pair<std::function<void(v1::GenerateImageRequest&)>, std::string>> cases =
      {
          {[](auto& r) { r.set_width(65); }, "width"},
          {[](auto& r) { r.set_guidance_scale(std::nan("")); }, "guidance_scale"},
          {[](auto& r) { r.set_num_images(99); }, "num_images"},
          {[](auto& r) { r.set_quality(v1::QUALITY_HIGH); }, "quality"},
      };
  for (const auto& [mutate, field] : cases) {
    v1::GenerateImageRequest request = small_request(1);
    mutate(request);
    grpc::ClientContext context;
    v1::GenerateImageResponse response;
    const grpc::Status status = stub_->GenerateImage(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_NE(status.error_message().find(field), std::string::npos) << status.error_message();
    const std::vector<std::string> fields = bad_request_fields(status);
    EXPECT_NE(std::find(fields.begin(), fields.end(), field), fields.end()) << field;
  }
  grpc::ClientContext context;
  v1::GenerateImageResponse response;
  EXPECT_TRUE(stub_->GenerateImage(&context, small_request(1), &response).ok());
  EXPECT_EQ(metric_value(metrics_text(), "flux2_requests_total", {{"code", "INVALID_ARGUMENT"}}),
            4.0);
  EXPECT_EQ(control_->generations(), 3);  // the two warm-ups and the valid request only
}

TEST_F(ServerTest, EditingThroughBothRpcs) {
  options_.max_sequence_length = 64;
  start();
  v1::GenerateImageRequest request = small_request(21, /*steps=*/2);
  request.set_width(0);  // the first reference's prepared size: 100 x 72 -> 96 x 64
  request.set_height(0);
  request.add_reference_images()->set_data(testing::gradient_png(100, 72));
  request.add_reference_images()->set_data(testing::gradient_jpeg(64, 64));
  grpc::ClientContext context;
  v1::GenerateImageResponse response;
  const grpc::Status status = stub_->GenerateImage(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.images_size(), 1);
  EXPECT_EQ(response.images(0).width(), 96);
  EXPECT_EQ(response.images(0).height(), 64);
  EXPECT_DOUBLE_EQ(response.timings().reference_encode_seconds(),
                   2 * testing::kFakeReferenceEncodeSeconds);
  const std::vector<std::vector<RgbImage>> seen = control_->references();
  ASSERT_EQ(seen.back().size(), 2u);
  EXPECT_EQ(seen.back()[0].width, 96);  // prepared before the engine saw it
  EXPECT_EQ(seen.back()[1].height, 64);

  StreamCall stream(stub_.get(), request);
  ASSERT_TRUE(stream.finish().ok());
  EXPECT_EQ(stream.event_kinds(), "ppir");
  EXPECT_EQ(stream.result().images(0).width(), 96);
  EXPECT_DOUBLE_EQ(stream.result().timings().reference_encode_seconds(),
                   2 * testing::kFakeReferenceEncodeSeconds);
  const std::string text = metrics_text();
  EXPECT_EQ(metric_value(text, "flux2_reference_images_total"), 4.0);
  EXPECT_EQ(
      metric_value(text, "flux2_stage_duration_seconds_count", {{"stage", "reference_encode"}}),
      2.0);
}

TEST_F(ServerTest, EachBadReferenceIsRefusedNamingItAndTheServerKeepsServing) {
  start();
  const int generations = control_->generations();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"not an image"}, "reference_images[0]: not a PNG or JPEG image"},
      {{testing::gradient_png(64, 64), testing::gradient_png(32, 32)},
       "reference_images[1]: 32x32 is under 64 px a side"},
      {{testing::gradient_png(768, 64)}, "reference_images[0]: aspect ratio 12.0 exceeds 8"},
      {{""}, "reference_images[0]: empty"},
      {std::vector<std::string>(5, testing::gradient_png(64, 64)),
       "reference_images: 5 reference images exceed the limit of 4"},
  };
  for (const auto& [references, message] : cases) {
    v1::GenerateImageRequest request = small_request(1);
    for (const std::string& data : references) request.add_reference_images()->set_data(data);
    grpc::ClientContext context;
    v1::GenerateImageResponse response;
    const grpc::Status status = stub_->GenerateImage(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << message;
    EXPECT_EQ(status.error_message(), message);
    const std::string field = message.substr(0, message.find(':'));
    EXPECT_EQ(bad_request_fields(status), std::vector<std::string>{field}) << message;
  }
  EXPECT_EQ(control_->generations(), generations);  // refused before admission
  grpc::ClientContext context;
  v1::GenerateImageResponse response;
  v1::GenerateImageRequest good = small_request(2);
  good.add_reference_images()->set_data(testing::gradient_png(64, 64));
  EXPECT_TRUE(stub_->GenerateImage(&context, good, &response).ok());
  EXPECT_EQ(metric_value(metrics_text(), "flux2_requests_total", {{"code", "INVALID_ARGUMENT"}}),
            5.0);
}

TEST_F(ServerTest, ReceiveLimitFollowsTheFlag) {
  // 1500 x 1000 noise: a PNG over gRPC's default 4 MiB, under --max-request-bytes' 48 MiB.
  const std::string big = testing::noise_png(1500, 1000);
  ASSERT_GT(big.size(), 4u << 20);
  start();
  v1::GenerateImageRequest request = small_request(3, 1);
  request.add_reference_images()->set_data(big);
  {
    grpc::ClientContext context;
    v1::GenerateImageResponse response;
    const grpc::Status status = stub_->GenerateImage(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    // Over 1024 x 1024 px: resized to that area (1254 x 836), then cropped to 1248 x 832.
    EXPECT_EQ(control_->references().back().at(0).width, 1248);
    EXPECT_EQ(control_->references().back().at(0).height, 832);
  }
  server_->GracefulStop(Clock::now() + std::chrono::seconds(60)).IgnoreError();
  server_.reset();
  options_.max_reference_images = 0;  // the smallest receive limit needs no room for references
  options_.max_request_bytes = 4 << 20;
  start();
  grpc::ClientContext context;
  v1::GenerateImageResponse response;
  const grpc::Status status = stub_->GenerateImage(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
}

TEST_F(ServerTest, OverloadIsRejectedAtOnceAndCounted) {
  options_.queue_depth = 2;
  start();
  control_->close_gate();
  StreamCall running(stub_.get(), small_request(1, /*steps=*/3));
  ASSERT_TRUE(control_->wait_steps_started(control_->steps_started() + 0));
  control_->allow_steps(1);
  ASSERT_TRUE(running.wait_progress(1));  // the worker is busy with it
  UnaryCall queued_1(stub_.get(), small_request(2));
  UnaryCall queued_2(stub_.get(), small_request(3));
  ASSERT_TRUE(wait_metric("flux2_queue_depth", {}, 2.0));
  // N = 6 > Q + 1 = 3 concurrent requests: the 3 beyond the running one and the queue are refused
  // while the running one is still held at the gate.
  std::vector<std::unique_ptr<UnaryCall>> excess;
  for (int i = 0; i < 3; ++i)
    excess.push_back(std::make_unique<UnaryCall>(stub_.get(), small_request(10 + i)));
  for (auto& call : excess) {
    const grpc::Status status = call->finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  }
  EXPECT_FALSE(running.done());
  EXPECT_EQ(metric_value(metrics_text(), "flux2_requests_total",
                         {{"method", "GenerateImage"}, {"code", "RESOURCE_EXHAUSTED"}}),
            3.0);
  // Told apart from running out of device memory.
  EXPECT_EQ(
      metric_value(metrics_text(), "flux2_resource_exhausted_total", {{"reason", "queue_full"}}),
      3.0);
  EXPECT_EQ(
      metric_value(metrics_text(), "flux2_resource_exhausted_total", {{"reason", "device_memory"}}),
      0.0);
  control_->open_gate();
  EXPECT_TRUE(running.finish().ok());
  EXPECT_TRUE(queued_1.finish().ok());
  EXPECT_TRUE(queued_2.finish().ok());
}

TEST_F(ServerTest, DeadlineWhileQueuedFreesTheSlot) {
  start();
  control_->close_gate();
  StreamCall running(stub_.get(), small_request(1, 3));
  control_->allow_steps(1);
  ASSERT_TRUE(running.wait_progress(1));
  UnaryCall late(stub_.get(), small_request(2), std::chrono::milliseconds(50));
  EXPECT_EQ(late.finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The server withdrew it from the queue while the running request is still held.
  ASSERT_TRUE(wait_metric("flux2_requests_total",
                          {{"method", "GenerateImage"}, {"code", "DEADLINE_EXCEEDED"}}, 1.0));
  EXPECT_EQ(metric_value(metrics_text(), "flux2_queue_depth"), 0.0);
  EXPECT_FALSE(running.done());
  control_->open_gate();
  EXPECT_TRUE(running.finish().ok());
  EXPECT_EQ(control_->seeds().back(), 1u);  // the expired request never reached the engine
}

TEST_F(ServerTest, CancelMidRunFreesTheWorker) {
  // Slow steps (test-only delay: 100 steps x 50 ms = 5 s) instead of the gate: the client's cancel
  // travels asynchronously, and gated fake steps would all run before it arrives. The exact
  // "stops within one step" bound is proven by
  // EngineWorkerTest.CancelMidRunFreesTheWorkerWithinOneStep; here the cancel must travel from the
  // client through OnCancel to the job.
  options_.test_step_delay_s = 0.05;
  start();
  const int warmup_steps = control_->steps_started();
  StreamCall victim(stub_.get(), small_request(1, /*steps=*/100));
  ASSERT_TRUE(victim.wait_progress(2));
  UnaryCall next(stub_.get(), small_request(2, /*steps=*/2));
  ASSERT_TRUE(wait_metric("flux2_queue_depth", {}, 1.0));
  victim.cancel();
  EXPECT_EQ(victim.finish().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(next.finish().ok());
  const int victim_steps = control_->steps_started() - warmup_steps - 2;
  EXPECT_LT(victim_steps, 100);  // it stopped early and the next request got the worker
  ASSERT_TRUE(wait_metric("flux2_requests_total",
                          {{"method", "GenerateImageStream"}, {"code", "CANCELLED"}}, 1.0));
}

// A cancel or deadline that lands after the last denoising step (here: mid-decode, past the
// pipeline's last check) ends the request as the client saw it: nothing is encoded for nobody and
// the request is counted CANCELLED / DEADLINE_EXCEEDED, not OK.
TEST_F(ServerTest, CancelAfterTheLastStepIsCountedAsTheClientSawIt) {
  start();
  const int decodes = control_->decodes();  // the warm-up's
  control_->hold_decode();
  StreamCall stream(stub_.get(), small_request(1, /*steps=*/2));
  ASSERT_TRUE(stream.wait_progress(2));  // every step is done
  ASSERT_TRUE(control_->wait_decodes(decodes + 1));
  stream.cancel();
  EXPECT_EQ(stream.finish().error_code(), grpc::StatusCode::CANCELLED);
  control_->release_decode();  // the stream's decode ends after its client left
  ASSERT_TRUE(wait_metric("flux2_requests_total",
                          {{"method", "GenerateImageStream"}, {"code", "CANCELLED"}}, 1.0));
  // (Whether its image was encoded depends on whether the cancel reached the server before the
  // decode ended; a deadline is the server's own, so the unary part below checks that.)
  const double images_before =
      metric_value(metrics_text(), "flux2_images_generated_total").value_or(0.0);

  // The unary request's deadline passes while its decode is held.
  control_->hold_decode();
  UnaryCall unary(stub_.get(), small_request(2, /*steps=*/1), std::chrono::milliseconds(2000));
  ASSERT_TRUE(control_->wait_decodes(decodes + 2));
  EXPECT_EQ(unary.finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  control_->release_decode();
  ASSERT_TRUE(wait_metric("flux2_requests_total",
                          {{"method", "GenerateImage"}, {"code", "DEADLINE_EXCEEDED"}}, 1.0));
  EXPECT_EQ(metric_value(metrics_text(), "flux2_requests_total",
                         {{"method", "GenerateImageStream"}, {"code", "OK"}}),
            0.0);
  EXPECT_EQ(metric_value(metrics_text(), "flux2_requests_total",
                         {{"method", "GenerateImage"}, {"code", "OK"}}),
            0.0);
  EXPECT_EQ(metric_value(metrics_text(), "flux2_images_generated_total"), images_before);
  // The server keeps serving.
  UnaryCall next(stub_.get(), small_request(3, /*steps=*/1));
  EXPECT_TRUE(next.finish().ok());
}

// --metrics-basic-auth-file: /metrics answers 401 without the credentials (or with wrong ones)
// and the metrics with them; --metrics-host binds it apart from --host.
TEST_F(ServerTest, MetricsBasicAuthAndHost) {
  const std::string path = ::testing::TempDir() + "/flux2_metrics_auth";
  std::ofstream(path) << "prometheus:sc4pe\n";
  options_.metrics_basic_auth_file = path;
  options_.metrics_host = "127.0.0.1";
  start();
  httplib::Client metrics("127.0.0.1", server_->metrics_port());
  httplib::Result open = metrics.Get("/metrics");
  ASSERT_TRUE(open);
  EXPECT_EQ(open->status, 401);
  metrics.set_basic_auth("prometheus", "guess");
  httplib::Result wrong = metrics.Get("/metrics");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  metrics.set_basic_auth("prometheus", "sc4pe");
  httplib::Result scraped = metrics.Get("/metrics");
  ASSERT_TRUE(scraped);
  EXPECT_EQ(scraped->status, 200);
  EXPECT_NE(scraped->body.find("flux2_requests_total"), std::string::npos);
}

TEST_F(ServerTest, BearerTokenGuardsGenerationButNotHealth) {
  const std::string path = ::testing::TempDir() + "/flux2_token";
  std::ofstream(path) << "s3cret\n";
  options_.auth_token_file = path;
  options_.allow_insecure_token = true;  // plaintext loopback
  start();
  EXPECT_EQ(health_status(channel_, "readiness"), "SERVING");
  UnaryCall none(stub_.get(), small_request(1));
  EXPECT_EQ(none.finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  UnaryCall wrong(stub_.get(), small_request(1), std::chrono::milliseconds(0), "guess");
  EXPECT_EQ(wrong.finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  UnaryCall right(stub_.get(), small_request(1), std::chrono::milliseconds(0), "s3cret");
  EXPECT_TRUE(right.finish().ok());
  grpc::ClientContext context;
  v1::GetModelInfoResponse info;
  EXPECT_EQ(stub_->GetModelInfo(&context, {}, &info).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(ServerTest, TlsServesTlsClientsOnlyAndTheProbeSpeaksTls) {
  // A throwaway self-signed certificate for 127.0.0.1 (openssl is a test-time tool only).
  const std::string dir = ::testing::TempDir();
  const std::string cert = dir + "/flux2_tls_cert.pem", key = dir + "/flux2_tls_key.pem";
  const std::string command =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 "
      "-addext subjectAltName=IP:127.0.0.1 -keyout " +
      key + " -out " + cert + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0)
      << "openssl (installed by deploy/install_deps.sh) made no certificate";
  options_.tls_cert = cert;
  options_.tls_key = key;
  absl::StatusOr<std::unique_ptr<Server>> server =
      Server::Create(options_, testing::fake_engine_factory(control_));
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = std::move(*server);
  ASSERT_TRUE(server_->Start().ok());
  const std::string address = "127.0.0.1:" + std::to_string(server_->grpc_port());

  std::ifstream in(cert);
  std::stringstream pem;
  pem << in.rdbuf();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = pem.str();
  auto tls_channel = grpc::CreateChannel(address, grpc::SslCredentials(ssl));
  ASSERT_TRUE(wait_for_health(tls_channel, "readiness", "SERVING"));
  auto tls_stub = v1::ImageGeneration::NewStub(tls_channel);
  UnaryCall over_tls(tls_stub.get(), small_request(1), std::chrono::seconds(60));
  EXPECT_TRUE(over_tls.finish().ok());

  auto plain_stub = v1::ImageGeneration::NewStub(testing::local_channel(server_->grpc_port()));
  UnaryCall plaintext(plain_stub.get(), small_request(1), std::chrono::seconds(5));
  EXPECT_EQ(plaintext.finish().error_code(), grpc::StatusCode::UNAVAILABLE);

  HealthProbe probe{"readiness", address, cert};
  EXPECT_EQ(run_health_probe(probe), 0);
  probe.tls_cert_file.clear();  // a plaintext probe cannot talk to a TLS server
  EXPECT_EQ(run_health_probe(probe), 1);
}

}  // namespace
}  // namespace flux2::server
