#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root (device `run`, carrying .device-bin from
# tests/gpu/build_bundle.sh, and .device-bin-base for `ab`): the GPU tests, the goldens on the CUDA
# backend and `flux2 bench` at the real shapes. Logs go to $OUT; a summary prints last. The exit
# status is non-zero when any test, golden check or bench failed (every failure is a failure on a
# machine with a GPU; tests skip only where no CUDA device exists).
#   tests/gpu/run_on_device.sh [tests] [golden] [server] [bench] [bench-dev] [high] [e2e] [e2e-4b]
#                              [ab] [ab-e2e] [ab-kv] [fp8] [fp8-files] [attention] [profile] [gemm-shapes] [perf] [references]
#                              [edit] [edit-profile] [dev] [soak] [soak-start] [soak-wait]
#                              [tune] [gemm-ab] [builtin-ab] [throughput] [e2e-profile] [e2e-shapes]
#                              [lora] [cache] [cache-high] [cache-references] [fp8-load]
#                              (default: tests golden bench bench-dev)
# `fp8-load` times the load of a dev FP8 file (BFL layout, ~33 GB, written first) from the page
# cache with `flux2 bench --transformer-file`, and its steps.
# `fp8-files` (issue 31): gpu_fp8_stored_weight_test, check-golden fp8 at both qualities, and the
# FP8-checkpoint benches (--weights fp8): klein-4B high (bf16 + copies vs the file's codes, step
# and peak; per-token vs static input scales), lossless resident vs per_layer, dev high step and
# an FP8 transformer + FP8 text encoder whole request under an 80 GB cap;
# FP8_FILES_PARTS="tests golden klein dev" picks some.
# `ab-e2e` alternates the base's and this tree's klein-4B whole requests (both qualities, twice;
# one with a reference image); `ab-kv` the same for klein-9B-KV requests with one 1024x1024
# reference (the JSON has the first step and the later steps apart).
# `cache-references` (needs .device-bin/diffusers-src.tar.xz too) makes diffusers' bf16 error per step
# of the step-cache goldens (tests/data/cache/bf16_reference_cache.json, used by `golden` in the same
# run; tests/gpu/make_cache_references.py).
# `references` (needs .device-bin/diffusers-src.tar.xz: `git archive` of diffusers' src/) makes
# diffusers' bf16 VAE-encoder errors (used by `golden` in the same run) and compares our reference
# resize with PIL's; `edit` times editing requests (one 1024x1024 reference, klein-KV, 4 references);
# `lora` times steps with rank-32 LoRA adapters on every Linear against the same steps without
# (klein-4B one and two adapters at both qualities, dev one; whole klein-4B requests with one), and
# a 300 MB adapter's first use
# and 8 adapters switched in turn (bench --lora-load-mb); `dev` times FLUX.2-dev requests (resident; the 80 GB plan under an 80 GB cap; the prompt cache).
# `cache` times FLUX.2-dev whole requests at quality=lossless (the text encoder offloaded, so it fits
# an 80 GB card) uncached, with DBCache at sglang's defaults (W 4, MC 3, R 0.24) and with the fixed
# schedule "compute steps 0-4 and every 4th after"; `cache-high` the same at quality=high, and
# klein-9B run as its base model (50 CFG steps) in the three modes.
# `tune` times each GEMM plan's cuBLASLt candidates over whole steps (klein-4B both qualities, dev
# lossless, 1024x1024) into $OUT/gemm_algorithms.json; `gemm-ab` times steps
# with the heuristic's algorithms and with that table (or $GEMM_TABLE) alternately, `builtin-ab`
# klein-4B's with the built-in one; `throughput`
# runs `flux2 bench --concurrency 8` (klein-4B, 1024 and 512, both qualities) and samples the
# GPU's utilization; `e2e-profile` times a klein-4B whole request per op category, `e2e-shapes`
# per op and shape.
set -uo pipefail
for dir in .device-bin .device-bin-base; do
  for part in lib bin; do
    if [[ -f $dir/$part.tar.xz && ! -d $dir/$part ]]; then tar -C $dir -xJf $dir/$part.tar.xz; fi
  done
