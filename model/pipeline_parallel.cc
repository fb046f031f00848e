// The Pipeline's part of a multi-rank engine: joining a layout of sequence and CFG parallelism,
// sharding a request's conditioning, the CFG branches' exchange and the collectives' time per
// step; see pipeline.h (join_parallel) and model/cfg_parallel.h. Tested by
// tests/host/sequence_parallel_test.cc (SequenceParallelPipeline*).
#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "model/pipeline.h"
#include "model/sequence_parallel.h"

namespace flux2 {

absl::Status Pipeline::join_parallel(const ParallelRank& rank) {
  const ParallelLayout& layout = rank.layout;
  if (rank.rank < 0 || rank.rank >= layout.ranks() || rank.sequence == nullptr ||
      rank.cfg == nullptr || rank.sequence->size() != layout.sequence ||
      rank.cfg->size() != layout.cfg) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank.rank, " of ", layout.cfg, " x ",
                                                   layout.sequence,
                                                   " ranks: its communicators do not match"));
  }
  FLUX_RETURN_IF_ERROR(check_sequence_parallel(transformer_->config(), layout.sequence));
  if (layout.cfg == 2 && !info_.uses_cfg) {
    return absl::InvalidArgumentError(absl::StrCat(info_.model_name, " (", info_.variant,
                                                   ") runs without CFG: no branches to split"));
  }
  if (layout.sequence > 1 && info_.uses_kv_cache) {
    return absl::InvalidArgumentError(
        absl::StrCat(info_.model_name,
                     " (klein-kv): its cached reference K/V is not sharded; run it on one "
                     "rank"));
  }
  parallel_ = rank;
  return absl::OkStatus();
}

void Pipeline::end_parallel_group(const absl::Status& why) const {
  if (!parallel_.has_value()) return;
  parallel_->sequence->abort(why);
  parallel_->cfg->abort(why);
}

bool Pipeline::cfg_parallel(bool cfg) const {
  return cfg && parallel_.has_value() && parallel_->layout.cfg == 2;
}

bool Pipeline::runs_negative_branch(bool cfg) const {
  return cfg_parallel(cfg) && parallel_->layout.branch(parallel_->rank) == 1;
}

absl::Status Pipeline::shard(Flux2Conditioning& cond) const {
  if (!parallel_.has_value() || parallel_->layout.sequence == 1) return absl::OkStatus();
  return transformer_->enable_sequence_parallel(cond, *parallel_->sequence);
}

absl::Status Pipeline::report_step_collectives(const GenerateHooks& hooks, int64_t step) const {
  if (!parallel_.has_value()) return absl::OkStatus();
  // Taken after every step, hook or not, so the NCCL communicators' events are reused.
  FLUX_ASSIGN_OR_RETURN(CollectiveSeconds seconds, parallel_->sequence->take_collective_seconds());
  FLUX_ASSIGN_OR_RETURN(const CollectiveSeconds cfg, parallel_->cfg->take_collective_seconds());
  seconds += cfg;
  if (hooks.on_step_collectives) hooks.on_step_collectives(parallel_->rank, step, seconds);
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Pipeline::combine_cfg_branches(const Tensor& own, const Tensor& other,
                                                      float guidance) const {
  const bool conditional = parallel_->cfg->rank() == 0;
  const Tensor& cond = conditional ? own : other;
  FLUX_RETURN_IF_ERROR(cfg_parallel_combine(backend_, *parallel_->cfg, own, other, guidance, cond));
  return cond;
}

}  // namespace flux2
