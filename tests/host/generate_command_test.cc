// `flux2 generate` on the tiny checkpoint: writes a PNG of the requested size, or of the first
// --reference's prepared size; bad inputs (size not a multiple of 16, zero steps, a missing model
// directory, a missing or bad reference file, named by the flag) fail with exit status 1;
// progress (components loading, steps) goes to stderr; --transformer-file takes FP8 files, and the
// other checkpoint flags of flux2_server (--text-encoder-file, --fp8-lossless, --fp8-input-scale)
// with --quality work as the server's.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "model/image_encode.h"
#include "server/cli/commands.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

int generate(std::vector<std::string> words) {
  std::vector<char*> argv = {const_cast<char*>("flux2"), const_cast<char*>("generate")};
  for (std::string& w : words) argv.push_back(w.data());
  return run_generate(static_cast<int>(argv.size()), argv.data(), 2);
}

uint32_t big_endian(const std::vector<unsigned char>& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) |
         b[at + 3];
}

// Also prints its progress on stderr: each component as it loads (with its bytes), each step.
TEST(GenerateCommandTest, WritesAPngOfTheRequestedSize) {
  testing::TempDir dir;
  const std::string out = dir.path() + "/fox.png";
  const std::string model = testing::test_data_dir() + "/tiny-klein/checkpoint";
  ::testing::internal::CaptureStderr();
  const int status = generate({"--model-dir", model, "--prompt", "a red fox", "--height", "32",
                               "--width", "48", "--steps", "2", "--out", out});
  const std::string progress = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(status, 0) << progress;
  for (const char* line :
       {"flux2 generate: loading text_encoder (", "flux2 generate: loading transformer (",
        "flux2 generate: loaded transformer: ", "flux2 generate: loaded vae: ",
        "flux2 generate: step 1/2 ", "flux2 generate: step 2/2 "}) {
    EXPECT_NE(progress.find(line), std::string::npos) << line << " in:\n" << progress;
  }
  std::ifstream file(out, std::ios::binary);
  const std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(file)),
                                         std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 33u);
  EXPECT_EQ(std::string(bytes.begin() + 1, bytes.begin() + 4), "PNG");
  EXPECT_EQ(std::string(bytes.begin() + 12, bytes.begin() + 16), "IHDR");
  EXPECT_EQ(big_endian(bytes, 16), 48u);  // width
  EXPECT_EQ(big_endian(bytes, 20), 32u);  // height
}

// --transformer-file: an FP8 file (BFL's layout) loads, and the log names the format; a bad FP8
// file fails naming its tensor.
TEST(GenerateCommandTest, TransformerFileTakesFp8Files) {
  testing::TempDir dir;
  const std::string klein = testing::test_data_dir() + "/tiny-klein";
  ::testing::internal::CaptureStderr();
  const int status =
      generate({"--model-dir", klein + "/checkpoint", "--transformer-file",
                klein + "/fp8/bfl_fp8.safetensors", "--prompt", "a red fox", "--height", "32",
                "--width", "32", "--steps", "1", "--out", dir.path() + "/fox.png"});
  const std::string progress = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(status, 0) << progress;
  EXPECT_NE(progress.find("loaded transformer: "), std::string::npos) << progress;
  EXPECT_NE(progress.find(" from bfl_fp8 (30 FP8 tensors"), std::string::npos) << progress;

  auto tensors = testing::read_all_tensors(klein + "/fp8/comfy_scaled_fp8.safetensors");
  tensors["single_blocks.0.linear1.scale_weight"] = testing::f32_tensor({}, {-1.0f});
  testing::write_safetensors(dir.path() + "/bad.safetensors", tensors);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(generate({"--model-dir", klein + "/checkpoint", "--transformer-file",
                      dir.path() + "/bad.safetensors", "--prompt", "a red fox", "--out",
                      dir.path() + "/bad.png"}),
            1);
  const std::string error = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(error.find("single_blocks.0.linear1.scale_weight[0] is -1"), std::string::npos)
      << error;
}

