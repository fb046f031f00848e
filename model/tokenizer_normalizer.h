// The "normalizer" of a tokenizer.json: Unicode normalization forms (NFC, NFD, NFKC, NFKD) and
// sequences of them, through utf8proc. Tested by tests/host/tokenizer_test.cc (Normalizer*).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace flux2 {

class TokenizerNormalizer {
 public:
  // From the "normalizer" value (null means none); `source` names the file in errors. Other
  // normalizer types are rejected with an error naming them.
  static absl::StatusOr<TokenizerNormalizer> from_json(const nlohmann::json& normalizer,
                                                       absl::string_view source);

  // `text` (valid UTF-8) normalized by each form in turn.
  std::string apply(absl::string_view text) const;
  bool is_identity() const { return forms_.empty(); }

 private:
  enum class Form {
    kNfc,   // canonical decomposition, then canonical composition
    kNfd,   // canonical decomposition
    kNfkc,  // compatibility decomposition, then canonical composition
    kNfkd,  // compatibility decomposition
  };
  static absl::Status append_forms(const nlohmann::json& normalizer, absl::string_view source,
                                   std::vector<Form>* forms);
  std::vector<Form> forms_;
};

}  // namespace flux2
