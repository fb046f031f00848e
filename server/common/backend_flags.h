// The backend flags flux2_server and every `flux2` subcommand share (--cpu-threads,
// --fp8-attention, --gemm-autotune): parsed into BackendOptions with errors that name the flag,
// and documented once for both help texts. Tested by tests/host/small_units_test.cc.
#pragma once

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend_options.h"
#include "server/common/args.h"

namespace flux2 {

// The flags' names (each takes a value).
const std::set<std::string>& backend_flag_names();
// BackendOptions from `args` (defaults where a flag is absent).
absl::StatusOr<BackendOptions> parse_backend_flags(const Args& args);
// Help lines for the flags, indented as the help texts are.
std::string backend_flags_help();
// `--name on|off` (absent: `fallback`); the error names the flag.
absl::StatusOr<bool> parse_on_off(const Args& args, absl::string_view name, bool fallback);

}  // namespace flux2
