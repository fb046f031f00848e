// Image format names; see request.h. Tested by tests/server/validate_test.cc.
#include "server/serving/request.h"

namespace flux2::server {

absl::string_view image_mime_type(ImageFormat format) {
  switch (format) {
    case ImageFormat::kPng:
      return "image/png";
    case ImageFormat::kJpeg:
      return "image/jpeg";
    case ImageFormat::kWebp:
      return "image/webp";
  }
  return "application/octet-stream";
}

absl::string_view image_format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kWebp:
      return "WebP";
  }
  return "image";
}

}  // namespace flux2::server
