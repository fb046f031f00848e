// The HTTP API's step-caching extension: the `cache` member of image requests ({"mode",
// "warmup_steps", "max_consecutive_cached", "threshold", "schedule"}; an edits form field holds
// its JSON text) and the counts in responses and progress events. No I/O. Tested by
// tests/server/openai_images_test.cc.
#pragma once

#include <vector>

#include "model/step_cache.h"
#include "nlohmann/json.hpp"
#include "server/serving/field_violations.h"
#include "server/serving/request.h"

namespace flux2::server {

// Reads `value` (the request's `cache`: an object) into request->cache (and
// cache_default_schedule); each problem is a violation naming its member (`cache.mode`,
// `cache.schedule[3]`). validate() checks the values.
void parse_openai_cache(const nlohmann::json& value, GenerateRequest* request,
                        std::vector<FieldViolation>* violations);

// {"double_computed", "double_cached", "single_computed", "single_cached"} (timings.cache and
// the progress events' cache).
nlohmann::json openai_cache_json(const StepCacheCounts& counts);

}  // namespace flux2::server
