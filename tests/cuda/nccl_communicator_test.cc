// The NCCL communicator with one rank on one GPU (P = 1): its collectives move bytes exactly and
// are timed by CUDA events (take_collective_seconds after a synchronize), and the tiny-klein
// transformer run sequence-parallel over it (the Ulysses exchange path) matches the plain
// single-GPU forward within the bf16 bar and repeats bit for bit. Skips without a CUDA device.
// Run: build-gpu/tests/cuda/gpu_nccl_communicator_test.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "kernels/cuda/nccl_communicator.h"
#include "model/checkpoint.h"
#include "model/flux2_transformer.h"
#include "model/rope.h"
#include "model/sequence_parallel.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

using testing::bits;
using testing::random_bf16;

std::unique_ptr<Communicator> one_rank_group(Backend& be) {
  int device = 0;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  auto version = nccl_version();
  EXPECT_TRUE(version.ok()) << version.status();
  auto group = create_nccl_group({device}, {cuda_stream_of(be)});
  EXPECT_TRUE(group.ok()) << group.status();
  if (!group.ok()) return nullptr;
  return std::move((*group)[0]);
}

TEST(NcclCommunicatorTest, OneRankCollectivesCopyExactly) {
  FLUX2_REQUIRE_GPU(be);
  std::unique_ptr<Communicator> comm = one_rank_group(*be);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  const Tensor send = random_bf16(*be, 37, 96, 1);
  const Tensor recv = be->empty(DType::kBF16, {37, 96}).value();
  ASSERT_TRUE(comm->all_to_all({send}, {recv}).ok());
  EXPECT_EQ(bits(*be, recv), bits(*be, send));
  const Tensor gathered = be->empty(DType::kBF16, {37, 96}).value();
  ASSERT_TRUE(comm->all_gather(send, {gathered}).ok());
  EXPECT_EQ(bits(*be, gathered), bits(*be, send));
  ASSERT_TRUE(comm->all_gather(gathered, {gathered}).ok());  // in place
  EXPECT_EQ(bits(*be, gathered), bits(*be, send));
  const absl::Status strided = comm->all_gather(send.col_slice(0, 8), {recv.col_slice(0, 8)});
  EXPECT_EQ(strided.code(), absl::StatusCode::kInvalidArgument);
  // Each collective was timed by CUDA events on the stream (its local copy, with one rank), read
  // once the stream synchronized; the count then starts anew.
  ASSERT_TRUE(be->synchronize().ok());
  absl::StatusOr<CollectiveSeconds> seconds = comm->take_collective_seconds();
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  EXPECT_GT(seconds->all_to_all, 0.0);
  EXPECT_GT(seconds->all_gather, 0.0);
  absl::StatusOr<CollectiveSeconds> again = comm->take_collective_seconds();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->total(), 0.0);
}

// relative L2 error of `out` against `ref`.
double relative_error(const std::vector<float>& out, const std::vector<float>& ref) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff += (static_cast<double>(out[i]) - ref[i]) * (static_cast<double>(out[i]) - ref[i]);
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(diff / norm);
}

TEST(NcclCommunicatorTest, TinyKleinOverOneRankMatchesThePlainForward) {
  FLUX2_REQUIRE_GPU(be);
  auto weights =
      ComponentWeights::open(testing::test_data_dir() + "/tiny-klein/checkpoint/transformer");
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto model = Flux2Transformer::load(*be, *weights);
  ASSERT_TRUE(model.ok()) << model.status();
  const Flux2Config& config = (*model)->config();
  const int64_t l = 7, h = 4, w = 6, n = h * w;
  const Tensor prompt = random_bf16(*be, l, config.joint_attention_dim, 2);
  const Tensor x = random_bf16(*be, n, config.in_channels, 3);
  const std::vector<float> timesteps = {0.75f};
  std::unique_ptr<Communicator> comm = one_rank_group(*be);
  ASSERT_NE(comm, nullptr);
  auto run = [&](bool parallel) -> std::vector<uint16_t> {
    auto cond = (*model)->prepare(prompt, flux2_text_ids(l), flux2_image_ids(h, w), timesteps, {});
    EXPECT_TRUE(cond.ok()) << cond.status();
    if (parallel) {
      EXPECT_TRUE((*model)->enable_sequence_parallel(*cond, *comm).ok());
    }
    Tensor out = be->empty(DType::kBF16, {n, config.out_channels}).value();
    EXPECT_TRUE((*model)->forward(*cond, 0, x, out).ok());
    return bits(*be, out);
  };
  auto as_floats = [](const std::vector<uint16_t>& raw) {
    std::vector<float> out;
    for (uint16_t b : raw) {
      const uint32_t word = static_cast<uint32_t>(b) << 16;
      float f;
      std::memcpy(&f, &word, sizeof(f));
      out.push_back(f);
    }
    return out;
  };
  const std::vector<uint16_t> plain = run(false), parallel = run(true);
  EXPECT_EQ(run(true), parallel) << "the NCCL path repeats bit for bit";
  // Two bf16 paths of one model: the golden README's bf16 floor, max(2 e_ref, 1e-2) >= 1e-2.
  const double error = relative_error(as_floats(parallel), as_floats(plain));
  EXPECT_LE(error, 1e-2);
  std::printf("P = 1 over NCCL vs the plain forward: relative error %.3g, %s\n", error,
              parallel == plain ? "bit-identical" : "not bit-identical");
}

}  // namespace
}  // namespace flux2
