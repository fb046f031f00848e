// Encoding RGB pixels as PNG bytes (zlib, parallel) and JPEG bytes (stb_image_write).
// Tested by tests/host/image_encode_test.cc (round trip through stb_image).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace flux2 {

// rgb: height x width x 3 bytes, row-major.
absl::StatusOr<std::vector<uint8_t>> encode_png(std::span<const uint8_t> rgb, int64_t width,
                                                int64_t height);
// quality 1..100
absl::StatusOr<std::vector<uint8_t>> encode_jpeg(std::span<const uint8_t> rgb, int64_t width,
                                                 int64_t height, int quality);

}  // namespace flux2
