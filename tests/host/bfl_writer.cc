// diffusers -> BFL transformer files; see bfl_writer.h.
// Tested by tests/host/bfl_checkpoint_test.cc.
#include "tests/host/bfl_writer.h"

#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "model/bfl_checkpoint.h"
#include "model/flux2_config.h"
#include "model/flux2_weights.h"
#include "model/weight_loader.h"
#include "nlohmann/json.hpp"

namespace flux2::testing {

absl::Status write_bfl_transformer(const ComponentWeights& diffusers, const std::string& path,
                                   const std::string& prefix) {
  FLUX_ASSIGN_OR_RETURN(const Flux2Config config,
                        Flux2Config::from_json(diffusers.config(), diffusers.config_path()));
  Flux2Weights weights;
  FLUX_RETURN_IF_ERROR(validate_weights(diffusers, weights.table(config), nullptr));
  const std::vector<BflTensor> layout = bfl_transformer_tensors(config);

  // The header first: every tensor's dtype (its parts must agree) and its span, in layout order.
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const BflTensor& tensor : layout) {
    const DType dtype = diffusers.find(tensor.parts.front().diffusers_name)->entry->dtype;
    for (const BflRows& part : tensor.parts) {
      const DType part_dtype = diffusers.find(part.diffusers_name)->entry->dtype;
      if (part_dtype != dtype) {
        return absl::InvalidArgumentError(
            absl::StrCat(diffusers.dir(), ": ", tensor.name, " would join ", dtype_name(dtype),
                         " and ", dtype_name(part_dtype), " (", part.diffusers_name, ")"));
      }
    }
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(tensor.shape) * dtype_size(dtype));
    header[prefix + tensor.name] = {
        {"dtype", std::string(dtype_name(dtype))},
        {"shape", std::vector<int64_t>(tensor.shape.begin(), tensor.shape.end())},
        {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // 8-byte aligned data, as the hub files are

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t length = text.size();
  out.write(reinterpret_cast<const char*>(&length), sizeof(length));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  // Then the rows, in the same order: each part is a run of rows of one diffusers tensor.
  for (const BflTensor& tensor : layout) {
    for (const BflRows& part : tensor.parts) {
      const TensorRef& ref = *diffusers.find(part.diffusers_name);
      const int64_t row_bytes = ref.entry->bytes() / ref.entry->shape[0];
      out.write(static_cast<const char*>(ref.data()) + part.diffusers_row * row_bytes,
                static_cast<std::streamsize>(part.rows * row_bytes));
    }
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace flux2::testing
