// flux2_prepare_reference IN OUT.png: an image prepared as the server prepares a reference
// (model/reference_image.h: decode, refusals, resize to 1024x1024 px of area, center crop to
// multiples of 16), written as PNG. tests/gpu/make_editing_references.py compares it with PIL's
// Lanczos resize (what diffusers uses) on the GPU machine, where PIL is installed.
#include <cstdio>
#include <fstream>
#include <string>

#include "model/image_encode.h"
#include "model/reference_image.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: flux2_prepare_reference IN OUT.png\n");
    return 2;
  }
  auto image = flux2::load_reference_file(argv[1], 16, argv[1]);
  if (!image.ok()) {
    std::fprintf(stderr, "%s\n", std::string(image.status().message()).c_str());
    return 1;
  }
  auto png = flux2::encode_png(image->pixels, image->width, image->height);
  if (!png.ok()) return 1;
  std::ofstream out(argv[2], std::ios::binary);
  out.write(reinterpret_cast<const char*>(png->data()), static_cast<std::streamsize>(png->size()));
  return out ? 0 : 1;
}
