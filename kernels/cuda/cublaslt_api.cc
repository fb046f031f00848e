// dlopen-based cuBLASLt loader; see cublaslt_api.h.
#include "kernels/cuda/cublaslt_api.h"

#include <dlfcn.h>

#include <mutex>

#include "absl/strings/str_cat.h"

namespace flux2::cuda {
namespace {

absl::StatusOr<CublasLtApi> load() {
  void* library = nullptr;
  for (const char* name : {"libcublasLt.so.13", "libcublasLt.so"}) {
    library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) break;
  }
  if (library == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot load cuBLASLt: ", dlerror()));
  }
  CublasLtApi api{};
  absl::Status status;
  auto resolve = [&](auto& slot, const char* symbol) {
    void* address = dlsym(library, symbol);
    if (address == nullptr && status.ok()) {
      status = absl::FailedPreconditionError(absl::StrCat("cuBLASLt has no symbol ", symbol));
    }
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(address);
  };
  resolve(api.create, "cublasLtCreate");
  resolve(api.destroy, "cublasLtDestroy");
  resolve(api.get_version, "cublasLtGetVersion");
  resolve(api.matmul_desc_create, "cublasLtMatmulDescCreate");
  resolve(api.matmul_desc_destroy, "cublasLtMatmulDescDestroy");
  resolve(api.matmul_desc_set_attribute, "cublasLtMatmulDescSetAttribute");
  resolve(api.matrix_layout_create, "cublasLtMatrixLayoutCreate");
  resolve(api.matrix_layout_destroy, "cublasLtMatrixLayoutDestroy");
  resolve(api.preference_create, "cublasLtMatmulPreferenceCreate");
  resolve(api.preference_destroy, "cublasLtMatmulPreferenceDestroy");
  resolve(api.preference_set_attribute, "cublasLtMatmulPreferenceSetAttribute");
  resolve(api.algo_get_heuristic, "cublasLtMatmulAlgoGetHeuristic");
  resolve(api.algo_check, "cublasLtMatmulAlgoCheck");
  resolve(api.algo_config_get_attribute, "cublasLtMatmulAlgoConfigGetAttribute");
  resolve(api.matmul, "cublasLtMatmul");
  if (!status.ok()) return status;
  return api;
}

}  // namespace

absl::StatusOr<const CublasLtApi*> cublaslt_api() {
  static std::once_flag once;
  static absl::StatusOr<CublasLtApi> api = absl::UnknownError("not loaded");
  std::call_once(once, [] { api = load(); });
  if (!api.ok()) return api.status();
  return &*api;
}

}  // namespace flux2::cuda
