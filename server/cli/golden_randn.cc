// check-golden part "randn": placeholder until it lands (issue 3); reports FAIL, never skips.
#include "server/cli/golden_check.h"

namespace flux2 {

void check_golden_randn(const GoldenContext& context, GoldenReport& report) {
  report.fail("randn.safetensors", "-", "part \"randn\" is not implemented");
}

}  // namespace flux2
