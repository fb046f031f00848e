// CFG parallelism and how P ranks split one request: klein base models run the conditional and
// the unconditional forward of a step on two rank groups at once (each group sequence-parallel
// over P / 2 ranks, model/sequence_parallel.h); the two velocities are exchanged between the
// groups and every rank computes the same CFG combination. Tested by
// tests/host/sequence_parallel_test.cc.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/base/communicator.h"
#include "model/flux2_config.h"

namespace flux2 {

// How P = cfg x sequence ranks split a request: `cfg` rank groups (2: one per CFG branch, 1:
// both branches, or the only forward, on every rank), each running its forwards sequence-parallel
// over `sequence` ranks. Rank = branch x sequence + sequence rank.
struct ParallelLayout {
  int cfg = 1;
  int sequence = 1;

  int ranks() const { return cfg * sequence; }
  int branch(int rank) const { return rank / sequence; }  // 0: conditional, 1: unconditional
  int sequence_rank(int rank) const { return rank % sequence; }
};

// The layout of `ranks` ranks for a transformer of `config`: models with CFG (`uses_cfg`) put
// their two branches on two groups when `ranks` is even, and every group runs sequence-parallel
// over the rest. InvalidArgument naming the flag `what` (e.g. "--gpus") and the head count when
// the heads do not divide among a group's ranks.
absl::StatusOr<ParallelLayout> plan_parallel_layout(const Flux2Config& config, int ranks,
                                                    bool uses_cfg, const char* what);

// Each rank's communicators: its sequence group (`sequence`, size layout.sequence) and its CFG
// pair (`cfg`, the ranks of the same sequence rank in the two branches: size layout.cfg, rank =
// branch).
struct RankCommunicators {
  std::unique_ptr<Communicator> sequence;
  std::unique_ptr<Communicator> cfg;
};

// Builds every rank's communicators for `layout`: make_group(ranks) returns one communicator per
// rank of `ranks` (global rank numbers, in order), the group's rank i being ranks[i].
absl::StatusOr<std::vector<RankCommunicators>> make_rank_communicators(
    const ParallelLayout& layout,
    const std::function<absl::StatusOr<std::vector<std::unique_ptr<Communicator>>>(
        const std::vector<int>& ranks)>& make_group);

// One rank's place in a multi-rank engine: the layout, its rank number and its communicators
// (make_rank_communicators; not owned, they outlive whoever holds this).
struct ParallelRank {
  ParallelLayout layout;
  int rank = 0;
  Communicator* sequence = nullptr;  // size layout.sequence
  Communicator* cfg = nullptr;       // size layout.cfg
};

// CFG-parallel guidance on one rank of a CFG pair (pair.size() == 2; pair.rank() 0 holds the
// conditional branch, 1 the unconditional): `own` [N, C] is this rank's branch's velocity,
// `other` [N, C] receives the other branch's, and out = uncond + scale · (cond − uncond)
// (Backend::cfg_combine) on every rank, from the same two tensors, so every rank gets the same
// bits. out may be the conditional branch's tensor (own on rank 0, other on rank 1), as the
// single-rank pipeline writes its CFG velocity over its conditional one.
absl::Status cfg_parallel_combine(Backend& be, Communicator& pair, const Tensor& own,
                                  const Tensor& other, float scale, const Tensor& out);

}  // namespace flux2
