#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, ASan + UBSan, into build-fuzz) and runs each
# for SECONDS (default 30) from its seed corpus in tests/fuzz/corpus/<target> (new inputs go to a
# scratch folder, not the repository). Exits 1 when any target finds a crash, leak, timeout or
# sanitizer report; its log (with the reproducer's path) is printed.
#   tests/fuzz/run_fuzzers.sh [SECONDS]        (FUZZ_BUILD_DIR defaults to ./build-fuzz)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${FUZZ_BUILD_DIR:-$repo/build-fuzz}"
seconds="${1:-30}"
targets=(safetensors config tokenizer request image_decode form_data json_body lora_adapter
         fp8_checkpoint)
CC=clang CXX=clang++ cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFLUX2_CUDA=OFF -DFLUX2_BUILD_TESTS=OFF -DFLUX2_FUZZ=ON >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
failed=()
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t"
  # -timeout: one input over 25 s is a hang; -rss_limit_mb: the decoders' documented bounds fit.
  if TMPDIR="$scratch" ASAN_OPTIONS="detect_leaks=1" "$build/bin/fuzz_$t" \
      -max_total_time="$seconds" -timeout=25 -rss_limit_mb=4096 -artifact_prefix="$scratch/$t-" \
      "$scratch/$t" "$repo/tests/fuzz/corpus/$t" >"$scratch/$t.log" 2>&1; then
    echo "fuzz_$t: $(grep -E 'DONE|^Done' "$scratch/$t.log" | tail -n1 || true) ok (${seconds} s)"
  else
    failed+=("$t")
    echo "fuzz_$t: FAILED"; tail -n 60 "$scratch/$t.log"
    ls "$scratch/$t-"* 2>/dev/null | while read -r input; do echo "reproducer: $input"; xxd "$input" | head -20; done
  fi
done
if (( ${#failed[@]} )); then
  echo "fuzzing failed: ${failed[*]}"
  exit 1
fi
echo "fuzzing: ${#targets[@]} targets ran ${seconds} s each without a finding"
