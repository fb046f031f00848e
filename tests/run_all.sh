#!/usr/bin/env bash
# Builds everything and runs every test (ctest): host unit tests, golden checks against diffusers,
# tokenizer corpus, server end-to-end, deployment checks; GPU tests skip where no GPU exists.
#   tests/run_all.sh [extra ctest args]     (BUILD_DIR defaults to ./build)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$repo/build}"
"$repo/deploy/install_deps.sh"
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"
