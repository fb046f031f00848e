// Reference-image decoding and preparation (model/reference_image.h): PNG variants (gray, alpha,
// 16-bit via libpng's transforms), JPEG, every refusal naming its field, diffusers' resize and crop
// sizes, and a corpus of truncated and bit-flipped files that must each give OK or
// InvalidArgument (run under ASan/UBSan by the sanitizer job).
#include <gtest/gtest.h>
#include <zlib.h>

#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

// stb_image_write is this test's PNG writer of odd inputs (the library itself encodes with zlib,
// libjpeg-turbo and libwebp).
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STBI_WRITE_NO_STDIO
#include <stb/stb_image_write.h>

#include "kernels/cpu/cpu_backend.h"
#include "model/image_encode.h"
#include "model/reference_image.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

std::vector<uint8_t> gradient(int64_t width, int64_t height, int channels) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width * height * channels));
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x)
      for (int c = 0; c < channels; ++c)
        pixels[(y * width + x) * channels + c] =
            static_cast<uint8_t>((x * 3 + y * 5 + c * 70) % 256);
  return pixels;
}

std::string as_string(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::string png_bytes(const std::vector<uint8_t>& pixels, int64_t width, int64_t height,
                      int channels) {
  std::string out;
  stbi_write_png_to_func(
      [](void* context, void* data, int size) {
        static_cast<std::string*>(context)->append(static_cast<const char*>(data), size);
      },
      &out, static_cast<int>(width), static_cast<int>(height), channels, pixels.data(),
      static_cast<int>(width * channels));
  return out;
}

std::string rgb_png(int64_t width, int64_t height) {
  return as_string(encode_png(gradient(width, height, 3), width, height).value());
}

std::string rgb_jpeg(int64_t width, int64_t height) {
  return as_string(encode_jpeg(gradient(width, height, 3), width, height, 95).value());
}

TEST(ReferenceImageTest, DecodesRgbPngExactly) {
  const std::vector<uint8_t> pixels = gradient(70, 66, 3);
  const absl::StatusOr<RgbImage> image =
      decode_image(as_string(encode_png(pixels, 70, 66).value()), "reference_images[0]");
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->width, 70);
  EXPECT_EQ(image->height, 66);
  EXPECT_EQ(image->pixels, pixels);
}

// As PIL's convert("RGB"): gray replicated, alpha dropped (not composited).
TEST(ReferenceImageTest, GrayAndAlphaPngsBecomeRgb) {
  const std::vector<uint8_t> gray = gradient(64, 64, 1), gray_alpha = gradient(64, 64, 2),
                             rgba = gradient(64, 64, 4);
  for (const auto& [channels, pixels] :
       {std::pair{1, gray}, std::pair{2, gray_alpha}, std::pair{4, rgba}}) {
    const absl::StatusOr<RgbImage> image =
        decode_image(png_bytes(pixels, 64, 64, channels), "reference_images[0]");
    ASSERT_TRUE(image.ok()) << image.status();
    for (int64_t p = 0; p < 64 * 64; ++p) {
      for (int c = 0; c < 3; ++c) {
        const uint8_t expected = channels <= 2 ? pixels[p * channels] : pixels[p * 4 + c];
        ASSERT_EQ(image->pixels[p * 3 + c], expected) << channels << " channels, pixel " << p;
      }
    }
  }
}

TEST(ReferenceImageTest, DecodesJpegCloseToTheOriginal) {
  const std::vector<uint8_t> pixels = gradient(96, 80, 3);
  const absl::StatusOr<RgbImage> image =
      decode_image(as_string(encode_jpeg(pixels, 96, 80, 95).value()), "reference_images[0]");
  ASSERT_TRUE(image.ok()) << image.status();
  ASSERT_EQ(image->pixels.size(), pixels.size());
  double total = 0;
  for (size_t i = 0; i < pixels.size(); ++i) total += std::abs(image->pixels[i] - pixels[i]);
  // Quality 95 on a smooth gradient: well under 3 levels on average (it is lossy, not wrong).
  EXPECT_LT(total / pixels.size(), 3.0);
}

TEST(ReferenceImageTest, RefusalsNameTheField) {
  const auto message = [](const absl::StatusOr<RgbImage>& result) {
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(result.status().message());
  };
  EXPECT_EQ(message(decode_image("", "reference_images[2]")), "reference_images[2]: empty");
  EXPECT_EQ(message(decode_image("GIF89a....", "reference_images[1]")),
            "reference_images[1]: not a PNG or JPEG image");
  const std::string png = rgb_png(64, 64);
  EXPECT_EQ(message(decode_image(png.substr(0, png.size() / 2), "reference_images[1]")),
            "reference_images[1]: invalid PNG: truncated PNG data");
  const std::string jpeg = rgb_jpeg(64, 64);
  EXPECT_EQ(message(decode_image(jpeg.substr(0, jpeg.size() / 2), "reference_images[0]")),
            "reference_images[0]: truncated JPEG data");
  EXPECT_EQ(message(load_reference(rgb_png(32, 32), 16, "reference_images[1]")),
            "reference_images[1]: 32x32 is under 64 px a side");
  EXPECT_EQ(message(load_reference(rgb_png(768, 64), 16, "reference_images[0]")),
            "reference_images[0]: aspect ratio 12.0 exceeds 8");
}

