// check-golden part "vae": placeholder until it lands (issue 3); reports FAIL, never skips.
#include "server/cli/golden_check.h"

namespace flux2 {

void check_golden_vae(const GoldenContext& context, GoldenReport& report) {
  report.fail("vae_decode.safetensors", "-", "part \"vae\" is not implemented");
}

}  // namespace flux2
