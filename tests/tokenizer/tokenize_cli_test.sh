#!/usr/bin/env bash
# ctest tokenizer.cli: `flux2 tokenize` accepts what it should (CRLF lines, escapes, empty input,
# --format/--max-length) and rejects bad input lines and options with a message naming them and a
# non-zero exit.
#   tests/tokenizer/tokenize_cli_test.sh FLUX2_BINARY TOKENIZER_DIR
set -uo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 FLUX2_BINARY TOKENIZER_DIR" >&2
  exit 2
fi
flux2="$1"
tokenizer_dir="$2"
[[ -f "$tokenizer_dir/tokenizer.json" ]] || {
  echo "tokenize CLI test: $tokenizer_dir/tokenizer.json is missing; run deploy/install_deps.sh" >&2
  exit 1
}
failures=0
err="$(mktemp)"
trap 'rm -f "$err"' EXIT

# expect_ok NAME INPUT EXPECTED_STDOUT [EXTRA_ARGS...]
expect_ok() {
  local out rc
  out="$(printf '%b' "$2" | "$flux2" tokenize --tokenizer "$tokenizer_dir" "${@:4}" 2>"$err")"
  rc=$?
  if [[ $rc -ne 0 || "$out" != "$3" ]]; then
    echo "FAIL $1: rc=$rc stdout=[$out] expected [$3]; stderr: $(cat "$err")"
    failures=$((failures + 1))
  else
    echo "PASS $1"
  fi
}

# expect_error NAME INPUT MESSAGE_SUBSTRING [ARGS...]
expect_error() {
  local name="$1" input="$2" message="$3" rc
  shift 3
  local args=("$@")
  [[ ${#args[@]} -eq 0 ]] && args=(--tokenizer "$tokenizer_dir")
  printf '%b' "$input" | "$flux2" tokenize "${args[@]}" >/dev/null 2>"$err"
  rc=$?
  if [[ $rc -eq 0 ]] || ! grep -qF -- "$message" "$err"; then
    echo "FAIL $name: rc=$rc, stderr [$(cat "$err")] should contain [$message]"
    failures=$((failures + 1))
  else
    echo "PASS $name ($(head -n1 "$err"))"
  fi
}

expect_ok "two_lines" '"hello world"\n"<|endoftext|>"\n' $'[14990,1879]\n[151643]'
expect_ok "crlf_and_spaces" '  "hello world" \r\n' '[14990,1879]'
expect_ok "escapes" '"\\u0068ello\\tworld\\n\\ud83d\\ude00"\n' '[14990,76508,198,141334]'  # Hugging Face's ids
expect_ok "lone_surrogate_is_fffd" '"\\ud800x"\n' '[5691,87]'
expect_ok "empty_string" '""\n' '[]'
expect_ok "no_input" '' ''
# --format renders the chat template (Qwen3 here), --max-length truncates and pads (<|endoftext|>).
qwen3_a='151644,872,198,64,151645,198,151644,77091,198,151667,271,151668,271'
expect_ok "format_qwen3" '"a"\n' "[$qwen3_a]" --format qwen3
expect_ok "format_qwen3_padded" '"a"\n' "[$qwen3_a,151643,151643]" --format qwen3 --max-length 15
expect_ok "format_qwen3_truncated" '"a"\n' '[151644,872,198]' --format qwen3 --max-length 3
expect_error "number_line" '"ok"\n42\n' "stdin line 2: expected a JSON string"
expect_error "unterminated" '"abc\n' "stdin line 1: unterminated JSON string"
expect_error "trailing_text" '"a" "b"\n' "stdin line 1: text after the closing"
expect_error "bad_escape" '"a\\qb"\n' "stdin line 1: invalid escape"
expect_error "raw_control_character" '"a\tb"\n' "stdin line 1: control character"
expect_error "empty_line" '"a"\n\n"b"\n' "stdin line 2: expected a JSON string, got an empty line"
expect_error "json_array_line" '["a"]\n' "stdin line 1: expected a JSON string"
expect_error "unknown_option" '' "unknown option --bogus" --bogus x
expect_error "missing_tokenizer_flag" '' "usage: flux2 tokenize" extra
expect_error "unknown_format" '' "unknown prompt format \"llama\"" --tokenizer "$tokenizer_dir" \
  --format llama
expect_error "max_length_without_format" '' "usage: flux2 tokenize" --tokenizer "$tokenizer_dir" \
  --max-length 4
expect_error "negative_max_length" '' "--max-length needs a non-negative integer" \
  --tokenizer "$tokenizer_dir" --format qwen3 --max-length -1
expect_error "missing_directory" '' "/nonexistent-dir/tokenizer.json" --tokenizer /nonexistent-dir

if [[ $failures -ne 0 ]]; then
  echo "$failures tokenize CLI check(s) failed"
  exit 1
fi
echo "all tokenize CLI checks passed"
