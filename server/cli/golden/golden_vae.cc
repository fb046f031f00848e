// check-golden part "vae": vae.decode of every case of vae_decode.safetensors (post_quant_conv +
// decoder on an unpatchified latent), comparing the image by relative L2 error. The vectors are
// NCHW ([1, 32, h, w] latents, [1, 3, H, W] image); the decoder is NHWC. With --quality high the
// backend runs its quality=high decoder paths. See golden_check.h.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "model/vae_decoder.h"
#include "server/cli/golden/golden_check.h"

namespace flux2 {
namespace {

constexpr char kFile[] = "vae_decode.safetensors";

absl::Status run_case(const GoldenContext& context, const VaeDecoder& vae,
                      const SafetensorsFile& vectors, const std::string& name,
                      GoldenReport& report) {
  Backend& be = *context.backend;
  const SafetensorsEntry* latents_entry = vectors.find(name + ".latents");
  const SafetensorsEntry* image_entry = vectors.find(name + ".image");
  if (image_entry == nullptr) return absl::NotFoundError(absl::StrCat(name, ".image is missing"));
  const Shape& ls = latents_entry->shape;
  const Shape& is = image_entry->shape;
  if (ls.size() != 4 || ls[0] != 1 || is.size() != 4 || is[0] != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected latents [1, C, h, w] and image [1, 3, H, W], got ", shape_string(ls),
                     " and ", shape_string(is)));
  }
  const int64_t channels = ls[1], h = ls[2], w = ls[3];
  FLUX_ASSIGN_OR_RETURN(std::vector<float> latents, read_f32(vectors, latents_entry->name));
  FLUX_ASSIGN_OR_RETURN(std::vector<float> reference, read_f32(vectors, image_entry->name));

  FLUX_ASSIGN_OR_RETURN(Tensor input,
                        upload_values(be, chw_to_hwc(latents, channels, h, w), {h, w, channels}));
  FLUX_ASSIGN_OR_RETURN(Tensor image, vae.decode(input));  // [H, W, 3]
  if (image.rank() != 3 || image.dim(0) != is[2] || image.dim(1) != is[3] ||
      image.dim(2) != is[1]) {
    return absl::InternalError(
        absl::StrCat("decoded ", image.describe(), ", reference ", shape_string(is)));
  }
  FLUX_ASSIGN_OR_RETURN(std::vector<float> pixels, download_values(be, image));
  report.compare(kFile, name, "image", hwc_to_chw(pixels, is[1], is[2], is[3]), reference,
                 context.tolerance(absl::StrCat("vae_decode.", name, ".image")));
  return absl::OkStatus();
}

}  // namespace

void check_golden_vae(const GoldenContext& context, GoldenReport& report) {
  auto vectors = SafetensorsFile::open(context.dir + "/" + kFile);
  if (!vectors.ok()) return report.fail(kFile, "-", vectors.status().message());
  auto checkpoint = ComponentWeights::open(context.checkpoint_dir() + "/vae");
  if (!checkpoint.ok()) return report.fail(kFile, "-", checkpoint.status().message());
  auto vae = VaeDecoder::load(*context.backend, *checkpoint);
  if (!vae.ok()) return report.fail(kFile, "-", vae.status().message());
  // quality=high: the fused-bias convolutions.
  const RequestScope request(*context.backend, {context.quality});
  for_each_case(**vectors, kFile, "latents", report, [&](const std::string& name) {
    return run_case(context, **vae, **vectors, name, report);
  });
}

}  // namespace flux2
