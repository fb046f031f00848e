// Backend flags; see backend_flags.h.
#include "server/common/backend_flags.h"

#include <CLI/CLI.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace flux2 {
namespace {

// CLI11 checks the words as given, before converting them; a non-empty answer fails the parse as
// "<flag>: <answer>".
std::string check_on_off(const std::string& word) {
  return word == "on" || word == "off" ? "" : absl::StrCat("\"", word, "\" is not on or off");
}

std::string check_cpu_threads(const std::string& word) {
  int64_t threads;
  if (!absl::SimpleAtoi(word, &threads)) return absl::StrCat("\"", word, "\" is not an integer");
  if (threads < 0 || threads > 1024) {
    return absl::StrCat(threads, " is outside 0..1024 (0: one per core)");
  }
  return "";
}

std::string check_gemm_algorithms(const std::string& word) {
  return word.empty() ? "expected builtin, heuristic or a table file" : "";
}

}  // namespace

CLI::Option* add_on_off_option(CLI::App& app, const std::string& name, bool& value) {
  return app.add_option(name, value)
      ->check(CLI::Validator(check_on_off, ""))
      ->type_name("on|off");  // CLI11 converts on and off to true and false
}

std::vector<CLI::Option*> add_backend_flags(CLI::App& app, BackendOptions& options) {
  return {app.add_option("--cpu-threads", options.cpu_threads)
              ->check(CLI::Validator(check_cpu_threads, ""))
              ->type_name("N"),
          add_on_off_option(app, "--fp8-attention", options.fp8_attention),
          add_on_off_option(app, "--gemm-autotune", options.gemm_autotune),
          app.add_option("--gemm-algorithms", options.gemm_algorithms)
              ->check(CLI::Validator(check_gemm_algorithms, ""))
              ->type_name("SRC")};
}

std::string backend_flags_help() {
  return "  --cpu-threads N          cpu backend worker threads (default 0: one per core)\n"
         "  --fp8-attention on|off   cuda, quality=high: attention in FP8 through our flash\n"
         "                           kernel (default on); off: bf16 attention, closer to "
         "lossless,\n"
         "                           ~2 ms slower per klein-4B step\n"
         "  --gemm-autotune on|off   cuda: time cuBLASLt's top GEMM candidates per shape and keep\n"
         "                           the fastest (default off: the heuristic's first, the same in\n"
         "                           every process; on: faster, but the choice and so the last\n"
         "                           bits of results may differ between processes)\n"
         "  --gemm-algorithms SRC    cuda: each GEMM shape's algorithm from SRC: builtin (the\n"
         "                           table built in; default), heuristic (cuBLASLt's first) or\n"
         "                           a table file (`flux2 bench --tune-gemm FILE` writes one)\n";
}

}  // namespace flux2
