// Command-line parsing for the flux2 CLI; see args.h.
#include "server/common/args.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flux2 {

absl::StatusOr<Args> Args::parse(int argc, char** argv, int first,
                                 const std::set<std::string>& flags) {
  Args args;
  for (int i = first; i < argc; ++i) {
    std::string word = argv[i];
    if (word.rfind("--", 0) != 0) {
      args.positional_.push_back(word);
      continue;
    }
    const size_t equals = word.find('=');
    std::string name = word, value;
    if (equals != std::string::npos) {
      name = word.substr(0, equals);
      value = word.substr(equals + 1);
    } else if (flags.count(word)) {
      value = "true";
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("option ", word, " needs a value"));
    }
    args.values_[name] = value;
    args.occurrences_.emplace_back(std::move(name), std::move(value));
  }
  return args;
}

std::string Args::get(absl::string_view name, absl::string_view fallback) const {
  auto it = values_.find(std::string(name));
  return it == values_.end() ? std::string(fallback) : it->second;
}

std::vector<std::string> Args::get_all(absl::string_view name) const {
  std::vector<std::string> values;
  for (const auto& [option, value] : occurrences_) {
    if (option == name) values.push_back(value);
  }
  return values;
}

absl::StatusOr<int64_t> Args::get_int(absl::string_view name, int64_t fallback) const {
  if (!has(name)) return fallback;
  int64_t value;
  if (!absl::SimpleAtoi(get(name), &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": \"", get(name), "\" is not an integer"));
  }
  return value;
}

absl::StatusOr<double> Args::get_double(absl::string_view name, double fallback) const {
  if (!has(name)) return fallback;
  double value;
  if (!absl::SimpleAtod(get(name), &value)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": \"", get(name), "\" is not a number"));
  }
  return value;
}

absl::Status Args::check_known(const std::set<std::string>& known) const {
  for (const auto& [name, value] : values_) {
    if (!known.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown option ", name, " (known: ", absl::StrJoin(known, " "), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace flux2
