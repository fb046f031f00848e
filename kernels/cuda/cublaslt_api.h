// cuBLASLt loaded at run time with dlopen: linking libcublasLt into the same binary as
// prometheus-cpp's Exposer breaks civetweb's thread creation (cuBLASLt's ~94 KB static TLS segment
// does not fit the small fixed stacks civetweb gives its threads, so pthread_create fails).
// Host-only; tested by tests/cuda/exposer_cublaslt_test.cc and tests/cuda/op_cases.cc
// (gpu_op_test).
#pragma once

#include <cublasLt.h>

#include "absl/status/statusor.h"

namespace flux2::cuda {

// The cuBLASLt entry points the project uses, resolved once per process.
struct CublasLtApi {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtGetVersion) get_version;
  decltype(&cublasLtMatmulDescCreate) matmul_desc_create;
  decltype(&cublasLtMatmulDescDestroy) matmul_desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) matmul_desc_set_attribute;
  decltype(&cublasLtMatrixLayoutCreate) matrix_layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) matrix_layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set_attribute;
  decltype(&cublasLtMatmulAlgoGetHeuristic) algo_get_heuristic;
  decltype(&cublasLtMatmulAlgoCheck) algo_check;
  decltype(&cublasLtMatmulAlgoConfigGetAttribute) algo_config_get_attribute;
  decltype(&cublasLtMatmul) matmul;
};

// Loads libcublasLt.so.13 (RTLD_LOCAL) on first use; Unavailable with dlerror() when it cannot.
absl::StatusOr<const CublasLtApi*> cublaslt_api();

}  // namespace flux2::cuda