// The checkpoint flags flux2_server has (shared parsing, server/common/checkpoint_flags.h): the
// text encoder from a single file, --fp8-lossless per_layer (no dequantization after load),
// --quality high with --fp8-input-scale static (every GEMM of BFL's file under its input scale);
// bad words and static without quality=high fail naming the flag.
TEST(GenerateCommandTest, TakesTheServersCheckpointFlags) {
  testing::TempDir dir;
  const std::string klein = testing::test_data_dir() + "/tiny-klein";
  const std::vector<std::string> common = {"--model-dir",
                                           klein + "/checkpoint",
                                           "--transformer-file",
                                           klein + "/fp8/bfl_fp8.safetensors",
                                           "--prompt",
                                           "a red fox",
                                           "--height",
                                           "32",
                                           "--width",
                                           "32",
                                           "--steps",
                                           "1",
                                           "--out",
                                           dir.path() + "/fox.png"};
  const auto run = [&](std::vector<std::string> more, std::string* log) {
    std::vector<std::string> words = common;
    words.insert(words.end(), more.begin(), more.end());
    ::testing::internal::CaptureStderr();
    const int status = generate(words);
    *log = ::testing::internal::GetCapturedStderr();
    return status;
  };
  std::string log;
  ASSERT_EQ(run({"--text-encoder-file", klein + "/checkpoint/text_encoder/model.safetensors",
                 "--fp8-lossless", "per_layer", "--quality", "high", "--fp8-input-scale", "static"},
                &log),
            0)
      << log;
  EXPECT_NE(log.find("loaded text_encoder: "), std::string::npos) << log;
  EXPECT_NE(log.find(" from file ("), std::string::npos) << log;
  EXPECT_EQ(log.find("--fp8-lossless=resident"), std::string::npos) << log;  // per_layer
  EXPECT_NE(log.find("--fp8-input-scale static: 22 under the checkpoint's input_scale"),
            std::string::npos)
      << log;
  ASSERT_EQ(run({}, &log), 0) << log;  // the defaults: resident, lossless, dynamic
  EXPECT_NE(log.find("--fp8-lossless=resident"), std::string::npos) << log;

  const std::pair<std::vector<std::string>, std::string> refused[] = {
      {{"--fp8-input-scale", "calibrated"},
       "--fp8-input-scale \"calibrated\": expected dynamic or static"},
      {{"--fp8-lossless", "lazy"}, "--fp8-lossless \"lazy\": expected resident or per_layer"},
      {{"--quality", "best"}, "--quality \"best\": expected lossless or high"},
      {{"--fp8-input-scale", "static"}, "--fp8-input-scale static: quality=high is not enabled"},
  };
  for (const auto& [more, message] : refused) {
    EXPECT_EQ(run(more, &log), 1) << message;
    EXPECT_NE(log.find(message), std::string::npos) << log;
  }
}

std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::vector<unsigned char>((std::istreambuf_iterator<char>(file)),
                                    std::istreambuf_iterator<char>());
}

// Writes a width x height PNG (a gradient) to `path`.
void write_png(const std::string& path, int64_t width, int64_t height) {
  std::vector<uint8_t> rgb(static_cast<size_t>(width * height * 3));
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 7);
  absl::StatusOr<std::vector<uint8_t>> png = encode_png(rgb, width, height);
  ASSERT_TRUE(png.ok()) << png.status();
  std::ofstream file(path, std::ios::binary);
  file.write(reinterpret_cast<const char*>(png->data()), static_cast<std::streamsize>(png->size()));
}

TEST(GenerateCommandTest, ReferencesSetTheOutputSize) {
  testing::TempDir dir;
  const std::string model = testing::test_data_dir() + "/tiny-klein/checkpoint";
  write_png(dir.path() + "/a.png", 100, 72);  // center-cropped to 96 x 64
  write_png(dir.path() + "/b.png", 64, 64);
  const std::string out = dir.path() + "/edit.png";
  ASSERT_EQ(generate({"--model-dir", model, "--prompt", "make it night", "--reference",
                      dir.path() + "/a.png", "--reference", dir.path() + "/b.png", "--steps", "1",
                      "--out", out}),
            0);
  const std::vector<unsigned char> bytes = read_file(out);
  ASSERT_GT(bytes.size(), 33u);
  EXPECT_EQ(big_endian(bytes, 16), 96u);  // width
  EXPECT_EQ(big_endian(bytes, 20), 64u);  // height
}

TEST(GenerateCommandTest, BadReferencesNameTheFlag) {
  testing::TempDir dir;
  const std::string model = testing::test_data_dir() + "/tiny-klein/checkpoint";
  write_png(dir.path() + "/good.png", 64, 64);
  write_png(dir.path() + "/small.png", 32, 32);
  {
    std::ofstream text(dir.path() + "/notes.txt");
    text << "not an image";
  }
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(generate({"--model-dir", model, "--prompt", "x", "--reference",
                      dir.path() + "/good.png", "--reference", dir.path() + "/missing.png"}),
            1);
  EXPECT_EQ(generate({"--model-dir", model, "--prompt", "x", "--reference",
                      dir.path() + "/good.png", "--reference", dir.path() + "/notes.txt"}),
            1);
  EXPECT_EQ(
      generate({"--model-dir", model, "--prompt", "x", "--reference", dir.path() + "/small.png"}),
      1);
  const std::string errors = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(errors.find("--reference[1]: cannot read " + dir.path() + "/missing.png"),
            std::string::npos)
      << errors;
  EXPECT_NE(errors.find("--reference[1]: not a PNG or JPEG image"), std::string::npos) << errors;
  EXPECT_NE(errors.find("--reference[0]: 32x32 is under 64 px a side"), std::string::npos)
      << errors;
}

