// The `cache` member of HTTP image requests and its counts; see openai_cache.h.
// Tested by tests/server/openai_images_test.cc.
#include "server/http/openai_cache.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace flux2::server {
namespace {

using nlohmann::json;

// An integer member's value, or a violation naming it.
void read_integer(const json& object, const char* name, int64_t* out,
                  std::vector<FieldViolation>* violations) {
  if (!object.contains(name)) return;
  const json& value = object[name];
  if (!value.is_number_integer()) {
    violations->push_back({absl::StrCat("cache.", name), "must be an integer"});
    return;
  }
  *out = value.get<int64_t>();
}

// `schedule`: "dbcache-default", or one flag per step (true/false or 1/0; 1 computes).
void read_schedule(const json& value, GenerateRequest* request,
                   std::vector<FieldViolation>* violations) {
  if (value.is_string()) {
    if (value.get<std::string>() == "dbcache-default") {
      request->cache_default_schedule = true;
    } else {
      violations->push_back({"cache.schedule", absl::StrCat("\"", value.get<std::string>(),
                                                            "\" is not a known preset "
                                                            "(dbcache-default)")});
    }
    return;
  }
  if (!value.is_array()) {
    violations->push_back({"cache.schedule", "must be an array of flags or \"dbcache-default\""});
    return;
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const json& flag = value[i];
    if (flag.is_boolean()) {
      request->cache.schedule.push_back(flag.get<bool>());
    } else if (flag.is_number_integer() && (flag.get<int64_t>() == 0 || flag.get<int64_t>() == 1)) {
      request->cache.schedule.push_back(flag.get<int64_t>() == 1);
    } else {
      violations->push_back({absl::StrCat("cache.schedule[", i, "]"),
                             "must be true / 1 (compute) or false / 0 (cache)"});
    }
  }
}

}  // namespace

void parse_openai_cache(const json& value, GenerateRequest* request,
                        std::vector<FieldViolation>* violations) {
  if (!value.is_object()) {
    violations->push_back({"cache", "must be an object, e.g. {\"mode\": \"dbcache\"}"});
    return;
  }
  for (auto it = value.begin(); it != value.end(); ++it) {
    static const char* const kMembers[] = {"mode", "warmup_steps", "max_consecutive_cached",
                                           "threshold", "schedule"};
    bool known = false;
    for (const char* member : kMembers) known |= it.key() == member;
    if (!known) violations->push_back({absl::StrCat("cache.", it.key()), "is not a known member"});
  }
  StepCacheOptions& cache = request->cache;
  const std::string mode = value.contains("mode") && value["mode"].is_string()
                               ? value["mode"].get<std::string>()
                               : (value.contains("mode") ? "?" : "dbcache");
  if (mode == "off") return;
  if (mode == "dbcache") {
    cache.mode = StepCacheOptions::Mode::kDbCache;
  } else if (mode == "schedule") {
    cache.mode = StepCacheOptions::Mode::kSchedule;
  } else {
    violations->push_back({"cache.mode", "must be \"dbcache\", \"schedule\" or \"off\""});
    return;
  }
  read_integer(value, "warmup_steps", &cache.warmup_steps, violations);
  read_integer(value, "max_consecutive_cached", &cache.max_consecutive_cached, violations);
  if (value.contains("threshold")) {
    if (value["threshold"].is_number()) {
      cache.threshold = value["threshold"].get<double>();
    } else {
      violations->push_back({"cache.threshold", "must be a number"});
    }
  }
  if (value.contains("schedule")) read_schedule(value["schedule"], request, violations);
}

json openai_cache_json(const StepCacheCounts& counts) {
  return json{{"double_computed", counts.computed[0]},
              {"double_cached", counts.cached[0]},
              {"single_computed", counts.computed[1]},
              {"single_cached", counts.cached[1]}};
}

}  // namespace flux2::server
