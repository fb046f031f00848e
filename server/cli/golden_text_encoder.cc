// check-golden part "text_encoder": placeholder until it lands (issue 3); reports FAIL, never skips.
#include "server/cli/golden_check.h"

namespace flux2 {

void check_golden_text_encoder(const GoldenContext& context, GoldenReport& report) {
  report.fail("text_encoder.safetensors", "-", "part \"text_encoder\" is not implemented");
}

}  // namespace flux2
