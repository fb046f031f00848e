// Helpers shared by the host tests: temporary directories, copying a checkpoint, writing
// (possibly corrupt) safetensors files, and a small transformer config.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/base/tensor.h"
#include "model/flux2_config.h"
#include "model/safetensors.h"

namespace flux2::testing {

// The tests/data directory: $FLUX2_TEST_DATA when set (the GPU machine runs a copy of the tree
// elsewhere), else the path compiled in.
std::string test_data_dir();

// A fresh directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Recursively copies `from` to `to` (files become writable).
void copy_tree(const std::string& from, const std::string& to);

// One tensor for write_safetensors: raw bytes plus the header fields.
using RawTensor = SafetensorsBlob;

RawTensor f32_tensor(std::vector<int64_t> shape, const std::vector<float>& values);

// Writes a valid safetensors file (tensors in name order), with a __metadata__ string map when
// `metadata` is not empty.
void write_safetensors(const std::string& path, const std::map<std::string, RawTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes `header_json` preceded by `declared_header_length` (defaults to its real size) and
// followed by `data`: for corrupt-file tests.
void write_raw_safetensors(const std::string& path, const std::string& header_json,
                           const std::vector<uint8_t>& data, int64_t declared_header_length = -1);

// A tensor's values as host floats (a failed download aborts the test with its reason).
std::vector<float> download(Backend& backend, const Tensor& tensor);

// Reads every tensor of a safetensors file back as RawTensor (for edit-and-rewrite tests).
std::map<std::string, RawTensor> read_all_tensors(const std::string& path);

// A small transformer of 12 heads of 8 (sequence parallelism over 2, 3, 4, 6 and 12 ranks), two
// double and two single blocks, no guidance embedding.
Flux2Config twelve_head_config();
// The smallest transformer: 2 heads of 8, one double and one single block, no guidance embedding
// (the LoRA tests).
Flux2Config two_head_config();

}  // namespace flux2::testing
