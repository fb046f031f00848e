// Memory-mapped safetensors reader with full header validation; see safetensors.h.
// Tested by tests/host/safetensors_test.cc.
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/base/status.h"
#include "nlohmann/json.hpp"

namespace flux2 {
namespace {

// A header larger than this is certainly corrupt (real headers are well under 1 MiB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// An empty `path` (bytes parsed from memory without a label) leaves the "path: " prefix out.
absl::Status file_error(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(path.empty() ? std::string(what)
                                                 : absl::StrCat(path, ": ", what));
}

absl::Status tensor_error(const std::string& path, absl::string_view name, absl::string_view what) {
  return file_error(path, absl::StrCat("tensor \"", name, "\": ", what));
}

// Parses the JSON header, rejecting duplicate top-level names (nlohmann would keep the last).
absl::StatusOr<nlohmann::json> parse_header(const std::string& path, absl::string_view text) {
  std::set<std::string> seen;
  std::string duplicate;
  auto on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key) {
      const std::string key = parsed.get<std::string>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  nlohmann::json header = nlohmann::json::parse(text.begin(), text.end(), on_event,
                                                /*allow_exceptions=*/false);
  if (header.is_discarded()) return file_error(path, "header is not valid JSON");
  if (!header.is_object()) return file_error(path, "header is not a JSON object");
  if (!duplicate.empty()) return tensor_error(path, duplicate, "name appears more than once");
  return header;
}

absl::StatusOr<SafetensorsEntry> parse_entry(const std::string& path, const std::string& name,
                                             const nlohmann::json& value, int64_t data_bytes) {
  if (!value.is_object()) return tensor_error(path, name, "entry is not an object");
  if (!value.contains("dtype") || !value["dtype"].is_string()) {
    return tensor_error(path, name, "missing string \"dtype\"");
  }
  SafetensorsEntry entry;
  entry.name = name;
  auto dtype = dtype_from_name(value["dtype"].get<std::string>());
  if (!dtype.ok()) return tensor_error(path, name, dtype.status().message());
  entry.dtype = *dtype;
  if (!value.contains("shape") || !value["shape"].is_array()) {
    return tensor_error(path, name, "missing array \"shape\"");
  }
  for (const auto& dim : value["shape"]) {
    if (!dim.is_number_integer() || dim.get<int64_t>() < 0) {
      return tensor_error(path, name, absl::StrCat("bad shape ", value["shape"].dump()));
    }
    entry.shape.push_back(dim.get<int64_t>());
  }
  const auto& offsets = value.contains("data_offsets") ? value["data_offsets"] : nlohmann::json();
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return tensor_error(path, name, "\"data_offsets\" is not a pair of non-negative integers");
  }
  const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
  if (begin > end || end > static_cast<uint64_t>(data_bytes)) {
    return tensor_error(path, name,
                        absl::StrCat("data_offsets [", begin, ", ", end,
                                     "] lie outside the data section of ", data_bytes, " bytes"));
  }
  entry.begin = static_cast<int64_t>(begin);
  entry.end = static_cast<int64_t>(end);
  // Overflow-safe: every dimension is bounded by the byte span once the product is checked.
  __int128 expected = dtype_size(entry.dtype);
  for (int64_t dim : entry.shape) expected *= dim;
  if (expected != static_cast<__int128>(entry.bytes())) {
    return tensor_error(
        path, name,
        absl::StrCat("shape ", shape_string(entry.shape), " of ", dtype_name(entry.dtype),
                     " needs ", static_cast<int64_t>(std::min<__int128>(expected, INT64_MAX)),
                     " bytes but data_offsets span ", entry.bytes()));
  }
  return entry;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    ::close(fd);
    return file_error(path, absl::StrCat("cannot stat: ", std::strerror(errno)));
  }
  const uint64_t file_bytes = static_cast<uint64_t>(info.st_size);
  if (file_bytes < 8) {
    ::close(fd);
    return file_error(path,
                      absl::StrCat("file of ", file_bytes, " bytes is too short for a header"));
  }
  void* mapping = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping == MAP_FAILED)
    return file_error(path, absl::StrCat("mmap failed: ", std::strerror(errno)));

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = mapping;
  file->mapping_size_ = file_bytes;
  FLUX_RETURN_IF_ERROR(file->parse(static_cast<const char*>(mapping), file_bytes));
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::from_bytes(
    std::span<const uint8_t> bytes, const std::string& label) {
  if (bytes.size() < 8) {
    return file_error(label,
                      absl::StrCat("file of ", bytes.size(), " bytes is too short for a header"));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = label;
  FLUX_RETURN_IF_ERROR(file->parse(reinterpret_cast<const char*>(bytes.data()),
                                   static_cast<uint64_t>(bytes.size())));
  return file;
}

absl::Status SafetensorsFile::parse(const char* base, uint64_t file_bytes) {
  const std::string& path = path_;
  uint64_t header_bytes;
  std::memcpy(&header_bytes, base, sizeof(header_bytes));  // little-endian on our targets
  if (header_bytes > kMaxHeaderBytes || header_bytes > file_bytes - 8) {
    return file_error(path, absl::StrCat("header length ", header_bytes,
                                         " exceeds the file size of ", file_bytes, " bytes"));
  }
  FLUX_ASSIGN_OR_RETURN(nlohmann::json header,
                        parse_header(path, absl::string_view(base + 8, header_bytes)));
  data_section_ = base + 8 + header_bytes;
  const int64_t data_bytes = static_cast<int64_t>(file_bytes - 8 - header_bytes);

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return file_error(path, "\"__metadata__\" is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) {
          return file_error(path, absl::StrCat("metadata \"", m.key(), "\" is not a string"));
        }
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    FLUX_ASSIGN_OR_RETURN(SafetensorsEntry entry,
                          parse_entry(path, it.key(), it.value(), data_bytes));
    entries_.push_back(std::move(entry));
  }
  std::sort(entries_.begin(), entries_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  // Sorted by offset, a tensor overlaps an earlier one iff it starts before the furthest end so
  // far.
  int64_t furthest_end = 0;
  const SafetensorsEntry* furthest = nullptr;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const SafetensorsEntry& entry = entries_[i];
    if (entry.bytes() > 0) {
      if (furthest != nullptr && entry.begin < furthest_end) {
        return tensor_error(
            path, entry.name,
            absl::StrCat("data_offsets [", entry.begin, ", ", entry.end, "] overlap tensor \"",
                         furthest->name, "\" [", furthest->begin, ", ", furthest->end, "]"));
      }
      if (entry.end > furthest_end) {
        furthest_end = entry.end;
        furthest = &entry;
      }
    }
    index_[entry.name] = i;
  }
  return absl::OkStatus();
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

const SafetensorsEntry* SafetensorsFile::find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const void* SafetensorsFile::data(const SafetensorsEntry& entry) const {
  return data_section_ + entry.begin;
}

absl::Status write_safetensors(const std::string& path,
                               const std::map<std::string, SafetensorsBlob>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const uint64_t end = offset + tensor.bytes.size();
    header[name] = {
        {"dtype", tensor.dtype}, {"shape", tensor.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  const std::string text = header.dump();
  const uint64_t length = text.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&length), sizeof(length));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& [name, tensor] : tensors) {
    out.write(reinterpret_cast<const char*>(tensor.bytes.data()),
              static_cast<std::streamsize>(tensor.bytes.size()));
  }
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat(path, ": cannot write the file"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> read_f32(const SafetensorsFile& file, absl::string_view name) {
  const SafetensorsEntry* entry = file.find(name);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat(file.path(), ": no tensor \"", name, "\""));
  }
  switch (entry->dtype) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kI64:
    case DType::kI32:
    case DType::kU8:
      break;
    default:
      return tensor_error(file.path(), name,
                          absl::StrCat("cannot read ", dtype_name(entry->dtype), " as f32"));
  }
  std::vector<float> values(static_cast<size_t>(shape_numel(entry->shape)));
  widen_to_f32(entry->dtype, file.data(*entry), static_cast<int64_t>(values.size()), values.data());
  return values;
}

}  // namespace flux2
