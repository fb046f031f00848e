// The tuned GEMM algorithm table's JSON form; see gemm_algorithm_table.h. Tested by
// tests/cuda/gemm_algorithm_table_test.cc.
#include "kernels/cuda/gemm_algorithm_table.h"

#include <cinttypes>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace flux2::cuda {
namespace {

using nlohmann::json;

std::string bits_string(const GemmAlgorithmBits& bits) {
  std::string out;
  for (uint64_t word : bits) {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016" PRIx64, word);
    absl::StrAppend(&out, out.empty() ? "" : " ", hex);
  }
  return out;
}

absl::StatusOr<GemmAlgorithmBits> parse_bits(const std::string& text) {
  const std::vector<std::string> words = absl::StrSplit(text, ' ', absl::SkipEmpty());
  GemmAlgorithmBits bits{};
  if (words.size() != bits.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", bits.size(), " hexadecimal words, got ", words.size()));
  }
  for (size_t i = 0; i < bits.size(); ++i) {
    if (words[i].size() > 16 || !absl::SimpleHexAtoi(words[i], &bits[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", words[i], "\" is not a 64-bit hex word"));
    }
  }
  return bits;
}

absl::StatusOr<json> parse_document(std::string_view text) {
  if (text.empty()) return json{{"tables", json::array()}};
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("tables") ||
      !doc["tables"].is_array()) {
    return absl::InvalidArgumentError(
        "a GEMM algorithm table is a JSON object with a \"tables\" array");
  }
  for (const json& section : doc["tables"]) {
    if (!section.is_object() || !section.contains("device") || !section["device"].is_string() ||
        !section.contains("cublaslt_version") ||
        !section["cublaslt_version"].is_number_unsigned() || !section.contains("algorithms") ||
        !section["algorithms"].is_object()) {
      return absl::InvalidArgumentError(
          "each table needs \"device\" (string), \"cublaslt_version\" (unsigned) and "
          "\"algorithms\" (object)");
    }
  }
  return doc;
}

}  // namespace

absl::StatusOr<GemmAlgorithmTable> parse_gemm_algorithms(std::string_view text,
                                                         std::string_view device,
                                                         size_t cublaslt_version) {
  absl::StatusOr<json> doc = parse_document(text);
  if (!doc.ok()) return doc.status();
  GemmAlgorithmTable table{std::string(device), cublaslt_version, {}};
  for (const json& section : (*doc)["tables"]) {
    if (section["device"] != device || section["cublaslt_version"] != cublaslt_version) continue;
    for (const auto& [key, value] : section["algorithms"].items()) {
      if (!value.is_object() || !value.contains("algorithm") || !value["algorithm"].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("algorithms[\"", key, "\"]: needs \"algorithm\" (a string)"));
      }
      absl::StatusOr<GemmAlgorithmBits> bits = parse_bits(value["algorithm"].get<std::string>());
      if (!bits.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("algorithms[\"", key, "\"].algorithm: ", bits.status().message()));
      }
      GemmAlgorithmEntry& entry = table.entries[key];
      entry.algorithm = *bits;
      entry.tuned_ms = value.value("tuned_ms", 0.0);
      entry.heuristic_ms = value.value("heuristic_ms", 0.0);
    }
  }
  return table;
}

absl::StatusOr<std::string> merge_gemm_algorithms(std::string_view existing,
                                                  const GemmAlgorithmTable& table) {
  absl::StatusOr<json> doc = parse_document(existing);
  if (!doc.ok()) return doc.status();
  json* section = nullptr;
  for (json& s : (*doc)["tables"]) {
    if (s["device"] == table.device && s["cublaslt_version"] == table.cublaslt_version)
      section = &s;
  }
  if (section == nullptr) {
    (*doc)["tables"].push_back(json{{"device", table.device},
                                    {"cublaslt_version", table.cublaslt_version},
                                    {"algorithms", json::object()}});
    section = &(*doc)["tables"].back();
  }
  for (const auto& [key, entry] : table.entries) {
    (*section)["algorithms"][key] = json{{"algorithm", bits_string(entry.algorithm)},
                                         {"tuned_ms", entry.tuned_ms},
                                         {"heuristic_ms", entry.heuristic_ms}};
  }
  return doc->dump(1) + "\n";
}

}  // namespace flux2::cuda
