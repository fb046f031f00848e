// Encoding RGB pixels as PNG bytes (zlib, parallel), JPEG bytes (libjpeg-turbo, 4:4:4) and lossy
// WebP bytes (libwebp). Tested by tests/host/image_encode_test.cc (round trips through stb_image
// and libwebp's decoder).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace flux2 {

// rgb: height x width x 3 bytes, row-major.
absl::StatusOr<std::vector<uint8_t>> encode_png(std::span<const uint8_t> rgb, int64_t width,
                                                int64_t height);
// quality 1..100 (libjpeg's scale), no chroma subsampling.
absl::StatusOr<std::vector<uint8_t>> encode_jpeg(std::span<const uint8_t> rgb, int64_t width,
                                                 int64_t height, int quality);
// Lossy WebP at quality 1..100 (libwebp's scale); sides at most kMaxWebpSide.
absl::StatusOr<std::vector<uint8_t>> encode_webp(std::span<const uint8_t> rgb, int64_t width,
                                                 int64_t height, int quality);
// WebP's largest side (the VP8 frame header holds 14 bits).
constexpr int64_t kMaxWebpSide = 16383;
// JPEG's largest side (libjpeg's JPEG_MAX_DIMENSION).
constexpr int64_t kMaxJpegSide = 65500;

}  // namespace flux2
