// The flag parser of the `flux2` subcommands and the test tools: a CLI11 App (Debian's
// libcli11-dev, as flux2_server's) set up as they share it, parsing argv[first..) with errors that
// name the flag. Tested by tests/host/small_units_test.cc (CommandLineTest).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace flux2 {

// Options are bound by the caller (`add_option("--steps", params.num_inference_steps)`, whose
// value is the default, `add_flag("--json", json)`) before parsing. `--name value` and
// `--name=value` both work; a repeated option keeps its last value, one bound to a vector keeps
// every value in order (give it allow_extra_args(false) so that each occurrence takes one word).
// There is no -h/--help flag: the commands print their own usage.
class CommandLine : public CLI::App {
 public:
  explicit CommandLine(std::string name);

  // Parses argv[first..argc) and returns the positional words, in order. Errors name the flag: an
  // unknown option ("unknown option --bogus (known: --format --max-length --tokenizer)"), a
  // missing value, a value the option's type or check refuses (CLI11's message, e.g. "Could not
  // convert: --height = abc"), a required option absent ("--prompt is required").
  absl::StatusOr<std::vector<std::string>> parse_words(int argc, char** argv, int first);
  // parse_words for a command that takes no positional words: a word is an error naming it.
  absl::Status parse_flags(int argc, char** argv, int first);
};

}  // namespace flux2
