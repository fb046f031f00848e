// Unicode normalization for the tokenizer through utf8proc; see tokenizer_normalizer.h.
// Tested by tests/host/tokenizer_test.cc (Normalizer*) and the NFC/NFD pairs of the corpus.
#include "model/tokenizer_normalizer.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "utf8proc.h"

namespace flux2 {
namespace {

bool is_ascii(absl::string_view text) {
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace

absl::Status TokenizerNormalizer::append_forms(const nlohmann::json& normalizer,
                                               absl::string_view source, std::vector<Form>* forms) {
  if (normalizer.is_null()) return absl::OkStatus();
  if (!normalizer.is_object() || !normalizer.contains("type") || !normalizer["type"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": normalizer has no \"type\""));
  }
  const std::string type = normalizer["type"].get<std::string>();
  if (type == "NFC") {
    forms->push_back(Form::kNfc);
  } else if (type == "NFD") {
    forms->push_back(Form::kNfd);
  } else if (type == "NFKC") {
    forms->push_back(Form::kNfkc);
  } else if (type == "NFKD") {
    forms->push_back(Form::kNfkd);
  } else if (type == "Sequence") {
    if (!normalizer.contains("normalizers") || !normalizer["normalizers"].is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": normalizer Sequence has no \"normalizers\" array"));
    }
    for (const nlohmann::json& inner : normalizer["normalizers"]) {
      if (absl::Status status = append_forms(inner, source, forms); !status.ok()) return status;
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": unsupported normalizer type \"", type, "\""));
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenizerNormalizer> TokenizerNormalizer::from_json(const nlohmann::json& normalizer,
                                                                   absl::string_view source) {
  TokenizerNormalizer result;
  if (absl::Status status = append_forms(normalizer, source, &result.forms_); !status.ok()) {
    return status;
  }
  return result;
}

std::string TokenizerNormalizer::apply(absl::string_view text) const {
  std::string current(text);
  // Every form maps ASCII to itself.
  if (forms_.empty() || is_ascii(current)) return current;
  for (const Form form : forms_) {
    int options = UTF8PROC_STABLE;
    switch (form) {
      case Form::kNfc:
        options |= UTF8PROC_COMPOSE;
        break;
      case Form::kNfd:
        options |= UTF8PROC_DECOMPOSE;
        break;
      case Form::kNfkc:
        options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
        break;
      case Form::kNfkd:
        options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
        break;
    }
    utf8proc_uint8_t* mapped = nullptr;
    // An explicit length (no UTF8PROC_NULLTERM) keeps U+0000 characters.
    const utf8proc_ssize_t length =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(current.data()),
                     static_cast<utf8proc_ssize_t>(current.size()), &mapped,
                     static_cast<utf8proc_option_t>(options));
    // utf8proc fails only on invalid UTF-8 or out of memory; the text was repaired before, so
    // the text is left as it is rather than failing the request.
    if (length >= 0 && mapped != nullptr) {
      current.assign(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
    }
    std::free(mapped);
  }
  return current;
}

}  // namespace flux2
