// A defensive, memory-mapped safetensors reader: validates the header length, every
// tensor's dtype, shape, byte span and name, and names the file and tensor in every error; and a
// writer (test files, bench adapters). Tested by tests/host/safetensors_test.cc, including
// corrupt files.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "kernels/base/tensor.h"

namespace flux2 {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  int64_t begin = 0;  // byte offset of the first element, relative to the data section
  int64_t end = 0;    // one past the last byte
  int64_t bytes() const { return end - begin; }
};

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates its header; errors name the file (and tensor).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // Validates a whole file's bytes held in memory (not copied: `bytes` must outlive the result);
  // errors start with "`label`: " unless `label` is empty.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> from_bytes(std::span<const uint8_t> bytes,
                                                                     const std::string& label);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Entries in the order of their data offsets.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  // The entry called `name`, or null.
  const SafetensorsEntry* find(absl::string_view name) const;
  // The entry's bytes inside the mapping (valid while this object lives).
  const void* data(const SafetensorsEntry& entry) const;
  // The optional "__metadata__" string map.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  // Validates the header of the `file_bytes` bytes at `base` and indexes the tensors.
  absl::Status parse(const char* base, uint64_t file_bytes);

  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  const char* data_section_ = nullptr;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: its safetensors dtype ("F32", "BF16", ...), shape and little-endian bytes.
struct SafetensorsBlob {
  std::string dtype = "F32";
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Writes a safetensors file holding `tensors` (data in name order) and `metadata`; errors name
// the path.
absl::Status write_safetensors(const std::string& path,
                               const std::map<std::string, SafetensorsBlob>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

// Reads a whole tensor as f32 (widening bf16/f16/integers); for goldens and tests.
absl::StatusOr<std::vector<float>> read_f32(const SafetensorsFile& file, absl::string_view name);

}  // namespace flux2
