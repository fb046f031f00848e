// The HTTP API's LoRA extension; see openai_loras.h. Tested by tests/server/openai_images_test.cc.
#include "server/http/openai_loras.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace flux2::server {

using nlohmann::json;

namespace {

// One adapter object of `loras`.
void parse_one(const json& item, const std::string& field, std::vector<LoraSpec>* loras,
               std::vector<FieldViolation>* violations) {
  if (!item.is_object()) {
    violations->push_back({field, "must be an object {\"name\": ..., \"scale\": ...}"});
    return;
  }
  LoraSpec spec;
  bool named = false;       // spec.name holds a name or path given as a string
  bool name_given = false;  // a name or path given at all (a bad one is its own violation)
  for (const auto& [key, value] : item.items()) {
    const std::string member = absl::StrCat(field, ".", key);
    if (key == "name" || key == "path") {  // `path`: fal clients' name for it
      name_given = true;
      if (!value.is_string()) {
        violations->push_back({member, "must be a string"});
      } else if (named && spec.name != value.get<std::string>()) {
        violations->push_back({member, "differs from the adapter's other name / path"});
      } else {
        spec.name = value.get<std::string>();
        named = true;
      }
    } else if (key == "scale") {
      if (value.is_number()) {
        spec.scale = value.get<double>();
      } else {
        violations->push_back({member, "must be a number"});
      }
    } else if (key == "url") {
      violations->push_back({member,
                             "is not supported: adapters come by name from the server's "
                             "--lora-dir (GET /v1/loras lists them)"});
    } else {
      violations->push_back({member, "unknown parameter (name, path, scale)"});
    }
  }
  if (!name_given && !item.contains("url")) {
    violations->push_back({field + ".name", "is required"});
  }
  loras->push_back(std::move(spec));
}

}  // namespace

void parse_openai_loras(const json& value, std::vector<LoraSpec>* loras,
                        std::vector<FieldViolation>* violations) {
  if (!value.is_array()) {
    violations->push_back({"loras", "must be an array of {\"name\": ..., \"scale\": ...}"});
    return;
  }
  for (size_t i = 0; i < value.size(); ++i) {
    parse_one(value[i], absl::StrCat("loras[", i, "]"), loras, violations);
  }
}

json openai_loras_json(const std::vector<AppliedLora>& loras) {
  json out = json::array();
  for (const AppliedLora& lora : loras) {
    out.push_back({{"name", lora.name},
                   {"scale", lora.scale},
                   {"format", lora.layout},
                   {"rank", lora.max_rank},
                   {"sha256_prefix", lora.sha256_prefix}});
  }
  return out;
}

json openai_lora_list_json(const std::vector<LoraListing>& loras) {
  json data = json::array();
  for (const LoraListing& lora : loras) {
    json entry{{"name", lora.name}, {"bytes", lora.bytes}, {"loaded", lora.loaded}};
    if (lora.loaded) {
      entry["format"] = lora.layout;
      entry["rank"] = lora.max_rank;
      entry["modules"] = lora.modules;
      entry["sha256_prefix"] = lora.sha256_prefix;
    }
    entry["resident"] = lora.resident;
    entry["pinned"] = lora.pinned;
    data.push_back(std::move(entry));
  }
  return json{{"object", "list"}, {"data", std::move(data)}};
}

}  // namespace flux2::server
