#!/usr/bin/env bash
# ctest tokenizer.corpus_vs_hf: every entry of corpus.json through `flux2 tokenize` and through
# Hugging Face tokenizers (hf_tokenize.js); the id arrays must be identical. Fails, never skips,
# when node, the npm modules or tokenizer.json are missing (deploy/install_deps.sh installs them).
#   tests/tokenizer/run_corpus_test.sh FLUX2_BINARY TOKENIZER_DIR WORK_DIR
set -euo pipefail
if [[ $# -ne 3 ]]; then
  echo "usage: $0 FLUX2_BINARY TOKENIZER_DIR WORK_DIR" >&2
  exit 2
fi
flux2="$1"
tokenizer_dir="$2"
work="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
node_modules="$(cd "$here/../tools" && pwd)/node_modules"
fail() {
  echo "tokenizer corpus test: $*" >&2
  exit 1
}
command -v node >/dev/null || fail "node is not installed; run deploy/install_deps.sh"
[[ -d "$node_modules/@anush008/tokenizers" ]] ||
  fail "$node_modules/@anush008/tokenizers is missing; run deploy/install_deps.sh"
[[ -f "$tokenizer_dir/tokenizer.json" ]] ||
  fail "$tokenizer_dir/tokenizer.json is missing; run deploy/install_deps.sh"

mkdir -p "$work"
node "$here/corpus.js" lines "$here/corpus.json" >"$work/input.jsonl"
node "$here/hf_tokenize.js" --tokenizer "$tokenizer_dir" --node-modules "$node_modules" \
  <"$work/input.jsonl" >"$work/expected.jsonl"
"$flux2" tokenize --tokenizer "$tokenizer_dir" <"$work/input.jsonl" >"$work/actual.jsonl"
node "$here/corpus.js" compare "$here/corpus.json" "$work/expected.jsonl" "$work/actual.jsonl"
