// The backend flags flux2_server and every `flux2` subcommand share (--cpu-threads,
// --fp8-attention, --gemm-autotune, --gemm-algorithms) and the on|off switch parser, as CLI11
// options whose checks refuse bad values with errors that name the flag; documented once for both
// help texts. Tested by tests/host/small_units_test.cc and tests/server/server_options_test.cc.
#pragma once

#include <string>
#include <vector>

#include "kernels/backend_options.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace flux2 {

// Adds `name on|off` to `app`, bound to `value` (its value is the default); any other word fails
// the parse naming the flag: `--fast-paths: "maybe" is not on or off`.
CLI::Option* add_on_off_option(CLI::App& app, const std::string& name, bool& value);

// Adds --cpu-threads N, --fp8-attention on|off, --gemm-autotune on|off and --gemm-algorithms SRC
// to `app`, bound to `options` (its values are the defaults). Bad values fail the parse naming the
// flag: `--cpu-threads: "x" is not an integer`, `--cpu-threads: 2000 is outside 0..1024 (0: one per
// core)`, `--fp8-attention: "1" is not on or off`, `--gemm-algorithms: expected builtin, heuristic
// or a table file`. Returns the options added, in that order (flux2_server gives each its
// environment variable).
std::vector<CLI::Option*> add_backend_flags(CLI::App& app, BackendOptions& options);

// Help lines for the flags, indented as the help texts are.
std::string backend_flags_help();

}  // namespace flux2
