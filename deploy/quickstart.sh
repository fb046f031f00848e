#!/usr/bin/env bash
# Installs what is missing, builds, and runs flux2_server. Without --model-dir it serves the
# embedded tiny FLUX.2-klein checkpoint on the CPU (gRPC :50051, HTTP :8000, metrics :9464).
#   deploy/quickstart.sh [flux2_server flags, e.g. --model-dir /models/FLUX.2-klein-4B]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$repo/build}"
"$repo/deploy/install_deps.sh"
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)" --target flux2_server flux2
exec "$build/bin/flux2_server" "$@"
