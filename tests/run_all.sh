#!/usr/bin/env bash
# Builds everything and runs every test: the format check (clang-format over every C++/CUDA
# source), the build with warnings as errors (FLUX2_WERROR), ctest (host unit tests, golden checks
# against diffusers, tokenizer corpus, server end-to-end, deployment checks; GPU tests skip where
# no CUDA device exists), then the sanitizer job: a CPU-only build with ASan + UBSan
# (FLUX2_SANITIZE) running the host and server tests; then the libFuzzer targets of tests/fuzz,
# 30 s each (clang, ASan + UBSan).
#   tests/run_all.sh [extra ctest args]     (BUILD_DIR defaults to ./build, the sanitizer build
#                                            to ./build-sanitize)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$repo/build}"
# Each stage's wall time, printed as it ends and summed at the exit (the CI budget: 75 minutes).
stage_times=()
stage() {
  local now=$SECONDS
  (( ${#stage_times[@]} )) && stage_times[-1]+=" $((now - stage_start)) s"
  echo "run_all: stage $1 starts (${now} s in)"
  stage_times+=("$1:")
  stage_start=$now
}
report_stages() {
  (( ${#stage_times[@]} )) && stage_times[-1]+=" $((SECONDS - stage_start)) s"
  echo "run_all: ${stage_times[*]}; total ${SECONDS} s"
}
trap report_stages EXIT
stage deps
"$repo/deploy/install_deps.sh"
"$repo/tests/check_format.sh"
stage build
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLUX2_WERROR=ON
cmake --build "$build" -j "$(nproc)"
stage ctest
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"

stage sanitize-build
sanitize="${SANITIZE_BUILD_DIR:-$repo/build-sanitize}"
# -O1 with line tables only (-g1): what the sanitizers' reports need (file:line stacks), at about a
# third of -O2 -g's compile time on the heaviest sources (72 s -> 27 s for openai_images.cc).
cmake -S "$repo" -B "$sanitize" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLUX2_CUDA=OFF \
  -DFLUX2_SANITIZE=ON -DFLUX2_WERROR=ON -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
cmake --build "$sanitize" -j "$(nproc)" --target host_tests server_unit_tests server_e2e_tests \
  http_transport_tests parallel_engine_test flux2 flux2_server flux2_make_bfl_transformer
# Leaks are reported too (LeakSanitizer); a UBSan finding fails its test. The hostile-client suite
# runs in the plain build only: it bounds peak RSS and latency, which ASan's quarantine (freed
# blocks kept resident) and its slowdown change by design; the transport's own raw-socket tests
# (http_transport_tests: limits, slowloris, pipelining, half-close, drain) run here.
stage sanitize-ctest
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --test-dir "$sanitize" --output-on-failure -j "$(nproc)" -L 'host|server' \
  -E server_http_hostile "$@"

# Every parser of untrusted bytes under libFuzzer for a bounded time; a finding fails the run.
stage fuzz
"$repo/tests/fuzz/run_fuzzers.sh" 30
