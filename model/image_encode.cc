// PNG encoding with zlib (Sub-filtered rows deflated at level 1 in parallel chunks joined into one
// zlib stream, as pigz does), JPEG through libjpeg-turbo and WebP through libwebp; see
// image_encode.h.
#include "model/image_encode.h"

#include <jpeglib.h>
#include <webp/encode.h>
#include <zlib.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "kernels/base/parallel.h"

namespace flux2 {
namespace {

absl::Status check_size(std::span<const uint8_t> rgb, int64_t width, int64_t height) {
  if (width <= 0 || height <= 0 || width > (1 << 16) || height > (1 << 16) ||
      static_cast<int64_t>(rgb.size()) != width * height * 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("image of ", rgb.size(), " bytes is not ", width, " x ", height, " RGB"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

// Appends one PNG chunk: length, type, data, CRC32(type + data).
void put_chunk(std::vector<uint8_t>& out, const char type[4], const uint8_t* data, size_t size) {
  put_u32(out, static_cast<uint32_t>(size));
  const size_t type_at = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data, data + size);
  put_u32(out, static_cast<uint32_t>(crc32(0, out.data() + type_at, static_cast<uInt>(size + 4))));
}

// Raw deflate of `size` bytes, ending with a full flush (byte-aligned, not final) or the final
// block.
absl::StatusOr<std::vector<uint8_t>> deflate_piece(const uint8_t* data, size_t size, bool last) {
  z_stream stream{};
  // Level 1: images compress about as well at level 1 as at 6 and several times faster.
  if (deflateInit2(&stream, 1, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return absl::InternalError("deflateInit2 failed");
  }
  std::vector<uint8_t> out(deflateBound(&stream, static_cast<uLong>(size)) + 16);
  stream.next_in = const_cast<Bytef*>(data);
  stream.avail_in = static_cast<uInt>(size);
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  const int result = deflate(&stream, last ? Z_FINISH : Z_FULL_FLUSH);
  const size_t written = out.size() - stream.avail_out;
  deflateEnd(&stream);
  if (result != (last ? Z_STREAM_END : Z_OK) || stream.avail_in != 0)
    return absl::InternalError("deflate failed");
  out.resize(written);
  return out;
}

}  // namespace

absl::StatusOr<std::vector<uint8_t>> encode_png(std::span<const uint8_t> rgb, int64_t width,
                                                int64_t height) {
  if (absl::Status status = check_size(rgb, width, height); !status.ok()) return status;
  // Filtered scanlines: filter type 1 (Sub) then each byte minus the one 3 bytes (a pixel) left.
  const int64_t stride = width * 3, line = stride + 1;
  std::vector<uint8_t> filtered(static_cast<size_t>(line * height));
  parallel_for(height, 16, [&](int64_t begin, int64_t end) {
    for (int64_t y = begin; y < end; ++y) {
      const uint8_t* src = rgb.data() + y * stride;
      uint8_t* dst = filtered.data() + y * line;
      dst[0] = 1;
      for (int64_t i = 0; i < stride; ++i)
        dst[1 + i] = static_cast<uint8_t>(src[i] - (i >= 3 ? src[i - 3] : 0));
    }
  });
  // Deflate row chunks independently; pieces concatenate into one stream (each ends on a full
  // flush).
  const int64_t chunks =
      std::max<int64_t>(1, std::min<int64_t>(height / 32, parallel_thread_count() * 2));
  std::vector<absl::StatusOr<std::vector<uint8_t>>> pieces(static_cast<size_t>(chunks));
  std::vector<uLong> adlers(static_cast<size_t>(chunks));
  parallel_for(chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t y0 = height * c / chunks, y1 = height * (c + 1) / chunks;
      const uint8_t* data = filtered.data() + y0 * line;
      const size_t size = static_cast<size_t>((y1 - y0) * line);
      pieces[c] = deflate_piece(data, size, c == chunks - 1);
      adlers[c] = adler32(adler32(0, nullptr, 0), data, static_cast<uInt>(size));
    }
  });
  std::vector<uint8_t> zlib = {0x78, 0x01};  // deflate, 32 KiB window, fastest-level hint
  uLong adler = adler32(0, nullptr, 0);
  for (int64_t c = 0; c < chunks; ++c) {
    if (!pieces[c].ok()) return pieces[c].status();
    zlib.insert(zlib.end(), pieces[c]->begin(), pieces[c]->end());
    const int64_t rows = height * (c + 1) / chunks - height * c / chunks;
    adler = adler32_combine(adler, adlers[c], static_cast<z_off_t>(rows * line));
  }
  put_u32(zlib, static_cast<uint32_t>(adler));

  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> header;
  put_u32(header, static_cast<uint32_t>(width));
  put_u32(header, static_cast<uint32_t>(height));
  header.insert(header.end(),
                {8, 2, 0, 0, 0});  // 8-bit RGB, deflate, adaptive filters, no interlace
  put_chunk(png, "IHDR", header.data(), header.size());
  put_chunk(png, "IDAT", zlib.data(), zlib.size());
  put_chunk(png, "IEND", nullptr, 0);
  return png;
}

namespace {

// libjpeg reports errors by calling error_exit, which must not return: it longjmps back to
// encode_jpeg. Between setjmp and the library calls only plain data lives on the stack.
struct JpegEncodeErrors {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
};

[[noreturn]] void jpeg_encode_error(j_common_ptr jpeg) {
  std::longjmp(reinterpret_cast<JpegEncodeErrors*>(jpeg->err)->jump, 1);
}

}  // namespace

absl::StatusOr<std::vector<uint8_t>> encode_jpeg(std::span<const uint8_t> rgb, int64_t width,
                                                 int64_t height, int quality) {
  if (absl::Status status = check_size(rgb, width, height); !status.ok()) return status;
  if (quality < 1 || quality > 100)
    return absl::InvalidArgumentError("JPEG quality must be 1..100");
  static_assert(kMaxJpegSide == JPEG_MAX_DIMENSION);
  if (width > kMaxJpegSide || height > kMaxJpegSide)
    return absl::InvalidArgumentError(absl::StrCat("JPEG sides are at most ", kMaxJpegSide));
  jpeg_compress_struct jpeg;
  JpegEncodeErrors errors;
  jpeg.err = jpeg_std_error(&errors.manager);
  errors.manager.error_exit = jpeg_encode_error;
  unsigned char* buffer = nullptr;  // jpeg_mem_dest (re)allocates it with malloc
  unsigned long size = 0;           // NOLINT(runtime/int): libjpeg's type
  if (setjmp(errors.jump)) {
    jpeg_destroy_compress(&jpeg);
    std::free(buffer);
    return absl::InternalError("JPEG encoding failed");
  }
  jpeg_create_compress(&jpeg);
  jpeg_mem_dest(&jpeg, &buffer, &size);
  jpeg.image_width = static_cast<JDIMENSION>(width);
  jpeg.image_height = static_cast<JDIMENSION>(height);
  jpeg.input_components = 3;
  jpeg.in_color_space = JCS_RGB;
  jpeg_set_defaults(&jpeg);
  jpeg_set_quality(&jpeg, quality, TRUE);
  // 4:4:4: no chroma subsampling (generated images have sharp colour edges), and the bound of
  // request_validation.cc encoded_image_bound_bytes assumes it.
  for (int c = 0; c < 3; ++c) {
    jpeg.comp_info[c].h_samp_factor = 1;
    jpeg.comp_info[c].v_samp_factor = 1;
  }
  jpeg_start_compress(&jpeg, TRUE);
  const size_t stride = static_cast<size_t>(width) * 3;
  while (jpeg.next_scanline < jpeg.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(rgb.data() + jpeg.next_scanline * stride);
    jpeg_write_scanlines(&jpeg, &row, 1);
  }
  jpeg_finish_compress(&jpeg);
  jpeg_destroy_compress(&jpeg);
  std::vector<uint8_t> out(buffer, buffer + size);
  std::free(buffer);
  return out;
}

absl::StatusOr<std::vector<uint8_t>> encode_webp(std::span<const uint8_t> rgb, int64_t width,
                                                 int64_t height, int quality) {
  if (absl::Status status = check_size(rgb, width, height); !status.ok()) return status;
  if (quality < 1 || quality > 100)
    return absl::InvalidArgumentError("WebP quality must be 1..100");
  if (width > kMaxWebpSide || height > kMaxWebpSide)
    return absl::InvalidArgumentError(absl::StrCat("WebP sides are at most ", kMaxWebpSide));
  uint8_t* buffer = nullptr;
  const size_t size =
      WebPEncodeRGB(rgb.data(), static_cast<int>(width), static_cast<int>(height),
                    static_cast<int>(width * 3), static_cast<float>(quality), &buffer);
  if (size == 0 || buffer == nullptr) return absl::InternalError("WebP encoding failed");
  std::vector<uint8_t> out(buffer, buffer + size);
  WebPFree(buffer);
  return out;
}

}  // namespace flux2
