#!/bin/sh
# Writes SHA256SUMS for a checkpoint directory (every file, relative paths, sorted): the manifest the Deployment's
# verify-weights init container checks with `sha256sum --check --strict`. Tested by tests/deploy/test_weights_manifest.py.
#   deploy/scripts/make_weights_manifest.sh /path/to/FLUX.2-klein-4B
set -eu
if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 CHECKPOINT_DIR" >&2
  exit 2
fi
cd "$1"
tmp="$(mktemp SHA256SUMS.XXXXXX)"
trap 'rm -f "$tmp"' EXIT
find . -type f ! -name SHA256SUMS ! -name "$tmp" -print | sed 's|^\./||' | LC_ALL=C sort |
  while IFS= read -r f; do sha256sum -- "$f"; done > "$tmp"
if [ ! -s "$tmp" ]; then
  echo "$0: $1 has no files" >&2
  exit 1
fi
mv "$tmp" SHA256SUMS
trap - EXIT
echo "wrote $1/SHA256SUMS ($(wc -l < SHA256SUMS) files)"
