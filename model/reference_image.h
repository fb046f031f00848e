// Reference images for editing, as diffusers' Flux2ImageProcessor prepares them: PNG or JPEG bytes
// -> 8-bit RGB (alpha dropped, gamma chunks ignored, as PIL's convert("RGB")) -> refused under
// 64 px a side or beyond 8:1 -> resized to 1024x1024 px of area when larger (stb_image_resize,
// Catmull-Rom, where PIL uses Lanczos: README.md "How references are prepared" gives the measured
// difference) -> center-cropped
// to multiples of 16. Tested by tests/host/reference_image_test.cc (goldens, a corpus of corrupt
// and truncated files) and `flux2 check-golden --only vae_encode`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace flux2 {

// 8-bit RGB pixels, height x width x 3, row-major.
struct RgbImage {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> pixels;
};

// diffusers' limits on a reference (Flux2ImageProcessor.check_image_input and the pipelines).
inline constexpr int64_t kReferenceMinSide = 64;
inline constexpr double kReferenceMaxAspect = 8.0;
inline constexpr int64_t kReferenceMaxArea = 1024 * 1024;  // larger ones are resized to this area
// Decoding refuses images of more pixels than this before allocating them (a small PNG can claim
// a huge size): 8192 x 8192.
inline constexpr int64_t kMaxDecodedPixels = int64_t{8192} * 8192;

// Decodes PNG or JPEG bytes (told apart by their signature) into 8-bit RGB. Errors are
// InvalidArgument with messages that start with `field` ("reference_images[1]: not a PNG or JPEG
// image", "...: truncated PNG data"). Safe on any bytes: never crashes, never allocates more than
// kMaxDecodedPixels x 3 for the pixels.
absl::StatusOr<RgbImage> decode_image(absl::string_view bytes, absl::string_view field);

// The pipeline's preparation of a decoded reference: InvalidArgument naming `field` when a side is
// under kReferenceMinSide ("32x32 is under 64 px a side") or the aspect ratio exceeds
// kReferenceMaxAspect ("aspect ratio 12.0 exceeds 8"); then the resize to kReferenceMaxArea when
// larger (diffusers' int(side x sqrt(area / (w h))) sizes) and the center crop to multiples of
// `multiple` (left = (w - w') / 2, top = (h - h') / 2). A prepared image passes unchanged.
absl::StatusOr<RgbImage> prepare_reference(RgbImage image, int64_t multiple,
                                           absl::string_view field);

// decode_image, then prepare_reference.
absl::StatusOr<RgbImage> load_reference(absl::string_view bytes, int64_t multiple,
                                        absl::string_view field);
// load_reference of a file's bytes; NotFound "field: cannot read PATH" when it cannot be read.
absl::StatusOr<RgbImage> load_reference_file(const std::string& path, int64_t multiple,
                                             absl::string_view field);

// OK when `image` is what prepare_reference returns for it (within the limits, sides multiples
// of `multiple`, at most kReferenceMaxArea pixels), without copying it; else InvalidArgument
// naming `field` (the refusals of prepare_reference, or "WxH is not prepared").
absl::Status check_prepared_reference(const RgbImage& image, int64_t multiple,
                                      absl::string_view field);

// The image as the VAE encoder reads it: [H, W, 3] floats in [-1, 1], row-major (diffusers: x /
// 255, then 2x - 1, in float32: u8_to_unit). The pipeline has Backend::from_rgb8 make them on the
// device; the golden check and the tests use this.
std::vector<float> reference_to_unit_range(const RgbImage& image);

}  // namespace flux2