done
tokenizer_json=tests/data/tiny-klein/checkpoint/tokenizer/tokenizer.json
[[ -f $tokenizer_json ]] || xz -dc .device-bin/tokenizer.json.xz >"$tokenizer_json"
tekken_json=tests/data/tiny-flux2-dev/checkpoint/tokenizer/tokenizer.json  # tracked as .xz
[[ -f $tekken_json ]] || xz -dkc "$tekken_json.xz" >"$tekken_json"
export LD_LIBRARY_PATH="$PWD/.device-bin/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export FLUX2_TEST_DATA="$PWD/tests/data"
bin="$PWD/.device-bin/bin"
base_bin="$PWD/.device-bin-base/bin"
tokenizer=tests/data/tiny-klein/checkpoint/tokenizer
# Logs in a scratch folder, packed into $OUT/logs.tgz at the end (a device call returns few files).
results="${OUT:-/tmp/flux2-out}"
out=/tmp/flux2-logs
rm -rf "$out" && mkdir -p "$out" "$results"
parts=("$@")
(( ${#parts[@]} )) || parts=(tests golden bench bench-dev)
want() { [[ " ${parts[*]} " == *" $1 "* ]]; }
summary=()
failures=0
# Records one step: its summary line, and a failure when its exit status is not 0.
record() {
  local code=$1 line=$2
  if (( code != 0 )); then
    failures=$((failures + 1))
    line="FAIL (exit $code) $line"
  fi
  summary+=("$line")
}
# Runs GPU test executables; each adds a summary line (its gtest verdicts and measured numbers).
run_gtests() {
  for t in "$@"; do
    "$bin/$t" --gtest_brief=1 >"$out/$t.log" 2>&1
    record $? "$t: $(grep -E '^\[  (PASSED|FAILED|SKIPPED)|relative L2|worst error' "$out/$t.log" | tr '\n' ' ')"
  done
}
# Runs `flux2 bench ARGS...` with binary $1, appending its JSON line to $out/$2.
bench() {
  local flux2=$1 file=$2 label=$3
  shift 3
  "$flux2" bench "$@" --json >>"$out/$file" 2>>"$out/bench.err"
  record $? "$label: $(tail -n1 "$out/$file")"
}

# One pair of the same bench, the heuristic's GEMM algorithms first, then table $1's (a file or
# "builtin"), appending to gemm-ab.jsonl.
ab_pair() {
  local table=$1 label=$2
  shift 2
  bench "$bin/flux2" gemm-ab.jsonl "heuristic $label" "$@" --gemm-algorithms heuristic
  bench "$bin/flux2" gemm-ab.jsonl "table $label" "$@" --gemm-algorithms "$table"
}
# One pair of the same bench, the base commit's flux2 ("before") then this tree's ("after"),
# appending to ab.jsonl: alternating pairs see the same machine and the same clocks.
before_after() {
  local label=$1
  shift
  bench "$base_bin/flux2" ab.jsonl "before $label" "$@"
  bench "$bin/flux2" ab.jsonl "after $label" "$@"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
if want references; then
  mkdir -p /tmp/diffusers-src && tar -C /tmp/diffusers-src -xJf .device-bin/diffusers-src.tar.xz
  python3 tests/gpu/make_editing_references.py --diffusers /tmp/diffusers-src/src \
    --tool "$bin/flux2_prepare_reference" >"$out/references.log" 2>&1
  record $? "references: $(tr '\n' ' ' <"$out/references.log" | tail -c 1500)"
  if [[ -f $results/bf16_reference_vae_encode.json ]]; then
    cp "$results/bf16_reference_vae_encode.json" tests/data/tiny-klein/
  fi
fi
if want cache-references; then
  [[ -d /tmp/diffusers-src/src ]] || { mkdir -p /tmp/diffusers-src &&
    tar -C /tmp/diffusers-src -xJf .device-bin/diffusers-src.tar.xz; }
  PYTHONUNBUFFERED=1 python3 tests/gpu/make_cache_references.py --diffusers /tmp/diffusers-src/src \
    --data tests/data --out "$results/bf16_reference_cache.json" >"$out/cache-references.log" 2>&1
  record $? "cache-references: $(tr '\n' ' ' <"$out/cache-references.log" | tail -c 1500)"
  if [[ -f $results/bf16_reference_cache.json ]]; then
    cp "$results/bf16_reference_cache.json" tests/data/cache/
  fi
fi
if want tests; then
  # $GPU_TESTS (space-separated) runs a subset: a bundle of only some binaries (BUNDLE_TARGETS).
  all_tests="gpu_exposer_cublaslt_test gpu_op_test gpu_backend_ops_test gpu_fast_path_fallback_test
    gpu_pipeline_fast_paths_test gpu_quantize_test gpu_quality_high_test gpu_fp8_accumulation_test
    gpu_flash_attention_fp8_test gpu_flash_attention_fp8_keys_test gpu_fp8_rows_test
    gpu_text_encoder_streaming_test
    gpu_gemm_algorithm_table_test gpu_step_cache_test gpu_fp8_stored_weight_test
    gpu_nccl_communicator_test"
  # gpu_server_test needs the server binary's path: it runs below, not among the plain tests.
  selected=" ${GPU_TESTS:-$all_tests} "
  run_gtests ${selected// gpu_server_test / }
  # The server on the tiny checkpoint, unless $GPU_TESTS names a subset without gpu_server_test.
  if [[ -z ${GPU_TESTS:-} || " $GPU_TESTS " == *" gpu_server_test "* ]]; then
    FLUX2_SERVER_BINARY="$bin/flux2_server" "$bin/gpu_server_test" >"$out/server-tiny.log" 2>&1
    record $? "gpu_server_test (tiny): $(grep -E '256x256|PASSED|FAILED' "$out/server-tiny.log" | tr '\n' ' ')"
    # The start-up memory refusal, which CI cannot check (server_python_dev skips it without a GPU):
    # a 1 TiB prompt cache is refused before any allocation, exit 1, naming the flag that shrinks it.
    timeout 120 "$bin/flux2_server" --host 127.0.0.1 --port 0 --metrics-port 0 --http-port 0 \
      --backend cuda --model-dir tests/data/tiny-flux2-dev/checkpoint \
      --prompt-cache-bytes $((1 << 40)) >"$out/server-refusal.log" 2>&1
    code=$?
    refusal=$(tail -n1 "$out/server-refusal.log")
    grep -q 'does not fit this device' "$out/server-refusal.log" &&
      grep -q -- '--text-encoder-offload' "$out/server-refusal.log" &&
      [[ $code == 1 && $refusal == *"exiting: the model failed to load: RESOURCE_EXHAUSTED"* ]]
    record $? "memory-plan refusal (exit $code): $refusal"
  fi
fi
if want golden; then
  for dir in tiny-klein tiny-dev tiny-flux2-dev; do
    "$bin/flux2" check-golden --golden "tests/data/$dir" --backend cuda >"$out/golden-$dir.log" 2>&1
    record $? "golden $dir (cuda): $(tail -n1 "$out/golden-$dir.log")"
    high_parts=transformer; [[ -f tests/data/$dir/vae_decode.safetensors ]] && high_parts=transformer,vae
    [[ -f tests/data/$dir/vae_encode_cases.json ]] && high_parts=$high_parts,vae_encode
    [[ -f tests/data/$dir/lora_transformer.safetensors ]] && high_parts=$high_parts,lora
    [[ -f tests/data/$dir/fp8_cases.json ]] && high_parts=$high_parts,fp8  # the file's FP8 codes
    "$bin/flux2" check-golden --golden "tests/data/$dir" --backend cuda --only $high_parts --quality high \
      >"$out/golden-high-$dir.log" 2>&1
    record $? "golden $dir (cuda, quality=high): $(tail -n1 "$out/golden-high-$dir.log")"
  done
  # The step-cache goldens step by step, decisions forced (e_ref: part cache-references).
  "$bin/flux2" check-golden --golden tests/data/cache --backend cuda --only cache_steps \
    >"$out/golden-cache.log" 2>&1
  record $? "golden cache steps (cuda): $(tail -n1 "$out/golden-cache.log")"
fi
if want server; then
  # The server on a klein-4B-shaped checkpoint directory with random weights.
  model_dir=/tmp/flux2-random-klein-4b
  [[ -d $model_dir ]] || "$bin/flux2_make_random_checkpoint" --model klein-4b --out "$model_dir" \
      --tokenizer "$tokenizer" >"$out/make_checkpoint.log" 2>&1
  FLUX2_GPU_MODEL_DIR=$model_dir FLUX2_SERVER_BINARY="$bin/flux2_server" "$bin/gpu_server_test" \
    --gtest_filter='*ServesACheckpointDirectory*' >"$out/server.log" 2>&1
  record $? "gpu_server_test: $(grep -E '1024x1024|PASSED|FAILED' "$out/server.log" | tr '\n' ' ')"
fi
# The soak: the server on random-weight klein-4B under mixed traffic (tests/cuda/soak.cc), one
# JSON line every 30 s. `soak` runs it in the call (SOAK_SECONDS, default 480, keeps within the
# device's 600 s per call); `soak-start` starts it in its own session so it outlives the call
# (SOAK_SECONDS default 630) and `soak-wait`, the next call, waits for it and collects the log.
soak_dir=/tmp/flux2-soak
if want soak || want soak-start; then
  model_dir=/tmp/flux2-random-klein-4b
  [[ -d $model_dir ]] || "$bin/flux2_make_random_checkpoint" --model klein-4b --out "$model_dir" \
      --tokenizer "$tokenizer" >"$out/make_checkpoint.log" 2>&1
  rm -rf "$soak_dir" && mkdir -p "$soak_dir"
  soak=("$bin/gpu_soak" "$bin/flux2_server" "$model_dir")
  if want soak; then
    "${soak[@]}" "${SOAK_SECONDS:-480}" 6 >"$soak_dir/soak.log" 2>"$soak_dir/soak.err"
    echo $? >"$soak_dir/rc"
  else
    setsid bash -c '"$@" >"'"$soak_dir"'/soak.log" 2>"'"$soak_dir"'/soak.err"; echo $? >"'"$soak_dir"'/rc"' \
      soak "${soak[@]}" "${SOAK_SECONDS:-630}" 6 </dev/null >/dev/null 2>&1 &
    record 0 "soak started (${SOAK_SECONDS:-630} s)"
  fi
fi
if want soak-wait; then
  for (( i = 0; i < 580; ++i )); do
    [[ -f $soak_dir/rc ]] && break
    sleep 1
  done
fi
if want soak || want soak-wait; then
  code=$(cat "$soak_dir/rc" 2>/dev/null || echo 124)
  record "$code" "soak: $(grep -c UNEXPECTED "$soak_dir/soak.log") unexpected; $(tail -n 2 "$soak_dir/soak.log" | tr '\n' ' ')"
  cp "$soak_dir/soak.log" "$soak_dir/soak.err" "$results/" 2>/dev/null
fi
if want bench; then
  for model in klein-4b klein-9b; do bench "$bin/flux2" bench.jsonl "bench $model" --model "$model"; done
  bench "$bin/flux2" profile.jsonl "profile klein-4b" --model klein-4b --profile
  bench "$bin/flux2" bench.jsonl "bench klein-4b eager" --model klein-4b --no-fast-paths
fi
if want high; then
  for model in klein-4b dev; do
    bench "$bin/flux2" bench.jsonl "bench $model high" --model "$model" --quality high --profile
  done
fi
if want ab; then  # steps and whole requests
  for quality in lossless high; do
    for run in "klein-4b 1" "klein-4b 2" "dev 1"; do
      set -- $run
      before_after "$1 $quality #$2" --model "$1" --quality $quality
    done
    before_after "e2e klein-4b $quality" --e2e --model klein-4b --quality $quality \
      --tokenizer "$tokenizer"
  done
fi
if want ab-e2e; then  # klein-4B whole requests only (a change outside the steps)
  for run in 1 2; do
    for quality in lossless high; do
      before_after "e2e klein-4b $quality #$run" --e2e --model klein-4b --quality $quality \
        --tokenizer "$tokenizer"
    done
  done
  before_after "e2e klein-4b lossless, 1 reference" --e2e --model klein-4b --references 1 \
    --tokenizer "$tokenizer"
fi
if want ab-kv; then  # klein-9B-KV whole requests, one reference: FP8 attention over cached keys
  for run in 1 2; do
    for quality in high lossless; do
      before_after "e2e klein-9b-kv $quality, 1 reference #$run" --e2e --model klein-9b --kv \
        --quality $quality --references 1 --tokenizer "$tokenizer"
    done
  done
fi
if want attention; then
  for model in klein-4b dev; do
    for quality in lossless high; do
      "$bin/flux2" bench --model "$model" --attention-only --quality $quality >>"$out/attention.jsonl" 2>>"$out/bench.err"
      record $? "attention $model $quality: $(tail -n1 "$out/attention.jsonl")"
    done
  done
fi
if want fp8; then  # quality=high only: its tests, and the klein-4B step with each alternative
  want tests || run_gtests gpu_flash_attention_fp8_test gpu_flash_attention_fp8_keys_test \
                           gpu_quality_high_test gpu_quantize_test \
                           gpu_fp8_accumulation_test gpu_fp8_rows_test
  for i in 1 2; do bench "$bin/flux2" bench.jsonl "bench klein-4b high" --model klein-4b --quality high; done
  bench "$bin/flux2" profile.jsonl "profile klein-4b high" --model klein-4b --quality high --profile
  bench "$bin/flux2" profile.jsonl "profile klein-4b high, bf16 attention (--fp8-attention off)" \
    --model klein-4b --quality high --profile --fp8-attention off
fi
fp8_part() { [[ " ${FP8_FILES_PARTS:-tests golden klein dev} " == *" $1 "* ]]; }
if want fp8-files; then  # FP8 checkpoints (issue 31): stored weights, both qualities, the targets
  if fp8_part tests; then want tests || run_gtests gpu_fp8_stored_weight_test; fi
  for quality in lossless high; do
    fp8_part golden || break
    "$bin/flux2" check-golden --golden tests/data/tiny-klein --backend cuda --quality $quality \
      --only fp8,fp8_pipeline >"$out/golden-fp8-$quality.log" 2>&1
    record $? "check-golden fp8 $quality: $(tail -n1 "$out/golden-fp8-$quality.log")"
  done
fi
if want fp8-files && fp8_part klein; then
  # klein-4B at quality=high: bf16 weights + FP8 copies (today) against an FP8 file's stored
  # weights (per_layer: nothing else resident), alternately; step and peak memory.
  for i in 1 2; do
    bench "$bin/flux2" fp8-files.jsonl "klein-4b high, bf16 weights" --model klein-4b --quality high
    bench "$bin/flux2" fp8-files.jsonl "klein-4b high, fp8 file per_layer" --model klein-4b \
      --quality high --weights fp8 --fp8-lossless per_layer
    # The file's static input scales (--fp8-input-scale static) against per-token scales.
    bench "$bin/flux2" fp8-files.jsonl "klein-4b high, fp8 file per_layer, static input scales" \
      --model klein-4b --quality high --weights fp8 --fp8-lossless per_layer --fp8-input-scale static
  done
  bench "$bin/flux2" fp8-files.jsonl "klein-4b high, fp8 file resident" --model klein-4b \
    --quality high --weights fp8 --fp8-lossless resident
  # Lossless on an FP8 file: resident bf16 values against a dequantization per GEMM.
  for plan in resident per_layer; do
    bench "$bin/flux2" fp8-files.jsonl "klein-4b lossless, fp8 file $plan" --model klein-4b \
      --weights fp8 --fp8-lossless $plan
  done
  bench "$bin/flux2" fp8-files.jsonl "e2e klein-4b high, fp8 file per_layer" --e2e \
    --model klein-4b --quality high --weights fp8 --fp8-lossless per_layer --tokenizer "$tokenizer"
fi
if want fp8-files && fp8_part dev; then
  for plan in resident per_layer; do
    bench "$bin/flux2" fp8-files.jsonl "dev lossless, fp8 file $plan" --model dev --weights fp8 \
      --fp8-lossless $plan
  done
  # dev: FP8 transformer and FP8 text encoder (resident, dequantized per layer) at quality=high
  # under an 80 GB cap without streaming (the issue's target: peak <= 60 GB, request <= 13.5 s),
  # and the step against today's high step.
  bench "$bin/flux2" fp8-files.jsonl "bench dev high, fp8 file per_layer" --model dev \
    --quality high --weights fp8 --fp8-lossless per_layer
  bench "$bin/flux2" fp8-files.jsonl "bench dev high, bf16 weights" --model dev --quality high
  bench "$bin/flux2" fp8-files.jsonl "e2e dev high, fp8 transformer + fp8 TE, 80 GB cap" \
    --e2e --model dev --repeats 2 --quality high --weights fp8 --fp8-lossless per_layer \
    --device-memory-cap-gb 80
fi
if want fp8-load; then
  # The load of a real-size FP8 file from the page cache (issue 31): dev in BFL's FP8 layout
  # (about 33 GB, tests/gpu/make_fp8_file.py), read once through the page cache, then loaded by
  # `flux2 bench --transformer-file` (open, checks, upload; the JSON's transformer_file_load_*),
  # at quality=high with --fp8-lossless per_layer (the codes stay as stored) and lossless
  # resident (each projection also dequantized to bf16 on the device).
  file=/tmp/flux2-dev-fp8.safetensors
  python3 tests/gpu/make_fp8_file.py --model dev --out $file >"$out/fp8-load.log" 2>&1
  record $? "make_fp8_file dev: $(tail -n1 "$out/fp8-load.log")"
  record 0 "page-cache read: $(dd if=$file of=/dev/null bs=16M 2>&1 | tail -n1)"
  bench "$bin/flux2" fp8-load.jsonl "dev high from the FP8 file (per_layer)" --model dev \
    --quality high --fp8-lossless per_layer --transformer-file $file
  bench "$bin/flux2" fp8-load.jsonl "dev lossless from the FP8 file (resident)" --model dev \
    --fp8-lossless resident --transformer-file $file
  rm -f $file
fi
if want gemm-shapes; then
  for quality in lossless high; do
    bench "$bin/flux2" profile.jsonl "gemm shapes klein-4b $quality" --model klein-4b --quality $quality \
      --profile-by-shape
  done
fi
if want profile; then  # device time per op category against the step (PERF_NOTES runs 82-84)
  for quality in lossless high; do
    for model in klein-4b dev; do
      bench "$bin/flux2" profile.jsonl "profile $model $quality" --model "$model" --quality $quality \
        --profile
    done
  done
fi
if want e2e-4b; then
  for quality in lossless high; do
    bench "$bin/flux2" e2e.jsonl "e2e klein-4b $quality" --e2e --model klein-4b --quality $quality \
      --tokenizer "$tokenizer"
  done
fi
if want e2e; then
  for model in klein-4b klein-9b; do
    bench "$bin/flux2" e2e.jsonl "e2e $model" --e2e --model "$model" --tokenizer "$tokenizer"
  done
  bench "$bin/flux2" e2e.jsonl "e2e dev" --e2e --model dev --repeats 1 --tokenizer "$tokenizer"
fi
if want edit; then
  for quality in lossless high; do
    bench "$bin/flux2" edit.jsonl "e2e klein-4b $quality, 1 reference" --e2e --model klein-4b \
      --quality $quality --references 1 --tokenizer "$tokenizer"
  done
  bench "$bin/flux2" edit.jsonl "e2e klein-4b, 4 references" --e2e --model klein-4b \
    --references 4 --repeats 2 --tokenizer "$tokenizer"
  bench "$bin/flux2" edit.jsonl "e2e klein-9b, text-to-image" --e2e --model klein-9b \
    --tokenizer "$tokenizer"
  for quality in lossless high; do
    bench "$bin/flux2" edit.jsonl "e2e klein-9b-kv $quality, 1 reference" --e2e --model klein-9b \
      --kv --quality $quality --references 1 --tokenizer "$tokenizer"
  done
fi
if want edit-profile; then  # device time per op and shape of a klein-4B request with one reference
  bench "$bin/flux2" profile.jsonl "profile e2e klein-4b, 1 reference" --e2e --model klein-4b \
    --references 1 --repeats 1 --profile-by-shape --tokenizer "$tokenizer"
fi
if want lora; then  # the step with rank-32 adapters on every Linear against the step without
  for quality in lossless high; do
    for n in 1 2; do
      bench "$bin/flux2" lora.jsonl "lora klein-4b $quality x$n" --model klein-4b --quality $quality \
        --lora-rank 32 --loras $n
    done
  done
  bench "$bin/flux2" lora.jsonl "lora dev lossless x1" --model dev --lora-rank 32
  # Whole klein-4B requests with one adapter against the same requests without (the upload in the
  # warm-up request, as a server's first request with it).
  bench "$bin/flux2" lora.jsonl "lora e2e klein-4b high x1" --e2e --model klein-4b --quality high \
    --lora-rank 32 --tokenizer "$tokenizer"
  # A 300 MB adapter's first use (header, host load, upload) and 8 adapters switched in turn.
  bench "$bin/flux2" lora.jsonl "lora load klein-4b 300 MB" --model klein-4b --lora-load-mb 300
fi
if want bench-dev; then
  bench "$bin/flux2" bench.jsonl "bench dev" --model dev
fi
if want dev; then  # FLUX.2-dev whole requests, 50 steps, 1024x1024, 512 text tokens
  bench "$bin/flux2" dev.jsonl "e2e dev lossless, resident" --e2e --model dev --repeats 1
  bench "$bin/flux2" dev.jsonl "e2e dev lossless, 80 GB plan under an 80 GB cap" --e2e --model dev \
    --repeats 1 --text-encoder-offload --device-memory-cap-gb 80
  bench "$bin/flux2" dev.jsonl "e2e dev lossless, prompt cache (repeated prompt)" --e2e --model dev \
    --repeats 1 --prompt-cache
  bench "$bin/flux2" dev.jsonl "bench dev high" --model dev --quality high
fi
if want cache; then  # step caching: dev whole requests, uncached and cached
  for mode in off dbcache schedule; do
    bench "$bin/flux2" cache.jsonl "cache dev lossless $mode" --e2e --model dev --repeats 1 \
      --text-encoder-offload --cache $mode
  done
fi
if want cache-high; then
  for mode in off dbcache schedule; do
    bench "$bin/flux2" cache.jsonl "cache dev high $mode" --e2e --model dev --quality high \
      --repeats 1 --text-encoder-offload --cache $mode
  done
  for mode in off dbcache schedule; do
    bench "$bin/flux2" cache.jsonl "cache klein-9b base lossless $mode" --e2e --model klein-9b \
      --base --repeats 1 --cache $mode
  done
fi
if want tune; then  # each plan's candidates timed over whole steps (bench --tune-gemm)
  table="$results/gemm_algorithms.json"
  for quality in lossless high; do
    bench "$bin/flux2" tune.jsonl "tune klein-4b $quality" --model klein-4b --quality $quality \
      --tune-gemm "$table"
  done
  bench "$bin/flux2" tune.jsonl "tune dev lossless" --model dev --tune-gemm "$table" \
    --tune-candidates 2
fi
if want gemm-ab; then  # the heuristic's algorithms against the tuned table, alternately
  table="${GEMM_TABLE:-$results/gemm_algorithms.json}"
  # SM clock and board power every 200 ms meanwhile: what the GPU sustains under the steps.
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
    --format=csv,noheader,nounits -lms 200 >"$out/gpu-clocks.csv" &
  sampler=$!
  for run in 1 2; do
    for quality in lossless high; do
      ab_pair "$table" "klein-4b $quality #$run" --model klein-4b --quality $quality
    done
  done
  ab_pair "$table" "klein-9b lossless" --model klein-9b
  for quality in lossless high; do
    ab_pair "$table" "dev $quality" --model dev --quality $quality
    ab_pair "$table" "e2e klein-4b $quality" --e2e --model klein-4b --quality $quality --tokenizer "$tokenizer"
  done
  kill $sampler
  # Samples drawing over 400 W (the benches' steps): mean SM clock and power against their maxima.
  record 0 "gpu clocks under load: $(awk -F', *' '$4 > 400 {n++; c += $2; p += $4; m = $3; l = $5}
    END {if (n) printf "%d samples, SM %.0f of %d MHz, %.0f of %.0f W", n, c / n, m, p / n, l}' \
    "$out/gpu-clocks.csv")"
fi
if want builtin-ab; then  # the built-in table (the default) against the heuristic, klein-4B only
  for run in 1 2; do ab_pair builtin "klein-4b lossless #$run" --model klein-4b; done
  ab_pair builtin "e2e klein-4b lossless" --e2e --model klein-4b --tokenizer "$tokenizer"
fi
if want e2e-profile || want e2e-shapes; then  # device time per op category (or op and shape)
  by=--profile; want e2e-shapes && by=--profile-by-shape
  for quality in lossless high; do
    bench "$bin/flux2" profile.jsonl "profile e2e klein-4b $quality ($by)" --e2e --model klein-4b \
      --quality $quality --repeats 1 $by --tokenizer "$tokenizer"
  done
fi
if want throughput; then  # images/s through the server path: one client, then 8
  # How busy the GPU is meanwhile (nvidia-smi's utilization: the share of time a kernel ran).
  nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm,power.draw \
    --format=csv,noheader,nounits -lms 200 >"$out/gpu-utilization.csv" &
  sampler=$!
  for size in 1024 512; do
    for quality in lossless high; do
      bench "$bin/flux2" throughput.jsonl "throughput klein-4b ${size}x$size $quality" \
        --concurrency 8 --requests 32 --model klein-4b --height $size --width $size \
        --quality $quality --tokenizer "$tokenizer"
    done
  done
  kill $sampler
  record 0 "gpu utilization under the throughput runs: $(awk -F', *' '$4 > 200 {n++; u += $2}
    END {if (n) printf "%d samples over 200 W, mean utilization %.1f%%", n, u / n}' \
    "$out/gpu-utilization.csv")"
fi
if want perf; then
  "$bin/gpu_op_test" --perf >"$out/op_perf.txt" 2>&1
  record $? "op perf: $(wc -l <"$out/op_perf.txt") cases timed (op_perf.txt)"
fi
{
  echo "==== summary"
  printf '%s\n' "${summary[@]}"
  echo "==== ${failures} failed step(s)"
} | tee "$out/summary.txt"
tar -C "$out" -czf "$results/logs.tgz" .
(( failures == 0 ))
