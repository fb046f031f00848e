#!/usr/bin/env bash
# The format check of tests/run_all.sh: every tracked C++/CUDA source (tests/data excepted) as
# .clang-format (Google base, 100 columns) lays it out. Fix with:
#   git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | grep -v '^tests/data/' | xargs clang-format -i
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | grep -v '^tests/data/')
clang-format --dry-run --Werror "${files[@]}"
echo "check_format: ${#files[@]} files formatted as .clang-format says"
