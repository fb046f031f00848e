// flux2_make_bfl_transformer: writes a diffusers transformer/ directory as one Black Forest Labs
// single file (flux2-dev.safetensors naming), e.g. to load a flux2_make_random_checkpoint model
// through model/bfl_checkpoint.h at real sizes. Its writer is tests/host/bfl_writer.h, tested by
// tests/host/bfl_checkpoint_test.cc.
//   flux2_make_bfl_transformer --transformer DIR --out FILE [--prefix model.diffusion_model.]
#include <cstdio>
#include <string>

#include "model/checkpoint.h"
#include "server/common/args.h"
#include "tests/host/bfl_writer.h"

int main(int argc, char** argv) {
  auto args = flux2::Args::parse(argc, argv, 1);
  if (!args.ok() || !args->has("--transformer") || !args->has("--out") ||
      !args->check_known({"--transformer", "--out", "--prefix"}).ok()) {
    std::fprintf(stderr,
                 "usage: flux2_make_bfl_transformer --transformer DIR --out FILE "
                 "[--prefix model.diffusion_model.]\n");
    return 2;
  }
  auto diffusers = flux2::ComponentWeights::open(args->get("--transformer"));
  if (!diffusers.ok()) {
    std::fprintf(stderr, "%s\n", std::string(diffusers.status().message()).c_str());
    return 1;
  }
  const std::string out = args->get("--out");
  const absl::Status written =
      flux2::testing::write_bfl_transformer(*diffusers, out, args->get("--prefix"));
  if (!written.ok()) {
    std::fprintf(stderr, "%s\n", std::string(written.message()).c_str());
    return 1;
  }
  std::printf("%s: %zu diffusers tensors written in BFL naming\n", out.c_str(),
              diffusers->tensors().size());
  return 0;
}
