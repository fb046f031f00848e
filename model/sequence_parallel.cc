// Ulysses sequence parallelism: shards, the attention exchange and the output gather; see
// sequence_parallel.h. Tested by tests/host/sequence_parallel_test.cc.
#include "model/sequence_parallel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "model/flux2_transformer.h"

namespace flux2 {

SequenceShards SequenceShards::split(int64_t rows, int ranks) {
  SequenceShards shards;
  int64_t next = 0;
  for (int j = 0; j < ranks; ++j) {
    const int64_t count = rows / ranks + (j < rows % ranks ? 1 : 0);
    shards.begin.push_back(next);
    shards.count.push_back(count);
    next += count;
  }
  return shards;
}

std::pair<int64_t, int64_t> SequenceShards::part_in(int rank, int64_t first, int64_t rows) const {
  const int64_t lo = std::max(begin[rank], first);
  const int64_t hi = std::min(begin[rank] + count[rank], first + rows);
  return hi > lo ? std::make_pair(lo - first, hi - lo) : std::make_pair(int64_t{0}, int64_t{0});
}

absl::Status check_sequence_parallel(const Flux2Config& config, int ranks) {
  if (ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence parallelism over ", ranks, " ranks: at least one is needed"));
  }
  if (config.num_attention_heads % ranks != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence parallelism over ", ranks, " ranks needs num_attention_heads divisible by ",
        ranks, ", and this transformer has ", config.num_attention_heads,
        " heads: use a rank count that divides ", config.num_attention_heads));
  }
  return absl::OkStatus();
}

absl::StatusOr<Flux2SequenceParallel> Flux2SequenceParallel::create(Backend& be,
                                                                    Communicator& group,
                                                                    int64_t seq, int64_t d) {
  const int ranks = group.size();
  if (d % ranks != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden size ", d, " does not split over ", ranks, " ranks"));
  }
  Flux2SequenceParallel sp;
  sp.group = &group;
  sp.shards = SequenceShards::split(seq, ranks);
  const int64_t s = sp.rows(), width = d / ranks, act_rows = std::max<int64_t>(1, ranks * s);
  const DType act = be.activation_dtype();
  FLUX_ASSIGN_OR_RETURN(sp.qkv_send, be.empty(act, {act_rows, 3 * width}));
  FLUX_ASSIGN_OR_RETURN(sp.qkv_recv, be.empty(act, {seq, 3 * width}));
  FLUX_ASSIGN_OR_RETURN(sp.heads_out, be.empty(act, {seq, width}));
  FLUX_ASSIGN_OR_RETURN(sp.out_recv, be.empty(act, {act_rows, width}));
  return sp;
}

absl::Status ulysses_attention(Backend& be, const Flux2SequenceParallel& sp, const Tensor& q,
                               const Tensor& k, const Tensor& v, const AttentionParams& params,
                               const Tensor& out) {
  Communicator& group = *sp.group;
  const int ranks = group.size();
  const int64_t s = q.rows(), width = q.cols() / ranks;  // this rank's rows; one rank's heads
  if (s != sp.rows() || out.rows() != s) {
    return absl::InvalidArgumentError(absl::StrCat("ulysses_attention: ", s, " rows where rank ",
                                                   group.rank(), " holds ", sp.rows()));
  }
  // Token shards -> head shards: block j of the send buffer holds rank j's heads of q | k | v.
  std::vector<Tensor> send, recv;
  for (int j = 0; j < ranks; ++j) {
    const Tensor block = sp.qkv_send.row_slice(j * s, s);  // [s, 3D/P]
    if (s > 0) {  // a rank may hold no rows (S < P): nothing to launch
      FLUX_RETURN_IF_ERROR(be.copy(q.col_slice(j * width, width), block.col_slice(0, width)));
      FLUX_RETURN_IF_ERROR(be.copy(k.col_slice(j * width, width), block.col_slice(width, width)));
      FLUX_RETURN_IF_ERROR(
          be.copy(v.col_slice(j * width, width), block.col_slice(2 * width, width)));
    }
    send.push_back(block);
    recv.push_back(sp.qkv_recv.row_slice(sp.shards.begin[j], sp.shards.count[j]));
  }
  FLUX_RETURN_IF_ERROR(group.all_to_all(send, recv));  // [S, 3D/P]
  AttentionParams local = params;
  local.num_heads = params.num_heads / ranks;
  local.num_kv_heads = params.num_kv_heads / ranks;
  const Tensor& all = sp.qkv_recv;
  FLUX_RETURN_IF_ERROR(be.attention(all.col_slice(0, width), all.col_slice(width, width),
                                    all.col_slice(2 * width, width), local,
                                    sp.heads_out));  // [S, D/P]
  // Head shards -> token shards: rank j gets its rows of this rank's heads.
  send.clear();
  recv.clear();
  for (int j = 0; j < ranks; ++j) {
    send.push_back(sp.heads_out.row_slice(sp.shards.begin[j], sp.shards.count[j]));
    recv.push_back(sp.out_recv.row_slice(j * s, s));
  }
  FLUX_RETURN_IF_ERROR(group.all_to_all(send, recv));  // P x [s, D/P]
  for (int j = 0; j < ranks && s > 0; ++j) {
    FLUX_RETURN_IF_ERROR(be.copy(recv[j], out.col_slice(j * width, width)));  // [s, D]
  }
  return absl::OkStatus();
}

absl::Status gather_image_rows(const Flux2SequenceParallel& sp, int64_t text_len,
                               const Tensor& out) {
  std::vector<Tensor> parts;
  for (int j = 0; j < sp.shards.ranks(); ++j) {
    const auto [first, count] = sp.shards.part_in(j, text_len, out.rows());
    parts.push_back(out.row_slice(first, count));
  }
  return sp.group->all_gather(parts[sp.group->rank()], parts);
}

absl::Status Flux2Transformer::enable_sequence_parallel(Flux2Conditioning& cond,
                                                        Communicator& group) const {
  FLUX_RETURN_IF_ERROR(check_sequence_parallel(config_, group.size()));
  if (cond.kv != nullptr) {
    return absl::InvalidArgumentError(
        "sequence parallelism: klein-KV's cached reference K/V is not sharded; run klein-KV on "
        "one rank");
  }
  Backend& be = backend_;
  const int64_t d = config_.hidden(), f = config_.mlp_hidden();
  const int64_t seq = cond.text_len + cond.image_len + cond.reference_len;
  FLUX_ASSIGN_OR_RETURN(Flux2SequenceParallel sp, Flux2SequenceParallel::create(be, group, seq, d));
  // The workspace holds this rank's rows only (its LoRA scratch keeps prepare's size).
  Flux2Workspace& ws = *cond.workspace;
  const DType act = be.activation_dtype();
  const int64_t s = std::max<int64_t>(1, sp.rows());
  FLUX_ASSIGN_OR_RETURN(ws.stream, be.empty(act, {s, d}));
  FLUX_ASSIGN_OR_RETURN(ws.normed, be.empty(act, {s, d}));
  FLUX_ASSIGN_OR_RETURN(ws.wide, be.empty(act, {s, 3 * d + 2 * f}));
  FLUX_ASSIGN_OR_RETURN(ws.attn_mlp, be.empty(act, {s, d + f}));
  FLUX_ASSIGN_OR_RETURN(ws.proj, be.empty(act, {s, d}));
  cond.sequence_parallel = std::make_shared<const Flux2SequenceParallel>(std::move(sp));
  return absl::OkStatus();
}

}  // namespace flux2
