// Reference-image decoding (libpng, libjpeg-turbo) and diffusers' preparation; see
// reference_image.h. Tested by tests/host/reference_image_test.cc.
#include "model/reference_image.h"

#include <jpeglib.h>
// jpeglib.h first: jerror.h needs its types.
#include <jerror.h>
#include <png.h>
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb/stb_image_resize.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/base/postprocess.h"
#include "kernels/base/read_file.h"

namespace flux2 {
namespace {

absl::Status field_error(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

bool starts_with(absl::string_view bytes, absl::string_view magic) {
  return bytes.size() >= magic.size() && bytes.substr(0, magic.size()) == magic;
}

absl::Status check_decoded_size(int64_t width, int64_t height, absl::string_view field) {
  if (width <= 0 || height <= 0) return field_error(field, "the image has no pixels");
  if (width * height > kMaxDecodedPixels) {
    return field_error(field, absl::StrCat(width, "x", height, " exceeds the ", kMaxDecodedPixels,
                                           " pixels an image may have"));
  }
  return absl::OkStatus();
}

// ---- PNG (libpng) ------------------------------------------------------------------------------
// libpng reports errors by longjmp: everything between setjmp and the reads is plain data, and the
// C++ objects (the pixel vector) are created before setjmp and only resized after the header.

struct PngSource {
  absl::string_view bytes;
  size_t offset = 0;
  char error[200] = {};
  std::vector<png_bytep> rows;  // owned here, not by the frame that calls setjmp
};

void png_read_bytes(png_structp png, png_bytep out, png_size_t count) {
  auto* source = static_cast<PngSource*>(png_get_io_ptr(png));
  if (source->bytes.size() - source->offset < count) png_error(png, "truncated PNG data");
  std::memcpy(out, source->bytes.data() + source->offset, count);
  source->offset += count;
}

void png_on_error(png_structp png, png_const_charp message) {
  auto* source = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(source->error, sizeof(source->error), "%s", message);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}

// Returns false with source.error set on a libpng error.
bool png_decode(PngSource& source, RgbImage& image, absl::string_view field, absl::Status& status) {
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &source, png_on_error, png_on_warning);
  if (png == nullptr) {
    status = absl::ResourceExhaustedError("libpng: out of memory");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, &source, png_read_bytes);
  png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
  png_read_info(png, info);
  const int64_t width = png_get_image_width(png, info), height = png_get_image_height(png, info);
  status = check_decoded_size(width, height, field);
  if (!status.ok()) {
    png_destroy_read_struct(&png, &info, nullptr);
    return true;
  }
  // As PIL's convert("RGB"): palette and low bit depths expanded, 16 bits to their high byte,
  // gray replicated, alpha dropped (not composited), gAMA / iCCP ignored.
  png_set_expand(png);
  png_set_strip_16(png);
  png_set_strip_alpha(png);
  png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != static_cast<size_t>(width) * 3) {
    png_error(png, "unexpected row layout after conversion to RGB");
  }
  image.width = width;
  image.height = height;
  image.pixels.resize(static_cast<size_t>(width * height * 3));
  source.rows.resize(static_cast<size_t>(height));
  for (int64_t y = 0; y < height; ++y) source.rows[y] = image.pixels.data() + y * width * 3;
  png_read_image(png, source.rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

absl::StatusOr<RgbImage> decode_png(absl::string_view bytes, absl::string_view field) {
  PngSource source;
  source.bytes = bytes;
  RgbImage image;
  absl::Status status;
  if (!png_decode(source, image, field, status)) {
    if (!status.ok()) return status;
    return field_error(field, absl::StrCat("invalid PNG: ", source.error));
  }
  if (!status.ok()) return status;
  return image;
}

// ---- JPEG (libjpeg-turbo, PIL's decoder: islow IDCT, fancy upsampling)
// ---------------------------

struct JpegErrors {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {};
  bool truncated = false;  // libjpeg pads a truncated file with gray and warns; PIL refuses it
};

void jpeg_on_error(j_common_ptr jpeg) {
  auto* errors = reinterpret_cast<JpegErrors*>(jpeg->err);
  (*jpeg->err->format_message)(jpeg, errors->message);
  std::longjmp(errors->jump, 1);
}

void jpeg_on_message(j_common_ptr jpeg, int level) {
  if (level < 0 && jpeg->err->msg_code == JWRN_JPEG_EOF) {
    reinterpret_cast<JpegErrors*>(jpeg->err)->truncated = true;
  }
}

bool jpeg_decode(absl::string_view bytes, RgbImage& image, absl::string_view field,
                 absl::Status& status, JpegErrors& errors) {
  jpeg_decompress_struct jpeg;
  jpeg.err = jpeg_std_error(&errors.manager);
  errors.manager.error_exit = jpeg_on_error;
  errors.manager.emit_message = jpeg_on_message;
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&jpeg);
    return false;
  }
  jpeg_create_decompress(&jpeg);
  jpeg_mem_src(&jpeg, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&jpeg, TRUE);
  status = check_decoded_size(jpeg.image_width, jpeg.image_height, field);
  if (status.ok() && jpeg.jpeg_color_space != JCS_GRAYSCALE && jpeg.jpeg_color_space != JCS_YCbCr &&
      jpeg.jpeg_color_space != JCS_RGB) {
    status = field_error(field, "JPEG color space (CMYK or YCCK) is not supported; send RGB");
  }
  if (!status.ok()) {
    jpeg_destroy_decompress(&jpeg);
    return true;
  }
  jpeg.out_color_space = JCS_RGB;
  jpeg_start_decompress(&jpeg);
  const int64_t width = jpeg.output_width, height = jpeg.output_height;
  image.width = width;
  image.height = height;
  image.pixels.resize(static_cast<size_t>(width * height * 3));
  while (jpeg.output_scanline < jpeg.output_height) {
    JSAMPROW row = image.pixels.data() + static_cast<int64_t>(jpeg.output_scanline) * width * 3;
    jpeg_read_scanlines(&jpeg, &row, 1);
  }
  jpeg_finish_decompress(&jpeg);
  jpeg_destroy_decompress(&jpeg);
  return true;
}

absl::StatusOr<RgbImage> decode_jpeg(absl::string_view bytes, absl::string_view field) {
  JpegErrors errors;
  RgbImage image;
  absl::Status status;
  if (!jpeg_decode(bytes, image, field, status, errors)) {
    return field_error(field, absl::StrCat("invalid JPEG: ", errors.message));
  }
  if (!status.ok()) return status;
  if (errors.truncated) return field_error(field, "truncated JPEG data");
  return image;
}

// The refusals every reference gets: a malformed image, a side under kReferenceMinSide, an aspect
// ratio beyond kReferenceMaxAspect.
absl::Status check_reference_limits(const RgbImage& image, int64_t multiple,
                                    absl::string_view field) {
  const int64_t width = image.width, height = image.height;
  if (static_cast<int64_t>(image.pixels.size()) != width * height * 3 || multiple <= 0) {
    return absl::InternalError(absl::StrCat(field, ": malformed RgbImage"));
  }
  if (width < kReferenceMinSide || height < kReferenceMinSide) {
    return field_error(
        field, absl::StrCat(width, "x", height, " is under ", kReferenceMinSide, " px a side"));
  }
  const double aspect = std::max(static_cast<double>(width) / static_cast<double>(height),
                                 static_cast<double>(height) / static_cast<double>(width));
  if (aspect > kReferenceMaxAspect) {
    return field_error(
        field, absl::StrFormat("aspect ratio %.1f exceeds %g", aspect, kReferenceMaxAspect));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RgbImage> decode_image(absl::string_view bytes, absl::string_view field) {
  if (bytes.empty()) return field_error(field, "empty");
  if (starts_with(bytes, "\x89PNG\r\n\x1a\n")) return decode_png(bytes, field);
  if (starts_with(bytes, "\xff\xd8\xff")) return decode_jpeg(bytes, field);
  return field_error(field, "not a PNG or JPEG image");
}

absl::Status check_prepared_reference(const RgbImage& image, int64_t multiple,
                                      absl::string_view field) {
  if (absl::Status limits = check_reference_limits(image, multiple, field); !limits.ok()) {
    return limits;
  }
  if (image.width % multiple != 0 || image.height % multiple != 0 ||
      image.width * image.height > kReferenceMaxArea) {
    return field_error(
        field, absl::StrCat(image.width, "x", image.height,
                            " is not prepared (prepare_reference: sides multiples of ", multiple,
                            ", at most ", kReferenceMaxArea, " pixels)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RgbImage> prepare_reference(RgbImage image, int64_t multiple,
                                           absl::string_view field) {
  if (absl::Status limits = check_reference_limits(image, multiple, field); !limits.ok()) {
    return limits;
  }
  const int64_t width = image.width, height = image.height;
  if (width * height > kReferenceMaxArea) {
    // diffusers' _resize_to_target_area: int(side * sqrt(area / (w h))), PIL Lanczos.
    const double scale =
        std::sqrt(static_cast<double>(kReferenceMaxArea) / static_cast<double>(width * height));
    const int64_t new_width = static_cast<int64_t>(static_cast<double>(width) * scale);
    const int64_t new_height = static_cast<int64_t>(static_cast<double>(height) * scale);
    RgbImage resized{new_width, new_height,
                     std::vector<uint8_t>(static_cast<size_t>(new_width * new_height * 3))};
    const int ok = stbir_resize_uint8_generic(
        image.pixels.data(), static_cast<int>(width), static_cast<int>(height),
        static_cast<int>(width * 3), resized.pixels.data(), static_cast<int>(new_width),
        static_cast<int>(new_height), static_cast<int>(new_width * 3), 3, STBIR_ALPHA_CHANNEL_NONE,
        0, STBIR_EDGE_CLAMP, STBIR_FILTER_CATMULLROM, STBIR_COLORSPACE_LINEAR, nullptr);
    if (ok == 0) return absl::ResourceExhaustedError(absl::StrCat(field, ": resize failed"));
    image = std::move(resized);
  }
  // Center crop to multiples (Flux2ImageProcessor._resize_and_crop: no resampling).
  const int64_t crop_width = image.width / multiple * multiple;
  const int64_t crop_height = image.height / multiple * multiple;
  if (crop_width == image.width && crop_height == image.height) return image;
  const int64_t left = (image.width - crop_width) / 2, top = (image.height - crop_height) / 2;
  RgbImage cropped{crop_width, crop_height,
                   std::vector<uint8_t>(static_cast<size_t>(crop_width * crop_height * 3))};
  for (int64_t y = 0; y < crop_height; ++y) {
    const uint8_t* src = image.pixels.data() + ((top + y) * image.width + left) * 3;
    std::copy(src, src + crop_width * 3, cropped.pixels.data() + y * crop_width * 3);
  }
  return cropped;
}

absl::StatusOr<RgbImage> load_reference_file(const std::string& path, int64_t multiple,
                                             absl::string_view field) {
  absl::StatusOr<std::string> bytes = read_file(path, field);
  if (!bytes.ok()) return bytes.status();
  return load_reference(*bytes, multiple, field);
}

absl::StatusOr<RgbImage> load_reference(absl::string_view bytes, int64_t multiple,
                                        absl::string_view field) {
  absl::StatusOr<RgbImage> image = decode_image(bytes, field);
  if (!image.ok()) return image.status();
  return prepare_reference(*std::move(image), multiple, field);
}

std::vector<float> reference_to_unit_range(const RgbImage& image) {
  std::vector<float> out(image.pixels.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = u8_to_unit(image.pixels[i]);
  return out;
}

}  // namespace flux2
