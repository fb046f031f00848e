// A small command-line parser for the `flux2` subcommands: `--name value` and `--name=value`
// options plus positional words, with errors that name the option; a repeated option keeps every
// value (get_all) and get() returns the last. Tested by tests/host/small_units_test.cc and
// tests/host/generate_command_test.cc (repeated --reference).
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace flux2 {

class Args {
 public:
  // Parses argv[first..argc); `flags` are options that take no value (e.g. "--json").
  static absl::StatusOr<Args> parse(int argc, char** argv, int first,
                                    const std::set<std::string>& flags = {});

  bool has(absl::string_view name) const { return values_.count(std::string(name)) > 0; }
  std::string get(absl::string_view name, absl::string_view fallback = "") const;
  // Every value given for `name`, in command-line order (empty when absent).
  std::vector<std::string> get_all(absl::string_view name) const;
  absl::StatusOr<int64_t> get_int(absl::string_view name, int64_t fallback) const;
  absl::StatusOr<double> get_double(absl::string_view name, double fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }
  // Fails naming the first option not in `known`.
  absl::Status check_known(const std::set<std::string>& known) const;

 private:
  std::map<std::string, std::string> values_;                     // the last value of each option
  std::vector<std::pair<std::string, std::string>> occurrences_;  // every option, in order
  std::vector<std::string> positional_;
};

}  // namespace flux2
