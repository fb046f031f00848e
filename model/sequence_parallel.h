// Ulysses sequence parallelism for the FLUX.2 transformer: each of P ranks holds the full weights
// and a contiguous 1/P of the joint sequence [text ; image ; references] (uneven where P does
// not divide it); every op but attention is per token, so a rank runs the blocks on its rows
// alone. Around attention an all-to-all turns the token shards of q, k and v (after QK-norm and
// RoPE, which are per token) into head shards over the whole sequence, each rank attends with H/P
// heads, and a second all-to-all turns the output back. The velocity is gathered at the end.
// Tested by tests/host/sequence_parallel_test.cc (ranks as threads on the CPU backend) and
// tests/cuda/nccl_communicator_test.cc (NCCL, P = 1).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/base/communicator.h"
#include "model/flux2_config.h"

namespace flux2 {

// The contiguous rows of a sequence each of P ranks holds: rank j holds rows
// [begin[j], begin[j] + count[j]); the first (rows % P) ranks hold one row more than the others
// (3584 rows over 3 ranks: 1195, 1195, 1194).
struct SequenceShards {
  std::vector<int64_t> begin, count;

  static SequenceShards split(int64_t rows, int ranks);
  int ranks() const { return static_cast<int>(count.size()); }
  // The rows of rank j's shard inside [first, first + rows), as (begin relative to `first`,
  // count); count 0 where they do not meet.
  std::pair<int64_t, int64_t> part_in(int rank, int64_t first, int64_t rows) const;
};

// OK when the transformer of `config` runs over `ranks` sequence-parallel ranks (its attention
// heads divide among them); InvalidArgument naming the head count otherwise.
absl::Status check_sequence_parallel(const Flux2Config& config, int ranks);

// One rank's part of a request's sequence parallelism: its group, the shards of the joint
// sequence S = L + N + R, and the staging buffers of the two exchanges (this rank's s rows).
struct Flux2SequenceParallel {
  Communicator* group = nullptr;  // the rank's sequence group; not owned, outlives the request
  SequenceShards shards;          // of S
  Tensor qkv_send;   // [P·s, 3D/P]  block j: this rank's rows of q | k | v in rank j's heads
  Tensor qkv_recv;   // [S, 3D/P]    every rank's rows of q | k | v in this rank's heads
  Tensor heads_out;  // [S, D/P]     attention of this rank's heads over the whole sequence
  Tensor out_recv;   // [P·s, D/P]   block j: this rank's rows of rank j's heads' output

  int64_t first_row() const { return shards.begin[group->rank()]; }
  int64_t rows() const { return shards.count[group->rank()]; }

  // The staging of `group`'s rank for a joint sequence of `seq` rows of width d = H·Dh.
  static absl::StatusOr<Flux2SequenceParallel> create(Backend& be, Communicator& group, int64_t seq,
                                                      int64_t d);
};

// out [s, D] = the rows this rank holds of attention over the whole sequence: q, k and v [s, D]
// are this rank's rows after QK-norm and RoPE (strided views allowed), params the full model's
// (H heads of Dh). Two all-to-alls around one attention of H/P heads over all S rows.
absl::Status ulysses_attention(Backend& be, const Flux2SequenceParallel& sp, const Tensor& q,
                               const Tensor& k, const Tensor& v, const AttentionParams& params,
                               const Tensor& out);

// out [N, C]: every rank computed the rows of out that its shard holds of the image rows
// [text_len, text_len + N) of the joint sequence (into out itself); gathers the others' rows, so
// every rank ends with the whole of out.
absl::Status gather_image_rows(const Flux2SequenceParallel& sp, int64_t text_len,
                               const Tensor& out);

}  // namespace flux2
