#!/usr/bin/env bash
# ctest tokenizer.corpus_vs_hf*: every entry of the corpus files (corpus.json when none is named)
# through `flux2 tokenize` and through Hugging Face tokenizers (hf_tokenize.js); the id arrays must
# be identical. --format renders each entry through that chat template on both sides first;
# --split-regex runs both on a copy of the tokenizer whose Split regex is replaced
# (replace_split_regex.js). Fails, never skips, when node, the npm modules or tokenizer.json are
# missing (deploy/install_deps.sh installs them).
#   tests/tokenizer/run_corpus_test.sh [--format qwen3|mistral] [--split-regex REGEX]
#       FLUX2_BINARY TOKENIZER_DIR WORK_DIR [CORPUS.json...]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
usage() {
  echo "usage: $0 [--format qwen3|mistral] [--split-regex REGEX] FLUX2_BINARY TOKENIZER_DIR" \
    "WORK_DIR [CORPUS.json...]" >&2
  exit 2
}
format_args=()
split_regex=""
while [[ $# -gt 0 && "$1" == --* ]]; do
  [[ $# -ge 2 ]] || usage
  case "$1" in
    --format) format_args=(--format "$2") ;;
    --split-regex) split_regex="$2" ;;
    *) usage ;;
  esac
  shift 2
done
[[ $# -ge 3 ]] || usage
flux2="$1"
tokenizer_dir="$2"
work="$3"
shift 3
corpora=("$@")
[[ ${#corpora[@]} -gt 0 ]] || corpora=("$here/corpus.json")
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
if [[ -n "$split_regex" ]]; then
  node "$here/replace_split_regex.js" "$tokenizer_dir" "$work/tokenizer" "$split_regex"
  tokenizer_dir="$work/tokenizer"
fi
node "$here/corpus.js" lines "${corpora[@]}" >"$work/input.jsonl"
node "$here/hf_tokenize.js" --tokenizer "$tokenizer_dir" --node-modules "$node_modules" \
  "${format_args[@]}" <"$work/input.jsonl" >"$work/expected.jsonl"
"$flux2" tokenize --tokenizer "$tokenizer_dir" "${format_args[@]}" \
  <"$work/input.jsonl" >"$work/actual.jsonl"
node "$here/corpus.js" compare "$work/expected.jsonl" "$work/actual.jsonl" "${corpora[@]}"
