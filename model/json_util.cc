// JSON file reading and typed field access; see json_util.h.
#include "model/json_util.h"

#include "absl/strings/str_cat.h"
#include "kernels/base/read_file.h"
#include "kernels/base/status.h"

namespace flux2 {

std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::StatusOr<nlohmann::json> read_json_file(const std::string& path) {
  FLUX_ASSIGN_OR_RETURN(const std::string text, read_file(path, ""));
  nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  return value;
}

absl::StatusOr<const nlohmann::json*> JsonFields::find(absl::string_view key, bool required) const {
  const std::string name(key);
  if (!object_.is_object() || !object_.contains(name) || object_[name].is_null()) {
    if (required) {
      return absl::InvalidArgumentError(absl::StrCat(source_, ": missing field \"", key, "\""));
    }
    return nullptr;
  }
  return &object_[name];
}

absl::Status JsonFields::type_error(absl::string_view key, absl::string_view expected) const {
  return absl::InvalidArgumentError(
      absl::StrCat(source_, ": field \"", key, "\" is not ", expected));
}

absl::Status JsonFields::read(absl::string_view key, int64_t* out, bool required) const {
  FLUX_ASSIGN_OR_RETURN(const nlohmann::json* value, find(key, required));
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_number_integer()) return type_error(key, "an integer");
  *out = value->get<int64_t>();
  return absl::OkStatus();
}

absl::Status JsonFields::read(absl::string_view key, double* out, bool required) const {
  FLUX_ASSIGN_OR_RETURN(const nlohmann::json* value, find(key, required));
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_number()) return type_error(key, "a number");
  *out = value->get<double>();
  return absl::OkStatus();
}

absl::Status JsonFields::read(absl::string_view key, bool* out, bool required) const {
  FLUX_ASSIGN_OR_RETURN(const nlohmann::json* value, find(key, required));
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_boolean()) return type_error(key, "a boolean");
  *out = value->get<bool>();
  return absl::OkStatus();
}

absl::Status JsonFields::read(absl::string_view key, std::string* out, bool required) const {
  FLUX_ASSIGN_OR_RETURN(const nlohmann::json* value, find(key, required));
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_string()) return type_error(key, "a string");
  *out = value->get<std::string>();
  return absl::OkStatus();
}

absl::Status JsonFields::read(absl::string_view key, std::vector<int64_t>* out,
                              bool required) const {
  FLUX_ASSIGN_OR_RETURN(const nlohmann::json* value, find(key, required));
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_array()) return type_error(key, "an array of integers");
  std::vector<int64_t> values;
  for (const auto& item : *value) {
    if (!item.is_number_integer()) return type_error(key, "an array of integers");
    values.push_back(item.get<int64_t>());
  }
  *out = std::move(values);
  return absl::OkStatus();
}

}  // namespace flux2