TEST(GenerateCommandTest, BadInputsFailClearly) {
  const std::string model = testing::test_data_dir() + "/tiny-klein/checkpoint";
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(generate({"--model-dir", model, "--prompt", "x", "--height", "65", "--width", "64"}),
            1);
  EXPECT_EQ(generate({"--model-dir", model, "--prompt", "x", "--steps", "0"}), 1);
  EXPECT_EQ(generate({"--model-dir", "/nonexistent/model", "--prompt", "x"}), 1);
  EXPECT_EQ(generate({"--model-dir", model}), 1);  // no prompt
  const std::string errors = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(errors.find("height: 65 is not a positive multiple of 16"), std::string::npos)
      << errors;
  EXPECT_NE(errors.find("--steps: 0 must be at least 1"), std::string::npos) << errors;
  EXPECT_NE(errors.find("/nonexistent/model"), std::string::npos) << errors;
  EXPECT_NE(errors.find("--prompt is required"), std::string::npos) << errors;
}

// --lora FILE[:SCALE] applies adapters in order (the image changes; scale 0 leaves it as
// without); a bad adapter fails naming the flag and the file.
TEST(GenerateCommandTest, LoraAdaptersApplyInOrderAndBadOnesNameTheFlag) {
  testing::TempDir dir;
  const std::string model = testing::test_data_dir() + "/tiny-klein/checkpoint";
  const std::string style =
      testing::test_data_dir() + "/tiny-klein/loras/style_diffusers.safetensors";
  auto run = [&](std::vector<std::string> extra, const std::string& name) {
    std::vector<std::string> words = {"--model-dir", model, "--prompt", "a red fox",
                                      "--height",    "32",  "--width",  "32",
                                      "--steps",     "2",   "--out",    dir.path() + "/" + name};
    words.insert(words.end(), extra.begin(), extra.end());
    ::testing::internal::CaptureStderr();
    const int status = generate(words);
    const std::string err = ::testing::internal::GetCapturedStderr();
    return std::make_pair(status, err);
  };
  ASSERT_EQ(run({}, "plain.png").first, 0);
  ASSERT_EQ(run({"--lora", style + ":0"}, "zero.png").first, 0);
  ASSERT_EQ(run({"--lora", style + ":0.8"}, "style.png").first, 0);
  EXPECT_EQ(read_file(dir.path() + "/zero.png"), read_file(dir.path() + "/plain.png"));
  EXPECT_NE(read_file(dir.path() + "/style.png"), read_file(dir.path() + "/plain.png"));
  const std::string model_file =
      testing::test_data_dir() + "/tiny-klein/checkpoint/transformer/config.json";
  const auto bad = run({"--lora", style, "--lora", model_file}, "bad.png");
  EXPECT_EQ(bad.first, 1);
  EXPECT_NE(bad.second.find("--lora[1]: " + model_file + ": not a safetensors file"),
            std::string::npos)
      << bad.second;
  // A scale whose PEFT scaling overflows float32 (the CLI has no --max-lora-scale): refused.
  const auto huge = run({"--lora", style + ":1e300"}, "huge.png");
  EXPECT_EQ(huge.first, 1);
  EXPECT_NE(huge.second.find("loras[0].scale: "), std::string::npos) << huge.second;
  EXPECT_NE(huge.second.find("'s scaling (lora_alpha "), std::string::npos) << huge.second;
  EXPECT_NE(huge.second.find(") overflow float32"), std::string::npos) << huge.second;
  // With --lora-dir, --lora takes names under it as a server request does: the same image.
  std::filesystem::create_directories(dir.path() + "/loras/styles");
  std::filesystem::copy_file(style, dir.path() + "/loras/styles/ink.safetensors");
  const std::vector<std::string> named = {"--lora-dir", dir.path() + "/loras", "--lora",
                                          "styles/ink:0.8"};
  ASSERT_EQ(run(named, "named.png").first, 0);
  EXPECT_EQ(read_file(dir.path() + "/named.png"), read_file(dir.path() + "/style.png"));
  const auto missing = run({"--lora-dir", dir.path() + "/loras", "--lora", "ink"}, "x.png");
  EXPECT_EQ(missing.first, 1);
  EXPECT_NE(missing.second.find("--lora[0]: no adapter 'ink' under --lora-dir"), std::string::npos)
      << missing.second;
  const auto outside = run({"--lora-dir", dir.path() + "/loras", "--lora", "../x"}, "x.png");
  EXPECT_EQ(outside.first, 1);
  EXPECT_NE(outside.second.find("--lora[0]: ../x: "), std::string::npos) << outside.second;
}

}  // namespace
}  // namespace flux2
