// PNG, JPEG and WebP encoding: a round trip through stb_image's decoder gives the exact pixels
// back (PNG is lossless), for odd sizes and for images large enough to be deflated in parallel
// chunks; JPEG (stb_image) and WebP (libwebp's decoder) decode to the right size, and a higher
// quality setting gives a larger file with a smaller error.
#include "model/image_encode.h"

#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>

#include <webp/decode.h>

#include <cstdlib>
#include <random>

#include <gtest/gtest.h>

namespace flux2 {
namespace {

std::vector<uint8_t> test_image(int64_t width, int64_t height, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> rgb(static_cast<size_t>(width * height * 3));
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c) {
        // A gradient with noise: compressible but not trivial.
        rgb[(y * width + x) * 3 + c] = static_cast<uint8_t>(x * (c + 1) + y + rng() % 7);
      }
  return rgb;
}

TEST(ImageEncodeTest, PngRoundTripsExactly) {
  for (auto [w, h] :
       {std::pair<int64_t, int64_t>{1, 1}, {17, 5}, {64, 48}, {1024, 768}, {80, 1031}}) {
    const std::vector<uint8_t> rgb = test_image(w, h, static_cast<uint32_t>(w * 31 + h));
    auto png = encode_png(rgb, w, h);
    ASSERT_TRUE(png.ok()) << png.status();
    int dw = 0, dh = 0, channels = 0;
    stbi_uc* decoded =
        stbi_load_from_memory(png->data(), static_cast<int>(png->size()), &dw, &dh, &channels, 3);
    ASSERT_NE(decoded, nullptr) << stbi_failure_reason() << " at " << w << "x" << h;
    EXPECT_EQ(dw, w);
    EXPECT_EQ(dh, h);
    EXPECT_EQ(std::vector<uint8_t>(decoded, decoded + w * h * 3), rgb) << w << "x" << h;
    stbi_image_free(decoded);
    EXPECT_LT(png->size(), rgb.size() + 1024);  // deflate does not blow up the data
  }
}

// Mean absolute difference per value.
double mean_error(const uint8_t* decoded, const std::vector<uint8_t>& rgb) {
  double sum = 0;
  for (size_t i = 0; i < rgb.size(); ++i) sum += std::abs(int{decoded[i]} - int{rgb[i]});
  return sum / static_cast<double>(rgb.size());
}

TEST(ImageEncodeTest, JpegDecodesToTheRightSizeAndQualityOrdersError) {
  const std::vector<uint8_t> rgb = test_image(96, 64, 3);
  std::vector<double> errors;
  std::vector<size_t> sizes;
  for (int quality : {50, 95}) {
    auto jpeg = encode_jpeg(rgb, 96, 64, quality);
    ASSERT_TRUE(jpeg.ok());
    int w = 0, h = 0, channels = 0;
    stbi_uc* decoded =
        stbi_load_from_memory(jpeg->data(), static_cast<int>(jpeg->size()), &w, &h, &channels, 3);
    ASSERT_NE(decoded, nullptr);
    EXPECT_EQ(w, 96);
    EXPECT_EQ(h, 64);
    errors.push_back(mean_error(decoded, rgb));
    sizes.push_back(jpeg->size());
    stbi_image_free(decoded);
  }
  EXPECT_LT(errors[1], errors[0]);
  EXPECT_GT(sizes[1], sizes[0]);
  EXPECT_FALSE(encode_jpeg(rgb, 96, 64, 0).ok());
  EXPECT_FALSE(encode_jpeg(rgb, 96, 64, 101).ok());
}

TEST(ImageEncodeTest, WebpDecodesToTheRightSizeAndQualityOrdersError) {
  const std::vector<uint8_t> rgb = test_image(96, 64, 4);
  std::vector<double> errors;
  std::vector<size_t> sizes;
  for (int quality : {50, 95}) {
    auto webp = encode_webp(rgb, 96, 64, quality);
    ASSERT_TRUE(webp.ok()) << webp.status();
    ASSERT_GE(webp->size(), 12u);
    EXPECT_EQ(std::string(webp->begin(), webp->begin() + 4), "RIFF");
    EXPECT_EQ(std::string(webp->begin() + 8, webp->begin() + 12), "WEBP");
    int w = 0, h = 0;
    uint8_t* decoded = WebPDecodeRGB(webp->data(), webp->size(), &w, &h);
    ASSERT_NE(decoded, nullptr);
    EXPECT_EQ(w, 96);
    EXPECT_EQ(h, 64);
    errors.push_back(mean_error(decoded, rgb));
    sizes.push_back(webp->size());
    WebPFree(decoded);
  }
  EXPECT_LT(errors[1], errors[0]);
  EXPECT_GT(sizes[1], sizes[0]);
  EXPECT_FALSE(encode_webp(rgb, 96, 64, 0).ok());
  const std::vector<uint8_t> wide(static_cast<size_t>(kMaxWebpSide + 1) * 16 * 3);
  EXPECT_EQ(encode_webp(wide, kMaxWebpSide + 1, 16, 90).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ImageEncodeTest, RejectsWrongSizes) {
  const std::vector<uint8_t> rgb(10);
  EXPECT_EQ(encode_png(rgb, 2, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(encode_png(rgb, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace flux2
