// Host test helpers; see test_util.h.
#include "tests/host/test_util.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace flux2::testing {
namespace fs = std::filesystem;

std::string test_data_dir() {
  // The GPU machine runs a copy of the tree elsewhere (tests/gpu/run_on_device.sh sets it).
  const char* moved = std::getenv("FLUX2_TEST_DATA");
  return moved != nullptr ? moved : FLUX2_TEST_DATA;
}

TempDir::TempDir() {
  std::string pattern = (fs::temp_directory_path() / "flux2_test_XXXXXX").string();
  char* made = ::mkdtemp(pattern.data());
  if (made == nullptr) std::abort();
  path_ = made;
}

TempDir::~TempDir() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

void copy_tree(const std::string& from, const std::string& to) {
  fs::copy(from, to, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  for (const auto& entry : fs::recursive_directory_iterator(to)) {
    fs::permissions(entry.path(), fs::perms::owner_write, fs::perm_options::add);
  }
}

RawTensor f32_tensor(std::vector<int64_t> shape, const std::vector<float>& values) {
  RawTensor t;
  t.dtype = "F32";
  t.shape = std::move(shape);
  t.bytes.resize(values.size() * sizeof(float));
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

void write_raw_safetensors(const std::string& path, const std::string& header_json,
                           const std::vector<uint8_t>& data, int64_t declared_header_length) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t length = declared_header_length < 0
                              ? header_json.size()
                              : static_cast<uint64_t>(declared_header_length);
  out.write(reinterpret_cast<const char*>(&length), sizeof(length));
  out.write(header_json.data(), static_cast<std::streamsize>(header_json.size()));
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

void write_safetensors(const std::string& path, const std::map<std::string, RawTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  if (!flux2::write_safetensors(path, tensors, metadata).ok()) std::abort();
}

std::map<std::string, RawTensor> read_all_tensors(const std::string& path) {
  auto file = SafetensorsFile::open(path);
  if (!file.ok()) std::abort();
  std::map<std::string, RawTensor> tensors;
  for (const SafetensorsEntry& entry : (*file)->entries()) {
    RawTensor t;
    t.dtype = std::string(dtype_name(entry.dtype));
    t.shape.assign(entry.shape.begin(), entry.shape.end());
    const auto* bytes = static_cast<const uint8_t*>((*file)->data(entry));
    t.bytes.assign(bytes, bytes + entry.bytes());
    tensors[entry.name] = std::move(t);
  }
  return tensors;
}

std::vector<float> download(Backend& backend, const Tensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.numel()));
  const absl::Status status = backend.download(tensor, values.data());
  if (!status.ok()) {  // no gtest here (tools link this library): a failed download ends the test
    std::fprintf(stderr, "download %s: %s\n", tensor.describe().c_str(),
                 std::string(status.message()).c_str());
    std::abort();
  }
  return values;
}

Flux2Config twelve_head_config() {
  Flux2Config c;
  c.num_attention_heads = 12;
  c.attention_head_dim = 8;
  c.axes_dims_rope = {2, 2, 2, 2};
  c.num_layers = 2;
  c.num_single_layers = 2;
  c.joint_attention_dim = 16;
  c.in_channels = 8;
  c.out_channels = 8;
  c.timestep_guidance_channels = 16;
  c.guidance_embeds = false;
  return c;
}

Flux2Config two_head_config() {
  Flux2Config c;
  c.num_attention_heads = 2;
  c.attention_head_dim = 8;
  c.num_layers = 1;
  c.num_single_layers = 1;
  c.joint_attention_dim = 16;
  c.in_channels = 8;
  c.out_channels = 8;
  c.guidance_embeds = false;
  return c;
}

}  // namespace flux2::testing
