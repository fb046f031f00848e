// The whole of a file as bytes: how every layer reads the files a user names (JSON configs,
// reference images, TLS certificates, GEMM tables). Tested by tests/host/small_units_test.cc.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace flux2 {

// NotFound "<what>: cannot read <path>" when the file cannot be opened (`what`: the flag or field
// that named the file; without it, "cannot read <path>").
inline absl::StatusOr<std::string> read_file(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  const std::streamoff size = in ? static_cast<std::streamoff>(in.tellg()) : -1;
  std::string bytes;
  if (size >= 0) {  // a regular file: one read into a string of its size
    bytes.resize(static_cast<size_t>(size));
    in.seekg(0);
    in.read(bytes.data(), size);
  } else if (in) {  // a pipe or device: whatever it gives
    in.clear();
    std::ostringstream stream;
    stream << in.rdbuf();
    bytes = std::move(stream).str();
  }
  if (!in) {
    return absl::NotFoundError(absl::StrCat(what, what.empty() ? "" : ": ", "cannot read ", path));
  }
  return bytes;
}

}  // namespace flux2
