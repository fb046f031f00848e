// The `flux2` subcommands; each is defined in its own <name>_command.cc (or golden_check.cc).
// argv[first] is the first word after the subcommand name. Each returns the process exit status.
#pragma once

namespace flux2 {

int run_check_golden(int argc, char** argv, int first);  // golden_check.cc
int run_tokenize(int argc, char** argv, int first);      // tokenize_command.cc
int run_generate(int argc, char** argv, int first);      // generate_command.cc
int run_bench(int argc, char** argv, int first);         // bench_command.cc
// bench --concurrency N (bench_concurrency_command.cc, in the flux2 executable only)
int run_bench_concurrency(int argc, char** argv, int first);

}  // namespace flux2
