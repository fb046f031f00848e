// FP8 checkpoints end to end on the real flux2_server (tiny klein checkpoint, CPU): with
// --transformer-file naming BFL's FP8 layout (tests/data/tiny-klein/fp8/bfl_fp8.safetensors) the
// server reports the format and stored bytes in GetModelInfo and returns diffusers' image for
// fp8_cases.json's pipeline case (fp8_pipeline.safetensors case0.image_u8); the ModelOpt folder
// loads the same way; --fp8-lossless per_layer with --text-encoder-file gives the same pixels;
// --fp8-input-scale static is reported (22 of 22 GEMMs) and refused without quality=high.
// Run: ctest --test-dir build-cpu -R Fp8E2E

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/server/test_support.h"

namespace flux2::server::testing {
namespace {

namespace v1 = flux2::v1;

const std::string kKlein = std::string(FLUX2_TEST_DATA_DIR) + "/tiny-klein";

// Fails unless `png` is the golden case0.image_u8 (expect_golden_png).
void expect_golden(const std::string& png) {
  expect_golden_png(png, kKlein + "/fp8_pipeline.safetensors", "case0.image_u8", 64, 64);
}

class Fp8E2E : public ::testing::Test {
 protected:
  void start(const std::string& transformer_file, std::vector<std::string> more = {}) {
    std::vector<std::string> args = {"--model-dir",           kKlein + "/checkpoint",
                                     "--transformer-file",    transformer_file,
                                     "--max-sequence-length", "64",
                                     "--warmup-steps",        "0"};
    args.insert(args.end(), more.begin(), more.end());
    server_ = ServerProcess::start(FLUX2_SERVER_BINARY, args);
    ASSERT_NE(server_, nullptr);
    channel_ = local_channel(server_->grpc_port());
    stub_ = v1::ImageGeneration::NewStub(channel_);
    ASSERT_TRUE(wait_for_health(channel_, "readiness", "SERVING"));
  }
  // Generates fp8_cases.json's pipeline case 0 and fails unless it returns the golden pixels.
  void expect_golden_case() {
    v1::GenerateImageRequest request;
    request.set_prompt("a red fox in the snow, from an FP8 file");
    request.set_width(64);
    request.set_height(64);
    request.set_num_inference_steps(4);
    request.set_seed(700);
    request.set_guidance_scale(4.0);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kTestWaitLimit);
    v1::GenerateImageResponse response;
    const grpc::Status status = stub_->GenerateImage(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response.images_size(), 1);
    expect_golden(response.images(0).data());
  }
  v1::GetModelInfoResponse info() {
    grpc::ClientContext context;
    v1::GetModelInfoResponse response;
    EXPECT_TRUE(stub_->GetModelInfo(&context, {}, &response).ok());
    return response;
  }

  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ImageGeneration::Stub> stub_;
};

TEST_F(Fp8E2E, BflFp8FileServesDiffusersPixelsAndIsReported) {
  start(kKlein + "/fp8/bfl_fp8.safetensors");
  const v1::GetModelInfoResponse model = info();
  EXPECT_EQ(model.transformer_file(), "bfl_fp8.safetensors");
  EXPECT_EQ(model.transformer_format(), "bfl_fp8");
  // Stored FP8 (one byte per block weight), less than the bf16 checkpoint's ~1.9 MB of weights.
  EXPECT_GT(model.transformer_checkpoint_bytes(), 500000);
  EXPECT_LT(model.transformer_checkpoint_bytes(), 1300000);

  expect_golden_case();
  EXPECT_EQ(model.fp8_lossless(), "resident");
  EXPECT_EQ(model.fp8_input_scale(), "dynamic");
  EXPECT_EQ(model.fp8_gemms(), 0);  // quality=high is not enabled
  EXPECT_EQ(model.fp8_static_scale_gemms(), 0);
}

// --fp8-input-scale static: BFL's file has an input_scale on every quantized layer, so all 22 FP8
// GEMMs use it (GetModelInfo); lossless requests keep the golden pixels and quality=high ones run.
TEST_F(Fp8E2E, StaticInputScalesAreReportedAndServeQualityHigh) {
  start(kKlein + "/fp8/bfl_fp8.safetensors",
        {"--enable-quality-high", "--fp8-input-scale", "static"});
  const v1::GetModelInfoResponse model = info();
  EXPECT_EQ(model.fp8_input_scale(), "static");
  EXPECT_EQ(model.fp8_gemms(), 22);  // 2 double blocks x 8 + 3 single blocks x 2
  EXPECT_EQ(model.fp8_static_scale_gemms(), 22);
  expect_golden_case();
  v1::GenerateImageRequest request;
  request.set_prompt("a red fox in the snow, from an FP8 file");
  request.set_width(64);
  request.set_height(64);
  request.set_num_inference_steps(2);
  request.set_quality(v1::QUALITY_HIGH);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kTestWaitLimit);
  v1::GenerateImageResponse response;
  const grpc::Status status = stub_->GenerateImage(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.images_size(), 1);
}

// static without quality=high has nothing to scale: start-up fails (exit 1) naming the flag.
TEST_F(Fp8E2E, StaticInputScaleWithoutQualityHighRefusesStartUp) {
  server_ = ServerProcess::start(
      FLUX2_SERVER_BINARY,
      {"--model-dir", kKlein + "/checkpoint", "--transformer-file",
       kKlein + "/fp8/bfl_fp8.safetensors", "--fp8-input-scale", "static", "--warmup-steps", "0"});
  if (server_ == nullptr) return;  // it may exit before it listens: refused either way
  EXPECT_EQ(server_->wait_exit(std::chrono::seconds(120)), 1);
}

// --fp8-lossless per_layer (only the file's FP8 bytes resident, each weight dequantized as its
// GEMM runs) and the text encoder from a single file (--text-encoder-file, here the checkpoint's
// own bf16 file): the same golden pixels; GetModelInfo names each component's format and bytes.
TEST_F(Fp8E2E, PerLayerPlanAndTextEncoderFileServeTheGoldenPixels) {
  start(kKlein + "/fp8/bfl_fp8.safetensors",
        {"--fp8-lossless", "per_layer", "--text-encoder-file",
         kKlein + "/checkpoint/text_encoder/model.safetensors"});
  const v1::GetModelInfoResponse model = info();
  EXPECT_EQ(model.fp8_lossless(), "per_layer");
  ASSERT_GE(model.components_size(), 3);
  EXPECT_EQ(model.components(0).name(), "text_encoder");
  EXPECT_EQ(model.components(0).format(), "file");
  EXPECT_EQ(model.components(1).name(), "transformer");
  EXPECT_EQ(model.components(1).format(), "bfl_fp8 (stored fp8)");
  EXPECT_GT(model.components(1).device_bytes(), 0);
  EXPECT_EQ(model.components(1).checkpoint_bytes(), model.transformer_checkpoint_bytes());

  expect_golden_case();
}

TEST_F(Fp8E2E, ModelOptFolderLoadsAsTransformerFile) {
  start(kKlein + "/fp8/modelopt/transformer");
  EXPECT_EQ(info().transformer_format(), "modelopt_fp8");
}

}  // namespace
}  // namespace flux2::server::testing
