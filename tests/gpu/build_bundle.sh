#!/usr/bin/env bash
# Builds the GPU test and benchmark set here (CUDA for sm_90a) and collects the executables plus
# the non-system shared libraries they load into .device-bin/ (ignored by git), for the lent H200
# (it has CUDA and cuDNN but no gRPC, protobuf, abseil or prometheus-cpp). Then run
# tests/gpu/run_on_device.sh there, carrying .device-bin.
#   tests/gpu/build_bundle.sh                    # the working tree -> .device-bin
#   tests/gpu/build_bundle.sh --base COMMIT      # also `flux2` of COMMIT -> .device-bin-base, for
#                                                # run_on_device.sh's same-run before/after benches
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
base=""
[[ "${1:-}" == "--base" ]] && base="${2:?--base needs a commit}"
# ccache (when installed) keys on paths relative to each tree, so the base build reuses objects.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="$(dirname "$repo")"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi

# Builds `targets` of the tree at $1 into $2 and packs them (and their libraries) into $3.
bundle() {
  local tree=$1 build=$2 out=$3
  shift 3
  local targets=("$@")
  # A new build folder compiles CUDA for sm_90a only; an existing one keeps its settings (e.g.
  # build/, whose 90a+100a objects run on the H200 too), so nothing is rebuilt for the bundle.
  local arch=()
  [[ -f $build/CMakeCache.txt ]] || arch=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a)
  cmake -S "$tree" -B "$build" -G Ninja "${arch[@]}" "${launcher[@]}" >/dev/null
  cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
  rm -rf "$out" && mkdir -p "$out/bin" "$out/lib"
  for t in "${targets[@]}"; do
    cp "$build/bin/$t" "$out/bin/"
    strip "$out/bin/$t"
  done
  # Shared libraries outside glibc, libstdc++/libgcc and CUDA (those exist on the GPU machine).
  for t in "${targets[@]}"; do ldd "$build/bin/$t"; done | awk '/=> \//{print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|libcuda|libcudart|libcudnn|libcublas|libnv' |
    while read -r lib; do cp -L "$lib" "$out/lib/"; done
  strip --strip-unneeded "$out"/lib/* 2>/dev/null || true
  # The device run carries at most 64 MiB with the tree: compress; run_on_device.sh unpacks. Every
  # executable holds the same CUDA kernels; a dictionary larger than the whole tar (not xz's
  # default 8 MiB) stores them once: 13 executables 33 -> 5.7 MB.
  tar -C "$out" -cf - lib | xz -T1 --lzma2=preset=6,dict=512MiB >"$out/lib.tar.xz" && rm -rf "$out/lib"
  tar -C "$out" -cf - bin | xz -T1 --lzma2=preset=6,dict=512MiB >"$out/bin.tar.xz" && rm -rf "$out/bin"
  du -sh "$out"
}

# $BUNDLE_TARGETS (space-separated) picks a subset.
default_targets="flux2 flux2_server flux2_make_random_checkpoint gpu_op_test gpu_backend_ops_test
  gpu_fast_path_fallback_test gpu_quantize_test gpu_quality_high_test gpu_server_test
  gpu_pipeline_fast_paths_test gpu_exposer_cublaslt_test gpu_fp8_accumulation_test
  gpu_flash_attention_fp8_test gpu_flash_attention_fp8_keys_test gpu_fp8_rows_test
  gpu_text_encoder_streaming_test
  flux2_prepare_reference gpu_soak gpu_gemm_algorithm_table_test gpu_step_cache_test
  gpu_fp8_stored_weight_test gpu_nccl_communicator_test"
read -r -a targets <<<"$(echo ${BUNDLE_TARGETS:-$default_targets})"
bundle "$repo" "${BUILD_DIR:-$repo/build-gpu}" "$repo/.device-bin" "${targets[@]}"
# tokenizer.json is not in git (installed from npm): the tests and benches need it there.
xz -c "$repo/tests/data/tiny-klein/checkpoint/tokenizer/tokenizer.json" >"$repo/.device-bin/tokenizer.json.xz"

if [[ -n "$base" ]]; then
  tree="$(dirname "$repo")/flux2-base"
  [[ -d "$tree" ]] || git -C "$repo" worktree add --detach "$tree" "$base" >/dev/null
  git -C "$tree" checkout --quiet --detach "$base"
  bundle "$tree" "$tree/build-gpu" "$repo/.device-bin-base" flux2
fi
