// check-golden part "pipeline": placeholder until it lands (issue 3); reports FAIL, never skips.
#include "server/cli/golden_check.h"

namespace flux2 {

void check_golden_pipeline(const GoldenContext& context, GoldenReport& report) {
  report.fail("pipeline_cases.json", "-", "part \"pipeline\" is not implemented");
}

}  // namespace flux2
