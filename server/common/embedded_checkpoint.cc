// The embedded checkpoint's directory; see embedded_checkpoint.h.
// Tested by tests/host/small_units_test.cc.
#include "server/common/embedded_checkpoint.h"

#include <filesystem>
#include <system_error>

#ifndef FLUX2_TINY_CHECKPOINT_DIR
#error "FLUX2_TINY_CHECKPOINT_DIR must be defined by the build"
#endif

namespace flux2 {

std::string installed_checkpoint_dir(const std::string& exe_path) {
  const std::filesystem::path prefix = std::filesystem::path(exe_path).parent_path().parent_path();
  return (prefix / "share" / "flux2" / "tiny-klein" / "checkpoint").string();
}

std::string embedded_checkpoint_dir() {
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    const std::string installed = installed_checkpoint_dir(exe.string());
    if (std::filesystem::is_directory(installed, error)) return installed;
  }
  return FLUX2_TINY_CHECKPOINT_DIR;
}

}  // namespace flux2
