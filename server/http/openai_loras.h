// The HTTP API's LoRA extension: the `loras` member of image requests ([{"name", "scale"}], `path`
// an alias of `name`, `url` refused), the applied adapters in responses, and GET /v1/loras' body.
// No I/O. Tested by tests/server/openai_images_test.cc and tests/server/lora_e2e_test.cc.
#pragma once

#include <vector>

#include "nlohmann/json.hpp"
#include "server/serving/field_violations.h"
#include "server/serving/job.h"
#include "server/serving/lora_registry.h"
#include "server/serving/request.h"

namespace flux2::server {

// Reads `value` (the request's `loras`: an array of objects) into `loras`; each problem is a
// violation naming its member (`loras[1].url`, `loras[0].scale`).
void parse_openai_loras(const nlohmann::json& value, std::vector<LoraSpec>* loras,
                        std::vector<FieldViolation>* violations);

// The response's `loras`: [{name, scale, format, rank, sha256_prefix}] in request order.
nlohmann::json openai_loras_json(const std::vector<AppliedLora>& loras);

// GET /v1/loras: {"object": "list", "data": [{name, bytes, loaded, format, rank, modules,
// sha256_prefix, resident, pinned}]}.
nlohmann::json openai_lora_list_json(const std::vector<LoraListing>& loras);

}  // namespace flux2::server
