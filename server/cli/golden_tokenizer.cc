// check-golden part "tokenizer": placeholder until it lands (issue 3); reports FAIL, never skips.
#include "server/cli/golden_check.h"

namespace flux2 {

void check_golden_tokenizer(const GoldenContext& context, GoldenReport& report) {
  report.fail("tokenizer_cases.json", "-", "part \"tokenizer\" is not implemented");
}

}  // namespace flux2
