// Reading JSON files and typed config fields with errors that name the file and the field, and
// writing JSON that never throws. Tested through the config tests in tests/host/checkpoint_test.cc
// and the server's JSON bodies and log lines (tests/server/openai_images_test.cc, log_test.cc).
#pragma once

#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace flux2 {

absl::StatusOr<nlohmann::json> read_json_file(const std::string& path);

// Compact JSON text that never throws: invalid UTF-8 (from a client's prompt, say) is replaced by
// U+FFFD instead of raising an exception.
std::string dump_json(const nlohmann::json& value);

// Reads fields of one JSON object (a config.json); `source` names it in errors.
class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, std::string source)
      : object_(object), source_(std::move(source)) {}

  // Each reader leaves *out unchanged when the key is absent or null, unless `required`.
  absl::Status read(absl::string_view key, int64_t* out, bool required = false) const;
  absl::Status read(absl::string_view key, double* out, bool required = false) const;
  absl::Status read(absl::string_view key, bool* out, bool required = false) const;
  absl::Status read(absl::string_view key, std::string* out, bool required = false) const;
  absl::Status read(absl::string_view key, std::vector<int64_t>* out, bool required = false) const;

  const std::string& source() const { return source_; }

 private:
  // The value at key, or null when absent; errors when required and absent.
  absl::StatusOr<const nlohmann::json*> find(absl::string_view key, bool required) const;
  absl::Status type_error(absl::string_view key, absl::string_view expected) const;

  const nlohmann::json& object_;
  std::string source_;
};

}  // namespace flux2
