#!/usr/bin/env bash
# `cmake --install` into a fresh prefix, then the installed flux2_server serves the embedded tiny
# checkpoint from <prefix>/share/flux2/tiny-klein/checkpoint (not the build tree): --help names it,
# and the server becomes ready and answers a generation over HTTP. ctest: server_installed_layout.
#   tests/server/installed_layout_test.sh BUILD_DIR
set -euo pipefail
build="$1"
prefix="$(mktemp -d)"
server=""
trap 'kill "$server" 2>/dev/null || true; rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
checkpoint="$prefix/share/flux2/tiny-klein/checkpoint"
test -f "$checkpoint/model_index.json"
help="$("$prefix/bin/flux2_server" --help)"
grep -qF "embedded tiny checkpoint ($checkpoint)" <<<"$help"
"$prefix/bin/flux2_server" --host 127.0.0.1 --port 0 --metrics-port 0 --http-port 0 --backend cpu \
  >"$prefix/out" 2>"$prefix/err" &
server=$!
for _ in $(seq 600); do
  port="$(sed -n 's/.* http=\([0-9]*\).*/\1/p' "$prefix/out")"
  [[ -n "$port" ]] && curl -sf "http://127.0.0.1:$port/ready" >/dev/null && break
  sleep 0.2
done
models="$(curl -sf "http://127.0.0.1:$port/v1/models")"
grep -qF '"id":"tiny-klein"' <<<"$models"
image="$(curl -sf "http://127.0.0.1:$port/v1/images/generations" -H 'Content-Type: application/json' \
  -d '{"prompt": "a fox", "size": "64x64", "num_inference_steps": 1}')"
grep -qF '"b64_json"' <<<"$image"
grep -q "loaded tiny-klein" "$prefix/err"
echo "installed_layout: ok ($checkpoint)"
