#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root (device `run`, carrying .device-bin from
# tests/gpu/build_bundle.sh): the GPU tests, the goldens on the CUDA backend and `flux2 bench` at
# the real shapes. Logs go to $OUT; a summary prints last.
#   tests/gpu/run_on_device.sh [tests] [golden] [bench] [bench-dev] [high] [fp8] [attention] [profile]
#                              [gemm-shapes] [e2e] [e2e-4b] [server]   (default: tests golden bench bench-dev)
set -uo pipefail
for part in lib bin; do
  if [[ -f .device-bin/$part.tar.xz && ! -d .device-bin/$part ]]; then tar -C .device-bin -xJf .device-bin/$part.tar.xz; fi
done
tokenizer_json=tests/data/tiny-klein/checkpoint/tokenizer/tokenizer.json
[[ -f $tokenizer_json ]] || xz -dc .device-bin/tokenizer.json.xz >"$tokenizer_json"
export LD_LIBRARY_PATH="$PWD/.device-bin/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export FLUX2_TEST_DATA="$PWD/tests/data"
bin="$PWD/.device-bin/bin"
out="${OUT:-/tmp/flux2-out}"
mkdir -p "$out"
parts=("$@")
(( ${#parts[@]} )) || parts=(tests golden bench bench-dev)
want() { [[ " ${parts[*]} " == *" $1 "* ]]; }
summary=()
# Runs GPU test executables; each adds a summary line (its gtest verdicts and measured numbers).
run_gtests() {
  for t in "$@"; do
    "$bin/$t" --gtest_brief=1 >"$out/$t.log" 2>&1
    summary+=("$t: exit $? ($(grep -E '^\[  (PASSED|FAILED|SKIPPED)|relative L2|accumulation fast' "$out/$t.log" | tr '\n' ' '))")
  done
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
if want tests; then
  run_gtests gpu_exposer_cublaslt_test gpu_backend_ops_test gpu_fused_ops_test gpu_fast_path_fallback_test \
             gpu_pipeline_fast_paths_test gpu_quantize_test gpu_quality_high_test \
             gpu_fp8_handoff_test gpu_fp8_accumulation_test gpu_flash_attention_fp8_test gpu_fp8_rows_test
  FLUX2_SERVER_BINARY="$bin/flux2_server" "$bin/gpu_server_test" >"$out/server-tiny.log" 2>&1  # tiny checkpoint
  summary+=("gpu_server_test (tiny): exit $? $(grep -E '256x256|PASSED|FAILED' "$out/server-tiny.log" | tr '\n' ' ')")
fi
if want golden; then
  for dir in tiny-klein tiny-dev; do
    "$bin/flux2" check-golden --golden "tests/data/$dir" --backend cuda >"$out/golden-$dir.log" 2>&1
    summary+=("golden $dir (cuda): exit $? $(tail -n1 "$out/golden-$dir.log")")
    high_parts=transformer; [[ -f tests/data/$dir/vae_decode.safetensors ]] && high_parts=transformer,vae
    "$bin/flux2" check-golden --golden "tests/data/$dir" --backend cuda --only $high_parts --quality high \
      >"$out/golden-high-$dir.log" 2>&1
    summary+=("golden $dir (cuda, quality=high): exit $? $(tail -n1 "$out/golden-high-$dir.log")")
  done
fi
if want bench; then
  for model in klein-4b klein-9b; do
    "$bin/flux2" bench --model "$model" --json >>"$out/bench.jsonl" 2>>"$out/bench.err"
    summary+=("bench $model: $(tail -n1 "$out/bench.jsonl")")
  done
  "$bin/flux2" bench --model klein-4b --profile --json >>"$out/profile.jsonl" 2>>"$out/bench.err"
  summary+=("profile klein-4b: $(tail -n1 "$out/profile.jsonl")")
  "$bin/flux2" bench --model klein-4b --no-fast-paths --json >>"$out/bench.jsonl" 2>>"$out/bench.err"
  summary+=("bench klein-4b eager: $(tail -n1 "$out/bench.jsonl")")
fi
if want server; then
  # issue 6: the server on a klein-4B-shaped checkpoint directory with random weights.
  model_dir=/tmp/flux2-random-klein-4b
  [[ -d $model_dir ]] || "$bin/flux2_make_random_checkpoint" --model klein-4b --out "$model_dir" \
      --tokenizer tests/data/tiny-klein/checkpoint/tokenizer >"$out/make_checkpoint.log" 2>&1
  FLUX2_GPU_MODEL_DIR=$model_dir FLUX2_SERVER_BINARY="$bin/flux2_server" "$bin/gpu_server_test" >"$out/server.log" 2>&1
  summary+=("gpu_server_test: exit $? $(grep -E '1024x1024|PASSED|FAILED' "$out/server.log" | tr '\n' ' ')")
fi
if want high; then
  for model in klein-4b dev; do
    "$bin/flux2" bench --model "$model" --quality high --profile --json >>"$out/bench.jsonl" 2>>"$out/bench.err"
    summary+=("bench $model high: $(tail -n1 "$out/bench.jsonl")")
  done
  grep -h "relative L2" "$out/gpu_quality_high_test.log" | while read -r line; do echo "quality: $line"; done
fi
if want attention; then
  for model in klein-4b dev; do
    for quality in lossless high; do
      summary+=("attention $model $quality: $("$bin/flux2" bench --model "$model" --attention-only --quality $quality 2>>"$out/bench.err")")
    done
  done
fi
if want fp8; then  # quality=high only: its tests, attention alone and the klein-4B step
  want tests || run_gtests gpu_flash_attention_fp8_test gpu_fp8_handoff_test gpu_quality_high_test \
                          gpu_quantize_test gpu_fp8_accumulation_test gpu_fp8_rows_test
  for quality in lossless high; do
    summary+=("attention klein-4b $quality: $("$bin/flux2" bench --model klein-4b --attention-only --quality $quality 2>>"$out/bench.err")")
  done
  for i in 1 2; do
    "$bin/flux2" bench --model klein-4b --quality high --json >>"$out/bench.jsonl" 2>>"$out/bench.err"
    summary+=("bench klein-4b high: $(tail -n1 "$out/bench.jsonl")")
  done
  "$bin/flux2" bench --model klein-4b --quality high --profile --json >>"$out/profile.jsonl" 2>>"$out/bench.err"
  summary+=("profile klein-4b high: $(tail -n1 "$out/profile.jsonl")")
  FLUX2_FLASH_FP8=0 "$bin/flux2" bench --model klein-4b --quality high --profile --json >>"$out/profile.jsonl" 2>>"$out/bench.err"
  summary+=("profile klein-4b high, bf16 attention (FLUX2_FLASH_FP8=0): $(tail -n1 "$out/profile.jsonl")")
  FLUX2_FP8_FAST_ACCUM=0 "$bin/flux2" bench --model klein-4b --quality high --profile --json \
    >>"$out/profile.jsonl" 2>>"$out/bench.err"
  summary+=("profile klein-4b high, fp32-promoted accumulation (fast accumulation off): $(tail -n1 "$out/profile.jsonl")")
fi
if want gemm-shapes; then
  FLUX2_PROFILE_GEMM_SHAPES=1 "$bin/flux2" bench --model klein-4b --profile --json >>"$out/profile.jsonl" 2>>"$out/bench.err"
  summary+=("gemm shapes klein-4b lossless: $(tail -n1 "$out/profile.jsonl")")
  FLUX2_PROFILE_GEMM_SHAPES=1 "$bin/flux2" bench --model klein-4b --quality high --profile --json >>"$out/profile.jsonl" 2>>"$out/bench.err"
  summary+=("gemm shapes klein-4b high: $(tail -n1 "$out/profile.jsonl")")
fi
if want profile; then
  for tune in 0 1; do
    for model in klein-4b dev; do
      FLUX2_GEMM_AUTOTUNE=$tune "$bin/flux2" bench --model "$model" --profile --json >>"$out/profile.jsonl" 2>>"$out/bench.err"
      summary+=("profile $model autotune=$tune: $(tail -n1 "$out/profile.jsonl")")
    done
  done
fi
if want e2e-4b; then
  for quality in lossless high; do
    "$bin/flux2" bench --e2e --model klein-4b --quality $quality --json --tokenizer tests/data/tiny-klein/checkpoint/tokenizer \
      >>"$out/e2e.jsonl" 2>>"$out/bench.err"
    summary+=("e2e klein-4b $quality: $(tail -n1 "$out/e2e.jsonl")")
  done
fi
if want e2e; then
  for model in klein-4b klein-9b; do
    "$bin/flux2" bench --e2e --model "$model" --json --tokenizer tests/data/tiny-klein/checkpoint/tokenizer \
      >>"$out/e2e.jsonl" 2>>"$out/bench.err"
    summary+=("e2e $model: $(tail -n1 "$out/e2e.jsonl")")
  done
  "$bin/flux2" bench --e2e --model dev --repeats 1 --json --tokenizer tests/data/tiny-klein/checkpoint/tokenizer \
    >>"$out/e2e.jsonl" 2>>"$out/bench.err"
  summary+=("e2e dev: $(tail -n1 "$out/e2e.jsonl")")
fi
if want bench-dev; then
  "$bin/flux2" bench --model dev --json >>"$out/bench.jsonl" 2>>"$out/bench.err"
  summary+=("bench dev: $(tail -n1 "$out/bench.jsonl")")
fi
echo "==== summary"
printf '%s\n' "${summary[@]}"
