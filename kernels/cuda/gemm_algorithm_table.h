// Tuned cuBLASLt algorithms per GEMM shape (--gemm-algorithms): a JSON table, one section per GPU
// name and cuBLASLt version, mapping a plan's key (shape, leading dimensions, alignment classes,
// operand format) to the algorithm's serialized bytes (cuBLASLt documents cublasLtMatmulAlgo_t as
// trivially serializable for the same library version). `flux2 bench --tune-gemm FILE` writes it;
// the build embeds kernels/cuda/gemm_algorithms.json (measured on the H200). The same table gives
// the same algorithm, so the same bits, in every process. Host-only; tested by
// tests/cuda/gemm_algorithm_table_test.cc (parsing, in CI; on the GPU, a table replayed).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace flux2::cuda {

// cublasLtMatmulAlgo_t's bytes (uint64_t data[8]).
using GemmAlgorithmBits = std::array<uint64_t, 8>;

struct GemmAlgorithmEntry {
  GemmAlgorithmBits algorithm{};
  double tuned_ms = 0.0;      // the chosen algorithm's time when tuned (documentation only)
  double heuristic_ms = 0.0;  // the heuristic's first choice at the same time (documentation only)
};

// One GPU's and cuBLASLt version's algorithms, by plan key (Gemm::key_string: "m=4608 n=27648
// ...").
struct GemmAlgorithmTable {
  std::string device;  // cudaDeviceProp::name, e.g. "NVIDIA H200"
  size_t cublaslt_version = 0;
  std::map<std::string, GemmAlgorithmEntry> entries;
};

// The section of `json` (a gemm_algorithms.json document) for `device` and `cublaslt_version`;
// an empty table when the document has none. InvalidArgument naming the offending entry when the
// document is malformed.
absl::StatusOr<GemmAlgorithmTable> parse_gemm_algorithms(std::string_view json,
                                                         std::string_view device,
                                                         size_t cublaslt_version);

// `existing` (a gemm_algorithms.json document, or "" for none) with `table`'s entries added to its
// section, replacing entries of the same key: the text --tune-gemm writes.
absl::StatusOr<std::string> merge_gemm_algorithms(std::string_view existing,
                                                  const GemmAlgorithmTable& table);

// The table embedded at build time (kernels/cuda/gemm_algorithms.json).
std::string_view builtin_gemm_algorithms();

}  // namespace flux2::cuda
