// --gpus as a count or a list of device ordinals; see gpus_flag.h.
// Tested by tests/server/server_options_test.cc (GpusFlag*).
#include "server/common/gpus_flag.h"

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace flux2 {

absl::StatusOr<std::vector<int>> parse_gpus_flag(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  if (trimmed.empty()) {
    return absl::InvalidArgumentError(
        "--gpus: empty; give a count (--gpus 2: devices 0 and 1) or device ordinals (--gpus 2,3)");
  }
  std::vector<int> gpus;
  if (trimmed.find(',') == absl::string_view::npos) {  // a count
    int count = 0;
    if (!absl::SimpleAtoi(trimmed, &count)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--gpus: \"", trimmed, "\" is not a count N or a list of device ordinals such as 2,3"));
    }
    if (count < 1 || count > kMaxGpus) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus: ", count, " is outside 1..", kMaxGpus));
    }
    for (int i = 0; i < count; ++i) gpus.push_back(i);
    return gpus;
  }
  int entry = 0;
  for (absl::string_view part : absl::StrSplit(trimmed, ',')) {
    ++entry;
    part = absl::StripAsciiWhitespace(part);
    int ordinal = 0;
    if (part.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus ", trimmed, ": entry ", entry, " is empty"));
    }
    if (!absl::SimpleAtoi(part, &ordinal)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus ", trimmed, ": \"", part, "\" is not a device ordinal"));
    }
    gpus.push_back(ordinal);
  }
  if (absl::Status checked = check_gpus(gpus); !checked.ok()) return checked;
  return gpus;
}

absl::Status check_gpus(const std::vector<int>& gpus) {
  if (gpus.empty()) return absl::InvalidArgumentError("--gpus: no GPU given");
  if (gpus.size() == 1 && gpus[0] != 0) {  // only options built in code: a list has two or more
    return absl::InvalidArgumentError(
        absl::StrCat("--gpus: one GPU runs on device 0, the process's first, not ", gpus[0],
                     " (CUDA_VISIBLE_DEVICES=", gpus[0], " makes device ", gpus[0], " that one)"));
  }
  const std::string flag = absl::StrCat("--gpus ", gpus_flag_text(gpus), ": ");
  if (gpus.size() > static_cast<size_t>(kMaxGpus)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, gpus.size(), " GPUs exceed the limit of ", kMaxGpus));
  }
  std::set<int> seen;
  for (int gpu : gpus) {
    if (gpu < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, gpu, " is not a device ordinal (they count from 0)"));
    }
    if (!seen.insert(gpu).second) {
      return absl::InvalidArgumentError(absl::StrCat(flag, "device ", gpu, " is listed twice"));
    }
  }
  return absl::OkStatus();
}

std::string gpus_flag_text(const std::vector<int>& gpus) {
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (gpus[i] != static_cast<int>(i)) return gpu_ordinals_text(gpus);
  }
  return absl::StrCat(gpus.size());
}

std::string gpu_ordinals_text(const std::vector<int>& gpus) {
  return absl::StrJoin(gpus, ",");
}

}  // namespace flux2
