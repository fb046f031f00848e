// Helpers the libFuzzer targets of tests/fuzz share: a scratch directory per process and a file
// writer, for parsers that read paths. Run by tests/fuzz/run_fuzzers.sh.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

namespace flux2::fuzz {

// A directory of this process's own (mkdtemp under $TMPDIR or /tmp), made on first use.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr ? tmp : "/tmp") + "/flux2-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    return pattern;
  }();
  return dir;
}

// Replaces `path` with `size` bytes of `data`.
inline void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

}  // namespace flux2::fuzz
