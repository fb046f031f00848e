// Backend flags; see backend_flags.h.
#include "server/common/backend_flags.h"

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"

namespace flux2 {

const std::set<std::string>& backend_flag_names() {
  static const std::set<std::string> names = {"--cpu-threads", "--fp8-attention", "--gemm-autotune",
                                              "--gemm-algorithms"};
  return names;
}

absl::StatusOr<bool> parse_on_off(const Args& args, absl::string_view name, bool fallback) {
  const std::string value = args.get(name, fallback ? "on" : "off");
  if (value != "on" && value != "off") {
    return absl::InvalidArgumentError(absl::StrCat(name, ": \"", value, "\" is not on or off"));
  }
  return value == "on";
}

absl::StatusOr<BackendOptions> parse_backend_flags(const Args& args) {
  BackendOptions options;
  FLUX_ASSIGN_OR_RETURN(const int64_t threads, args.get_int("--cpu-threads", options.cpu_threads));
  if (threads < 0 || threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cpu-threads: ", threads, " is outside 0..1024 (0: one per core)"));
  }
  options.cpu_threads = static_cast<int>(threads);
  FLUX_ASSIGN_OR_RETURN(options.fp8_attention,
                        parse_on_off(args, "--fp8-attention", options.fp8_attention));
  FLUX_ASSIGN_OR_RETURN(options.gemm_autotune,
                        parse_on_off(args, "--gemm-autotune", options.gemm_autotune));
  options.gemm_algorithms = args.get("--gemm-algorithms", options.gemm_algorithms);
  if (options.gemm_algorithms.empty()) {
    return absl::InvalidArgumentError(
        "--gemm-algorithms: expected builtin, heuristic or a table file");
  }
  return options;
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
