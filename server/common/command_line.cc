// The `flux2` subcommands' flag parser; see command_line.h.
#include "server/common/command_line.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flux2 {
namespace {

// "--a --b ...": every long flag of `app`, sorted.
std::string known_flags(const CLI::App& app) {
  std::vector<std::string> known;
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& name : option->get_lnames()) known.push_back("--" + name);
  }
  std::sort(known.begin(), known.end());
  return absl::StrJoin(known, " ");
}

}  // namespace

CommandLine::CommandLine(std::string name) : CLI::App("", std::move(name)) {
  set_help_flag();
  allow_extras();  // unknown options come back from parse: parse_words names them
  option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

absl::StatusOr<std::vector<std::string>> CommandLine::parse_words(int argc, char** argv,
                                                                  int first) {
  std::vector<std::string> args(argv + std::min(first, argc), argv + argc);
  std::reverse(args.begin(), args.end());  // CLI11 takes the words from the back
  try {
    parse(std::move(args));
  } catch (const CLI::ParseError& error) {
    return absl::InvalidArgumentError(error.what());
  }
  std::vector<std::string> words;
  bool only_words = false;  // after "--"
  for (const std::string& word : remaining()) {
    if (only_words || word.size() < 2 || word[0] != '-') {
      words.push_back(word);
      continue;
    }
    if (word == "--") {
      only_words = true;
      continue;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown option ", word.substr(0, word.find('=')), " (known: ", known_flags(*this), ")"));
  }
  return words;
}

absl::Status CommandLine::parse_flags(int argc, char** argv, int first) {
  absl::StatusOr<std::vector<std::string>> words = parse_words(argc, argv, first);
  if (!words.ok()) return words.status();
  if (!words->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected word \"", words->front(), "\" (", get_name(),
                     " takes only --flags; quote a value that has spaces)"));
  }
  return absl::OkStatus();
}

}  // namespace flux2
