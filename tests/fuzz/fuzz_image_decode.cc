// libFuzzer target: the reference-image decoders (libpng, libjpeg-turbo) and the preparation
// (resize, center crop) on arbitrary bytes. Run by tests/fuzz/run_fuzzers.sh (seeds:
// corpus/image_decode: small PNGs and JPEGs).
#include "model/reference_image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<flux2::RgbImage> image = flux2::decode_image(
      absl::string_view(reinterpret_cast<const char*>(data), size), "reference_images[0]");
  if (image.ok()) (void)flux2::prepare_reference(std::move(*image), 16, "reference_images[0]");
  return 0;
}