// A PNG whose header claims 100000 x 100000 pixels is refused before anything is allocated.
TEST(ReferenceImageTest, RefusesHugeClaimedSizes) {
  std::string png = rgb_png(64, 64);
  // IHDR: type at byte 12, width and height (big-endian) at 16 and 20, its CRC (over type and
  // data) at 29.
  const auto put32 = [&](size_t at, uint32_t value) {
    for (int i = 0; i < 4; ++i) png[at + i] = static_cast<char>((value >> (24 - 8 * i)) & 0xff);
  };
  put32(16, 100000);
  put32(20, 100000);
  put32(29, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(png.data() + 12), 17)));
  const absl::StatusOr<RgbImage> image = decode_image(png, "reference_images[0]");
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(image.status().message(),
            "reference_images[0]: 100000x100000 exceeds the 67108864 pixels an image may have");
}

// diffusers: center crop to multiples of 16, left = (w - w') / 2, top = (h - h') / 2.
TEST(ReferenceImageTest, CropsToMultiplesAroundTheCenter) {
  const std::vector<uint8_t> pixels = gradient(100, 72, 3);
  const absl::StatusOr<RgbImage> image =
      load_reference(as_string(encode_png(pixels, 100, 72).value()), 16, "reference_images[0]");
  ASSERT_TRUE(image.ok()) << image.status();
  ASSERT_EQ(image->width, 96);
  ASSERT_EQ(image->height, 64);
  for (int64_t y = 0; y < 64; ++y)
    for (int64_t x = 0; x < 96 * 3; ++x)
      ASSERT_EQ(image->pixels[y * 96 * 3 + x], pixels[((y + 4) * 100 + 2) * 3 + x]);
  // A prepared image passes unchanged.
  const absl::StatusOr<RgbImage> again = prepare_reference(*image, 16, "reference_images[0]");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->pixels, image->pixels);
}

// Over 1024 x 1024 px of area: diffusers' sizes int(side x sqrt(area / (w h))), then the crop;
// a constant image stays constant (the filter's weights sum to one).
TEST(ReferenceImageTest, ResizesLargeImagesToTheArea) {
  const int64_t width = 2000, height = 1100;
  RgbImage big{width, height, std::vector<uint8_t>(static_cast<size_t>(width * height * 3), 77)};
  const absl::StatusOr<RgbImage> image = prepare_reference(big, 16, "reference_images[0]");
  ASSERT_TRUE(image.ok()) << image.status();
  const double scale = std::sqrt(1024.0 * 1024.0 / (width * height));
  EXPECT_EQ(image->width, static_cast<int64_t>(width * scale) / 16 * 16);    // 1380 -> 1376
  EXPECT_EQ(image->height, static_cast<int64_t>(height * scale) / 16 * 16);  // 759 -> 752
  for (uint8_t value : image->pixels) ASSERT_EQ(value, 77);
}

TEST(ReferenceImageTest, UnitRangeAsDiffusers) {
  const RgbImage image{1, 1, {0, 128, 255}};
  const std::vector<float> unit = reference_to_unit_range(image);
  EXPECT_EQ(unit[0], -1.0f);
  EXPECT_EQ(unit[1], 2.0f * (128.0f / 255.0f) - 1.0f);
  EXPECT_EQ(unit[2], 1.0f);
}

// The pipeline's route: the bytes into a backend tensor by from_rgb8, every level as above.
TEST(ReferenceImageTest, FromRgb8GivesTheUnitRangeOfEveryLevel) {
  RgbImage image{16, 16, std::vector<uint8_t>(768)};
  for (size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = static_cast<uint8_t>(i * 7);
  CpuBackend backend;
  Tensor pixels = backend.empty(DType::kF32, {16, 16, 3}).value();
  ASSERT_TRUE(backend.from_rgb8(image.pixels.data(), pixels).ok());
  EXPECT_EQ(testing::download(backend, pixels), reference_to_unit_range(image));
  const absl::Status strided = backend.from_rgb8(image.pixels.data(), pixels.col_slice(0, 2));
  EXPECT_EQ(strided.code(), absl::StatusCode::kInvalidArgument) << strided;
}

// The decoders on hostile bytes: every prefix of a PNG and a JPEG, and 3000 copies with random
// bytes overwritten. Each must give OK or InvalidArgument naming the field; a crash, a hang or
// another code fails (ASan/UBSan in the sanitizer job catch memory errors on the way).
TEST(ReferenceImageTest, CorruptAndTruncatedCorpus) {
  const std::string field = "reference_images[3]";
  std::vector<std::string> corpus;
  const std::string golden_path =
      testing::test_data_dir() + "/tiny-klein/references/ref2_72x100.png";
  std::ifstream in(golden_path, std::ios::binary);
  ASSERT_TRUE(in) << golden_path;
  const std::string golden((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const std::string& file :
       {golden, rgb_jpeg(80, 64), png_bytes(gradient(64, 64, 4), 64, 64, 4)}) {
    for (size_t length = 0; length < file.size(); length += 7)
      corpus.push_back(file.substr(0, length));
    std::mt19937 rng(17);
    for (int copy = 0; copy < 1000; ++copy) {
      std::string damaged = file;
      const int flips = 1 + static_cast<int>(rng() % 8);
      for (int f = 0; f < flips; ++f) damaged[rng() % damaged.size()] = static_cast<char>(rng());
      corpus.push_back(damaged);
    }
  }
  int decoded = 0;
  for (const std::string& bytes : corpus) {
    const absl::StatusOr<RgbImage> image = load_reference(bytes, 16, field);
    if (image.ok()) {
      ++decoded;
      EXPECT_EQ(image->pixels.size(), static_cast<size_t>(image->width * image->height * 3));
      continue;
    }
    ASSERT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument) << image.status();
    ASSERT_EQ(image.status().message().substr(0, field.size()), field) << image.status();
  }
  // Some damaged copies still decode (a flipped pixel byte), most are refused.
  EXPECT_GT(decoded, 0);
  EXPECT_LT(decoded, static_cast<int>(corpus.size()));
}

}  // namespace
}  // namespace flux2
