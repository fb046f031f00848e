// CFG parallelism: the layout of P ranks, their communicators and the exchange of the two
// branches' velocities; see cfg_parallel.h. Tested by tests/host/sequence_parallel_test.cc.
#include "model/cfg_parallel.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "model/sequence_parallel.h"

namespace flux2 {

absl::StatusOr<ParallelLayout> plan_parallel_layout(const Flux2Config& config, int ranks,
                                                    bool uses_cfg, const char* what) {
  if (ranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", ranks, " is not a rank count >= 1"));
  }
  ParallelLayout layout;
  layout.cfg = uses_cfg && ranks % 2 == 0 ? 2 : 1;
  layout.sequence = ranks / layout.cfg;
  const absl::Status heads = check_sequence_parallel(config, layout.sequence);
  if (!heads.ok()) {
    const std::string split =
        layout.cfg == 2 ? absl::StrCat(" (2 CFG branches x ", layout.sequence, " sequence ranks)")
                        : std::string(" (sequence ranks)");
    return absl::InvalidArgumentError(absl::StrCat(what, " ", ranks, split, ": ", heads.message()));
  }
  return layout;
}

absl::StatusOr<std::vector<RankCommunicators>> make_rank_communicators(
    const ParallelLayout& layout,
    const std::function<absl::StatusOr<std::vector<std::unique_ptr<Communicator>>>(
        const std::vector<int>& ranks)>& make_group) {
  std::vector<RankCommunicators> ranks(static_cast<size_t>(layout.ranks()));
  for (int branch = 0; branch < layout.cfg; ++branch) {  // one sequence group per branch
    std::vector<int> members;
    for (int u = 0; u < layout.sequence; ++u) members.push_back(branch * layout.sequence + u);
    FLUX_ASSIGN_OR_RETURN(auto group, make_group(members));
    for (size_t i = 0; i < members.size(); ++i) ranks[members[i]].sequence = std::move(group[i]);
  }
  for (int u = 0; u < layout.sequence; ++u) {  // one CFG pair per sequence rank
    std::vector<int> members;
    for (int branch = 0; branch < layout.cfg; ++branch) {
      members.push_back(branch * layout.sequence + u);
    }
    FLUX_ASSIGN_OR_RETURN(auto pair, make_group(members));
    for (size_t i = 0; i < members.size(); ++i) ranks[members[i]].cfg = std::move(pair[i]);
  }
  return ranks;
}

absl::Status cfg_parallel_combine(Backend& be, Communicator& pair, const Tensor& own,
                                  const Tensor& other, float scale, const Tensor& out) {
  if (pair.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("cfg_parallel_combine: a CFG pair has 2 ranks, not ", pair.size()));
  }
  const bool conditional = pair.rank() == 0;
  const Tensor& cond = conditional ? own : other;
  const Tensor& uncond = conditional ? other : own;
  FLUX_RETURN_IF_ERROR(pair.all_gather(own, {cond, uncond}));  // [N, C] each
  return be.cfg_combine(uncond, cond, scale, out);
}

}  // namespace flux2
