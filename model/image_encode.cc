// PNG / JPEG encoding through stb_image_write; see image_encode.h.
#include "model/image_encode.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STBI_WRITE_NO_STDIO
#include <stb/stb_image_write.h>

#include "absl/strings/str_cat.h"

namespace flux2 {
namespace {

void append_bytes(void* context, void* data, int size) {
  auto* out = static_cast<std::vector<uint8_t>*>(context);
  const auto* bytes = static_cast<const uint8_t*>(data);
  out->insert(out->end(), bytes, bytes + size);
}

absl::Status check_size(std::span<const uint8_t> rgb, int64_t width, int64_t height) {
  if (width <= 0 || height <= 0 || width > (1 << 16) || height > (1 << 16) ||
      static_cast<int64_t>(rgb.size()) != width * height * 3) {
    return absl::InvalidArgumentError(absl::StrCat("image of ", rgb.size(), " bytes is not ",
                                                   width, " x ", height, " RGB"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<uint8_t>> encode_png(std::span<const uint8_t> rgb, int64_t width,
                                                int64_t height) {
  if (absl::Status status = check_size(rgb, width, height); !status.ok()) return status;
  std::vector<uint8_t> out;
  const int ok = stbi_write_png_to_func(append_bytes, &out, static_cast<int>(width),
                                        static_cast<int>(height), 3, rgb.data(),
                                        static_cast<int>(width * 3));
  if (!ok) return absl::InternalError("PNG encoding failed");
  return out;
}

absl::StatusOr<std::vector<uint8_t>> encode_jpeg(std::span<const uint8_t> rgb, int64_t width,
                                                 int64_t height, int quality) {
  if (absl::Status status = check_size(rgb, width, height); !status.ok()) return status;
  if (quality < 1 || quality > 100) return absl::InvalidArgumentError("JPEG quality must be 1..100");
  std::vector<uint8_t> out;
  const int ok = stbi_write_jpg_to_func(append_bytes, &out, static_cast<int>(width),
                                        static_cast<int>(height), 3, rgb.data(), quality);
  if (!ok) return absl::InternalError("JPEG encoding failed");
  return out;
}

}  // namespace flux2
