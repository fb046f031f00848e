// The `flux2` command-line tool: offline generation, golden checks, tokenization and benchmarks.
// Each subcommand lives in its own file; run `flux2 help` for the list.
#include <cstdio>
#include <cstring>
#include <string>

#include "server/cli/commands.h"

namespace {

void print_help() {
  std::printf(
      "usage: flux2 <command> [options]\n"
      "commands:\n"
      "  check-golden --golden DIR [--backend cpu|cuda] [--only PARTS]\n"
      "      run every case of a reference-vector directory; prints PASS/FAIL per check and\n"
      "      ends with \"N passed, M failed\"\n"
      "  tokenize --tokenizer DIR [--format qwen3|mistral --max-length N]\n"
      "      read one JSON string per line on stdin, print one JSON array of token ids per line\n"
      "      (--format: through the chat template, truncated and padded as the pipeline does)\n"
      "  generate --prompt P [--model-dir DIR] [--height H --width W --steps N --seed S\n"
      "           --guidance G --out FILE.png --backend cpu|cuda --quality lossless|high]\n"
      "           [--transformer-file F --text-encoder-file F --fp8-lossless resident|per_layer\n"
      "           --fp8-input-scale dynamic|static]\n"
      "      offline generation (no server); without --model-dir the embedded tiny checkpoint;\n"
      "      the checkpoint flags as flux2_server's (flux2_server --help)\n"
      "  bench --model klein-4b|klein-9b|dev [--height 1024 --width 1024 --text-len 512\n"
      "        --quality lossless|high --json --e2e [--references N --kv\n"
      "        --text-encoder-offload --device-memory-cap-gb G --prompt-cache]]\n"
      "        [--weights bf16|fp8 [--fp8-lossless resident|per_layer]\n"
      "        [--fp8-input-scale dynamic|static]]\n"
      "      per-step latency at real model shapes with random weights (CUDA; --weights fp8: the\n"
      "      blocks' projections as an FP8 checkpoint's stored codes and scales); --tune-gemm "
      "FILE\n"
      "      [--tune-by steps|calls] times each GEMM plan's cuBLASLt candidates and merges the\n"
      "      choices into FILE (a --gemm-algorithms table)\n"
      "  bench --concurrency N [--requests R --model M | --model-dir DIR --height H --width W\n"
      "        --quality lossless|high --steps S --text-len L --gpus N|A,B,... --json]\n"
      "      images/s and latency percentiles through an in-process server: one client, then N;\n"
      "      --gpus splits each request over GPUs as flux2_server's flag does and reports each\n"
      "      GPU's all-to-all and all-gather time per step\n"
      "  help   this text\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0) {
    print_help();
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "check-golden") return flux2::run_check_golden(argc, argv, 2);
  if (command == "tokenize") return flux2::run_tokenize(argc, argv, 2);
  if (command == "generate") return flux2::run_generate(argc, argv, 2);
  if (command == "bench") {
    for (int i = 2; i < argc; ++i) {
      if (std::strncmp(argv[i], "--concurrency", 13) == 0) {
        return flux2::run_bench_concurrency(argc, argv, 2);
      }
    }
    return flux2::run_bench(argc, argv, 2);
  }
  std::fprintf(stderr, "flux2: unknown command \"%s\"\n", command.c_str());
  print_help();
  return 2;
}
