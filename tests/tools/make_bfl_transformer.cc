// flux2_make_bfl_transformer: writes a diffusers transformer/ directory as one Black Forest Labs
// single file (flux2-dev.safetensors naming), e.g. to load a flux2_make_random_checkpoint model
// through model/bfl_checkpoint.h at real sizes. Its writer is tests/host/bfl_writer.h, tested by
// tests/host/bfl_checkpoint_test.cc.
//   flux2_make_bfl_transformer --transformer DIR --out FILE [--prefix model.diffusion_model.]
#include <cstdio>
#include <string>

#include "model/checkpoint.h"
#include "server/common/command_line.h"
#include "tests/host/bfl_writer.h"

int main(int argc, char** argv) {
  flux2::CommandLine app("flux2_make_bfl_transformer");
  std::string transformer, out, prefix;
  app.add_option("--transformer", transformer)->required();
  app.add_option("--out", out)->required();
  app.add_option("--prefix", prefix);
  if (absl::Status parsed = app.parse_flags(argc, argv, 1); !parsed.ok()) {
    std::fprintf(stderr,
                 "%s\nusage: flux2_make_bfl_transformer --transformer DIR --out FILE "
                 "[--prefix model.diffusion_model.]\n",
                 std::string(parsed.message()).c_str());
    return 2;
  }
  auto diffusers = flux2::ComponentWeights::open(transformer);
  if (!diffusers.ok()) {
    std::fprintf(stderr, "%s\n", std::string(diffusers.status().message()).c_str());
    return 1;
  }
  const absl::Status written = flux2::testing::write_bfl_transformer(*diffusers, out, prefix);
  if (!written.ok()) {
    std::fprintf(stderr, "%s\n", std::string(written.message()).c_str());
    return 1;
  }
  std::printf("%s: %zu diffusers tensors written in BFL naming\n", out.c_str(),
              diffusers->tensors().size());
  return 0;
}
