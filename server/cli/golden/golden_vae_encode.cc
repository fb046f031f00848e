// check-golden part "vae_encode": the editing pipeline's reference encoding, case by case of
// vae_encode_cases.json: the PNG decoded and prepared (crop to multiples of 16) must give the
// golden `image` exactly (8-bit pixels / 127.5 - 1), then the VAE encoder's posterior mean
// `latent_mean` and the normalised, patchified `image_latents` by relative L2 error. See
// golden_check.h.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/base/status.h"
#include "model/checkpoint.h"
#include "model/json_util.h"
#include "model/reference_image.h"
#include "model/safetensors.h"
#include "model/vae_encoder.h"
#include "server/cli/golden/golden_check.h"

namespace flux2 {
namespace {

constexpr char kFile[] = "vae_encode.safetensors";
constexpr int64_t kPixelMultiple = 16;  // the editing pipeline's crop (vae_scale_factor x 2)

absl::Status run_case(const GoldenContext& context, const VaeEncoder& encoder,
                      const nlohmann::json& item, const SafetensorsFile& vectors,
                      const std::string& name, GoldenReport& report) {
  Backend& be = *context.backend;
  const std::string path = context.dir + "/" + item.at("reference").get<std::string>();
  FLUX_ASSIGN_OR_RETURN(RgbImage reference, load_reference_file(path, kPixelMultiple, path));
  const int64_t height = reference.height, width = reference.width;
  if (height != item.at("height").get<int64_t>() || width != item.at("width").get<int64_t>()) {
    report.fail(kFile, name,
                absl::StrFormat("prepared %dx%d, expected %dx%d", height, width,
                                item.at("height").get<int64_t>(), item.at("width").get<int64_t>()));
    return absl::OkStatus();
  }
  // The preprocessing is exact in float32: the same 8-bit values, the same two float32 ops.
  const std::vector<float> pixels = reference_to_unit_range(reference);  // [H, W, 3]
  FLUX_ASSIGN_OR_RETURN(std::vector<float> golden_image, read_f32(vectors, name + ".image"));
  const std::vector<float> golden_hwc = chw_to_hwc(golden_image, 3, height, width);
  int64_t differing = 0;
  for (size_t i = 0; i < pixels.size() && i < golden_hwc.size(); ++i) {
    differing += pixels[i] != golden_hwc[i];
  }
  report.record(differing == 0 && pixels.size() == golden_hwc.size(), kFile, name, "image",
                absl::StrCat(differing, " values differ (decode + crop + scale must be exact)"));

  // On the backend as the pipeline makes it: the bytes, scaled there (Backend::from_rgb8).
  FLUX_ASSIGN_OR_RETURN(Tensor image, be.empty(be.activation_dtype(), {height, width, 3}));
  FLUX_RETURN_IF_ERROR(be.from_rgb8(reference.pixels.data(), image));
  FLUX_ASSIGN_OR_RETURN(Tensor moments, encoder.encode(image));  // [h8, w8, 2 Cl]
  const int64_t latent = encoder.config().latent_channels;
  FLUX_ASSIGN_OR_RETURN(std::vector<float> moment_values, download_values(be, moments));
  // latent_mean [1, Cl, h8, w8]: the first Cl channels of each pixel.
  const int64_t h8 = moments.dim(0), w8 = moments.dim(1), cm = moments.dim(2);
  std::vector<float> mean(static_cast<size_t>(latent * h8 * w8));
  for (int64_t ch = 0; ch < latent; ++ch)
    for (int64_t p = 0; p < h8 * w8; ++p) mean[ch * h8 * w8 + p] = moment_values[p * cm + ch];
  FLUX_ASSIGN_OR_RETURN(std::vector<float> golden_mean, read_f32(vectors, name + ".latent_mean"));
  report.compare(kFile, name, "latent_mean", mean, golden_mean,
                 context.tolerance(absl::StrCat("vae_encode.", name, ".latent_mean")));

  FLUX_ASSIGN_OR_RETURN(Tensor tokens, encoder.encode_tokens(image));  // [h w, 4 Cl]
  FLUX_ASSIGN_OR_RETURN(std::vector<float> token_values, download_values(be, tokens));
  // image_latents [1, 4 Cl, h, w] (NCHW of the packed channels).
  const std::vector<float> latents = hwc_to_chw(token_values, tokens.cols(), tokens.rows(), 1);
  FLUX_ASSIGN_OR_RETURN(std::vector<float> golden_latents,
                        read_f32(vectors, name + ".image_latents"));
  report.compare(kFile, name, "image_latents", latents, golden_latents,
                 context.tolerance(absl::StrCat("vae_encode.", name, ".image_latents")));
  return absl::OkStatus();
}

}  // namespace

void check_golden_vae_encode(const GoldenContext& context, GoldenReport& report) {
  auto cases = read_json_file(context.dir + "/vae_encode_cases.json");
  if (!cases.ok()) return report.fail("vae_encode_cases.json", "-", cases.status().message());
  auto vectors = SafetensorsFile::open(context.dir + "/" + kFile);
  if (!vectors.ok()) return report.fail(kFile, "-", vectors.status().message());
  auto checkpoint = ComponentWeights::open(context.checkpoint_dir() + "/vae");
  if (!checkpoint.ok()) return report.fail(kFile, "-", checkpoint.status().message());
  auto encoder = VaeEncoder::load(*context.backend, *checkpoint);
  if (!encoder.ok()) return report.fail(kFile, "-", encoder.status().message());
  if (!cases->is_array() || cases->empty()) {
    return report.fail("vae_encode_cases.json", "-", "no cases");
  }
  // quality=high: the fused-bias convolutions, as in the decoder.
  const RequestScope request(*context.backend, {context.quality});
  for (size_t k = 0; k < cases->size(); ++k) {
    const std::string name = absl::StrCat("case", k);
    try {
      if (absl::Status s = run_case(context, **encoder, (*cases)[k], **vectors, name, report);
          !s.ok()) {
        report.fail(kFile, name, s.message());
      }
    } catch (const nlohmann::json::exception& error) {
      report.fail("vae_encode_cases.json", name, error.what());
    }
  }
}

}  // namespace flux2
