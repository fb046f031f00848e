// Sequence (Ulysses) and CFG parallelism on the CPU backend, P ranks as threads of this process
// (in_process_communicator.h), each with its own backend and weights: the in-process collectives,
// uneven shards, refusals, and the transformer's output on P = 2, 3, 4, 6 and 12 ranks against one
// rank (tiny-klein, tiny-flux2-dev, a 12-head random config; CFG on two rank groups against the
// single-rank CFG velocity), then whole tiny-klein generations (Pipeline::join_parallel) and the
// collective time each rank reports per step. Run:
// host_tests --gtest_filter='SequenceParallel*:InProcessCommunicator*'.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <latch>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>

#include "kernels/base/read_file.h"
#include "kernels/base/status.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/in_process_communicator.h"
#include "model/cfg_parallel.h"
#include "model/checkpoint.h"
#include "model/flux2_lora.h"
#include "model/flux2_transformer.h"
#include "model/lora_adapter.h"
#include "model/lora_device_cache.h"
#include "model/pipeline.h"
#include "model/rope.h"
#include "model/sequence_parallel.h"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using testing::download;
using ::testing::HasSubstr;
using testing::test_data_dir;

// The float32 bar of ../shared/golden/README.md ("Tolerances"): a float32 implementation is
// within 1e-4 relative L2 error of the reference. P ranks run the same float32 math per token as
// one rank; this is the bar their output must meet against one rank's.
constexpr double kFloat32Bar = 1e-4;

double relative_error(const std::vector<float>& out, const std::vector<float>& ref) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff += (static_cast<double>(out[i]) - ref[i]) * (static_cast<double>(out[i]) - ref[i]);
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(diff / norm);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs body(rank) on one thread per rank and returns each rank's result.
template <typename T>
std::vector<T> on_threads(int ranks, const std::function<T(int)>& body) {
  std::vector<T> results(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back([&, r] { results[r] = body(r); });
  for (std::thread& t : threads) t.join();
  return results;
}

Tensor host_tensor(Backend& be, Shape shape, const std::vector<float>& values) {
  Tensor t = be.empty(DType::kF32, std::move(shape)).value();
  EXPECT_TRUE(be.upload(values.data(), DType::kF32, t).ok());
  return t;
}

TEST(InProcessCommunicatorTest, AllToAllMovesUnevenBlocksExactly) {
  constexpr int kRanks = 3;
  auto group = create_in_process_group(kRanks);
  CpuBackend be;
  // Rank r sends rank j a block of (r + j + 1) rows x 2 holding 100 r + 10 j + row.
  auto results = on_threads<std::vector<std::vector<float>>>(kRanks, [&](int r) {
    std::vector<Tensor> send, recv;
    for (int j = 0; j < kRanks; ++j) {
      const int64_t rows = r + j + 1;
      std::vector<float> values;
      for (int64_t i = 0; i < rows * 2; ++i) values.push_back(100.0f * r + 10.0f * j + i);
      send.push_back(host_tensor(be, {rows, 2}, values));
      recv.push_back(be.empty(DType::kF32, {rows, 2}).value());
    }
    EXPECT_TRUE(group[r]->all_to_all(send, recv).ok());
    std::vector<std::vector<float>> got;
    for (const Tensor& t : recv) got.push_back(download(be, t));
    return got;
  });
  for (int r = 0; r < kRanks; ++r) {
    for (int j = 0; j < kRanks; ++j) {
      const std::vector<float>& got = results[r][j];  // from rank j
      ASSERT_EQ(got.size(), static_cast<size_t>((r + j + 1) * 2));
      for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], 100.0f * j + 10.0f * r + i);
    }
  }
}

TEST(InProcessCommunicatorTest, AllGatherInPlaceAndShapeMismatchAbortsEveryRank) {
  constexpr int kRanks = 3;
  auto group = create_in_process_group(kRanks);
  CpuBackend be;
  auto gathered = on_threads<std::vector<float>>(kRanks, [&](int r) {
    Tensor mine = be.empty(DType::kF32, {6, 1}).value();  // rank r's rows 0, 1-2, 3-5 of it
    std::vector<Tensor> parts = {mine.row_slice(0, 1), mine.row_slice(1, 2), mine.row_slice(3, 3)};
    const std::vector<float> own(static_cast<size_t>(parts[r].rows()), static_cast<float>(r + 1));
    EXPECT_TRUE(be.upload(own.data(), DType::kF32, parts[r]).ok());
    EXPECT_TRUE(group[r]->all_gather(parts[r], parts).ok());
    return download(be, mine);
  });
  for (const auto& g : gathered) EXPECT_EQ(g, (std::vector<float>{1, 2, 2, 3, 3, 3}));
  // Rank 2 expects 2 rows from rank 0, which sends 1: the receiver refuses, every rank fails.
  auto statuses = on_threads<absl::Status>(kRanks, [&](int r) {
    Tensor send = be.empty(DType::kF32, {1, 1}).value();
    std::vector<Tensor> recv;
    for (int j = 0; j < kRanks; ++j) {
      recv.push_back(be.empty(DType::kF32, {r == 2 && j == 0 ? 2 : 1, 1}).value());
    }
    return group[r]->all_gather(send, recv);
  });
  EXPECT_EQ(statuses[2].code(), absl::StatusCode::kInvalidArgument) << statuses[2];
  EXPECT_THAT(std::string(statuses[2].message()), HasSubstr("rank 0 sends"));
  for (int r = 0; r < 2; ++r) EXPECT_FALSE(statuses[r].ok());
}

TEST(InProcessCommunicatorTest, AbortEndsTheOtherRanksWaits) {
  auto group = create_in_process_group(3);
  CpuBackend be;
  auto statuses = on_threads<absl::Status>(3, [&](int r) {
    if (r == 1) {
      group[r]->abort(absl::CancelledError("request cancelled"));
      return absl::CancelledError("request cancelled");
    }
    Tensor t = be.empty(DType::kF32, {1, 1}).value();
    return group[r]->all_gather(t, {t, t, t});
  });
  for (int r : {0, 2}) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kAborted);
    EXPECT_THAT(std::string(statuses[r].message()), HasSubstr("rank 1 of 3 ended the group"));
    EXPECT_THAT(std::string(statuses[r].message()), HasSubstr("request cancelled"));
  }
}

TEST(InProcessCommunicatorTest, CollectivesAreTimedByKindWaitsIncludedAndTakeStartsAnew) {
  constexpr int kRanks = 2;
  auto group = create_in_process_group(kRanks);
  CpuBackend be;
  std::latch started(kRanks);
  auto taken = on_threads<CollectiveSeconds>(kRanks, [&](int r) {
    Tensor t = be.empty(DType::kF32, {2, 3}).value();
    std::vector<Tensor> send = {t.row_slice(0, 1), t.row_slice(1, 1)};
    Tensor out = be.empty(DType::kF32, {2, 3}).value();
    std::vector<Tensor> recv = {out.row_slice(0, 1), out.row_slice(1, 1)};
    EXPECT_EQ(group[r]->take_collective_seconds()->total(), 0.0);  // nothing ran yet
    started.arrive_and_wait();
    // Rank 1 comes late: rank 0's all-to-all includes the wait for it.
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(group[r]->all_to_all(send, recv).ok());
    EXPECT_TRUE(group[r]->all_gather(send[r], send).ok());
    absl::StatusOr<CollectiveSeconds> seconds = group[r]->take_collective_seconds();
    EXPECT_TRUE(seconds.ok()) << seconds.status();
    EXPECT_EQ(group[r]->take_collective_seconds()->total(), 0.0);  // the count started anew
    return seconds.value_or(CollectiveSeconds{});
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_GT(taken[r].all_to_all, 0.0) << "rank " << r;
    EXPECT_GT(taken[r].all_gather, 0.0) << "rank " << r;
    EXPECT_EQ(taken[r].total(), taken[r].all_to_all + taken[r].all_gather);
  }
  EXPECT_GT(taken[0].all_to_all, taken[1].all_to_all) << "rank 0 waited for rank 1";
}

TEST(SequenceParallelTest, ShardsAreContiguousAndUneven) {
  const SequenceShards real = SequenceShards::split(3584, 3);  // 512 text + 3072 image tokens
  EXPECT_EQ(real.count, (std::vector<int64_t>{1195, 1195, 1194}));
  EXPECT_EQ(real.begin, (std::vector<int64_t>{0, 1195, 2390}));
  const SequenceShards tiny = SequenceShards::split(11, 4);
  EXPECT_EQ(tiny.count, (std::vector<int64_t>{3, 3, 3, 2}));
  // Text rows [0, 5), image rows [5, 11): rank 1 holds text rows 3-4 and image row 5.
  EXPECT_EQ(tiny.part_in(0, 0, 5), std::make_pair(int64_t{0}, int64_t{3}));
  EXPECT_EQ(tiny.part_in(1, 0, 5), std::make_pair(int64_t{3}, int64_t{2}));
  EXPECT_EQ(tiny.part_in(1, 5, 6), std::make_pair(int64_t{0}, int64_t{1}));
  EXPECT_EQ(tiny.part_in(0, 5, 6).second, 0);
  EXPECT_EQ(tiny.part_in(3, 5, 6), std::make_pair(int64_t{4}, int64_t{2}));
}

// One request of a test: prompt embeddings (and CFG's negative ones), latents, positions.
struct TinyRequest {
  int64_t l = 5, h = 2, w = 3;
  int64_t references = 0;  // R reference tokens (a 2 x (R / 2) reference image), 0: none
  std::vector<float> prompt, negative, latents;
  std::vector<float> timesteps = {0.9f, 0.5f};
  std::vector<float> guidance;              // per step, for models with the guidance embedder
  std::shared_ptr<const LoraAdapter> lora;  // applied with weight 1 (null: none)
  int64_t n() const { return h * w; }
};

TinyRequest make_request(const Flux2Config& config, int64_t references = 0) {
  TinyRequest q;
  q.references = references;
  q.prompt.resize(static_cast<size_t>(q.l * config.joint_attention_dim));
  q.negative.resize(q.prompt.size());
  q.latents.resize(static_cast<size_t>((q.n() + references) * config.in_channels));
  for (size_t i = 0; i < q.prompt.size(); ++i) {
    q.prompt[i] = std::sin(0.1f * static_cast<float>(i));
    q.negative[i] = 0.5f * std::cos(0.13f * static_cast<float>(i));
  }
  for (size_t i = 0; i < q.latents.size(); ++i) {
    q.latents[i] = std::cos(0.07f * static_cast<float>(i));
  }
  if (config.guidance_embeds) q.guidance = {4.0f, 4.0f};
  return q;
}

using ModelFactory = std::function<std::unique_ptr<Flux2Transformer>(Backend&)>;

ModelFactory checkpoint_model(const std::string& name) {
  return [name](Backend& be) {
    auto weights = ComponentWeights::open(test_data_dir() + "/" + name + "/checkpoint/transformer");
    EXPECT_TRUE(weights.ok()) << weights.status();
    auto model = Flux2Transformer::load(be, *weights);
    EXPECT_TRUE(model.ok()) << model.status();
    return std::move(*model);
  };
}

using testing::twelve_head_config;

ModelFactory random_model(const Flux2Config& config) {
  return [config](Backend& be) {
    auto model = Flux2Transformer::create_random(be, config, 7);
    EXPECT_TRUE(model.ok()) << model.status();
    return std::move(*model);
  };
}

// What one rank runs: `model` on `be`; `sequence` null runs the single-rank path.
struct RankRun {
  Backend* be = nullptr;
  const Flux2Transformer* model = nullptr;
  Communicator* sequence = nullptr;
  Communicator* cfg = nullptr;  // null: no CFG-parallel exchange
  bool negative = false;        // this rank's forward runs the negative prompt
};

// The velocity of `step` for every step of `q` (concatenated), as `run` computes it; with a CFG
// pair, the CFG velocity (scale 4) after the exchange.
absl::StatusOr<std::vector<float>> velocities(const RankRun& run, const TinyRequest& q) {
  Backend& be = *run.be;
  const Flux2Config& config = run.model->config();
  Tensor prompt =
      host_tensor(be, {q.l, config.joint_attention_dim}, run.negative ? q.negative : q.prompt);
  Tensor x = host_tensor(be, {q.n() + q.references, config.in_channels}, q.latents);
  Flux2References refs;
  for (int64_t i = 0; i < q.references; ++i) refs.ids.insert(refs.ids.end(), {10, i % 2, i / 2, 0});
  LoraDeviceCache uploads;  // the adapter on this rank's backend, for this request
  std::shared_ptr<const Flux2Lora> lora;
  if (q.lora != nullptr) {
    const std::vector<LoraRequest> requests = {{"style", q.lora, 1.0}};
    FLUX_ASSIGN_OR_RETURN(auto uses, uploads.acquire(be, config, requests));
    lora = std::make_shared<const Flux2Lora>(flux2_lora(config, uses));
  }
  FLUX_ASSIGN_OR_RETURN(
      Flux2Conditioning cond,
      run.model->prepare(prompt, flux2_text_ids(q.l), flux2_image_ids(q.h, q.w), q.timesteps,
                         q.guidance, q.references > 0 ? &refs : nullptr, lora));
  if (run.sequence != nullptr) {
    FLUX_RETURN_IF_ERROR(run.model->enable_sequence_parallel(cond, *run.sequence));
  }
  std::vector<float> all;
  for (int64_t step = 0; step < static_cast<int64_t>(q.timesteps.size()); ++step) {
    FLUX_ASSIGN_OR_RETURN(Tensor v, be.empty(DType::kF32, {q.n(), config.out_channels}));
    FLUX_RETURN_IF_ERROR(run.model->forward(cond, step, x, v));
    if (run.cfg != nullptr) {
      FLUX_ASSIGN_OR_RETURN(Tensor other, be.empty(DType::kF32, {q.n(), config.out_channels}));
      FLUX_ASSIGN_OR_RETURN(Tensor out, be.empty(DType::kF32, {q.n(), config.out_channels}));
      FLUX_RETURN_IF_ERROR(cfg_parallel_combine(be, *run.cfg, v, other, 4.0f, out));
      v = out;
    }
    const std::vector<float> host = download(be, v);
    all.insert(all.end(), host.begin(), host.end());
  }
  return all;
}

// One rank, today's path: each step's velocity, or with `cfg` the CFG velocity
// cfg_combine(negative, positive, 4).
std::vector<float> single_rank(const ModelFactory& factory, const TinyRequest& q, bool cfg) {
  CpuBackend be;
  const std::unique_ptr<Flux2Transformer> model = factory(be);
  auto positive = velocities({&be, model.get()}, q);
  EXPECT_TRUE(positive.ok()) << positive.status();
  if (!cfg || !positive.ok()) return positive.ok() ? *positive : std::vector<float>{};
  auto negative = velocities({&be, model.get(), nullptr, nullptr, true}, q);
  EXPECT_TRUE(negative.ok()) << negative.status();
  const Shape shape = {static_cast<int64_t>(positive->size())};
  Tensor cond = host_tensor(be, shape, *positive), uncond = host_tensor(be, shape, *negative);
  EXPECT_TRUE(be.cfg_combine(uncond, cond, 4.0f, cond).ok());  // as Pipeline::denoising_step
  return download(be, cond);
}

// Every rank's result over `layout` (ranks as threads, each with its own backend and weights).
std::vector<absl::StatusOr<std::vector<float>>> parallel_ranks(const ModelFactory& factory,
                                                               const TinyRequest& q,
                                                               const ParallelLayout& layout) {
  const int ranks = layout.ranks();
  std::vector<std::unique_ptr<CpuBackend>> backends;
  std::vector<std::unique_ptr<Flux2Transformer>> models;
  for (int r = 0; r < ranks; ++r) {
    backends.push_back(std::make_unique<CpuBackend>());
    models.push_back(factory(*backends.back()));
  }
  auto comms = make_rank_communicators(layout, [](const std::vector<int>& members) {
    return absl::StatusOr<std::vector<std::unique_ptr<Communicator>>>(
        create_in_process_group(static_cast<int>(members.size())));
  });
  EXPECT_TRUE(comms.ok()) << comms.status();
  return on_threads<absl::StatusOr<std::vector<float>>>(ranks, [&](int r) {
    RankRun run{backends[r].get(), models[r].get(), (*comms)[r].sequence.get(),
                layout.cfg == 2 ? (*comms)[r].cfg.get() : nullptr, layout.branch(r) == 1};
    return velocities(run, q);
  });
}

// Every rank of `layout` ends with the single-rank velocity within the float32 bar; the ranks
// agree bit for bit with each other; returns whether they equal one rank bit for bit too. They do
// where no GEMM runs on fewer rows than on one rank: OpenBLAS's sgemm gives a row other bits when
// the call has another row count (its tail kernels), so sequence shards differ in the last bits
// (model/README.md, "Several GPUs").
bool expect_matches_single_rank(const ModelFactory& factory, const TinyRequest& q,
                                const ParallelLayout& layout) {
  const std::vector<float> reference = single_rank(factory, q, layout.cfg == 2);
  const auto results = parallel_ranks(factory, q, layout);
  bool bitwise = true;
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    if (!results[r].ok()) return false;
    EXPECT_EQ(results[r]->size(), reference.size());
    const double error = relative_error(*results[r], reference);
    EXPECT_LE(error, kFloat32Bar) << "rank " << r;
    if (r == 0) {
      std::printf("%d x %d ranks: relative error %.3g against one rank\n", layout.cfg,
                  layout.sequence, error);
    }
    EXPECT_TRUE(same_bits(*results[r], *results[0])) << "rank " << r << " differs from rank 0";
    bitwise = bitwise && same_bits(*results[r], reference);
  }
  double norm = 0.0;
  for (float v : reference) norm += static_cast<double>(v) * v;
  EXPECT_GT(norm, 1e-6);  // a real output, not an all-zero one
  return bitwise;
}

ParallelLayout sequence_only(int ranks) {
  return ParallelLayout{1, ranks};
}

TEST(SequenceParallelTest, TinyKleinOverThreeRanksEqualsOneRank) {
  const ModelFactory klein = checkpoint_model("tiny-klein");  // 3 heads
  CpuBackend be;
  const Flux2Config config = klein(be)->config();
  expect_matches_single_rank(klein, make_request(config), sequence_only(3));
  // One rank through the exchange path (a group of one) is today's forward bit for bit.
  EXPECT_TRUE(expect_matches_single_rank(klein, make_request(config), sequence_only(1)));
}

TEST(SequenceParallelTest, LoraAdaptersActOnEveryRanksRows) {
  const ModelFactory klein = checkpoint_model("tiny-klein");
  CpuBackend be;
  const Flux2Config config = klein(be)->config();
  auto bytes = read_file(test_data_dir() + "/tiny-klein/loras/style_diffusers.safetensors", "lora");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto parsed = parse_lora_adapter(
      std::span(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()), config);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  TinyRequest q = make_request(config);
  q.lora = std::make_shared<const LoraAdapter>(std::move(*parsed));
  // q's and k's terms ride inside QK-norm + RoPE, before the exchange.
  expect_matches_single_rank(klein, q, sequence_only(3));
  EXPECT_NE(single_rank(klein, q, false), single_rank(klein, make_request(config), false));
}

TEST(SequenceParallelTest, TinyDevOverTwoRanksEqualsOneRank) {
  const ModelFactory dev = checkpoint_model("tiny-flux2-dev");  // 2 heads, guidance embedder
  CpuBackend be;
  const Flux2Config config = dev(be)->config();
  expect_matches_single_rank(dev, make_request(config), sequence_only(2));
}

TEST(SequenceParallelTest, TwelveHeadsOverTwoToTwelveRanksEqualOneRank) {
  const Flux2Config config = twelve_head_config();
  const ModelFactory model = random_model(config);
  for (int ranks : {2, 3, 4, 6, 12}) {  // 12: S = 11 rows, one rank holds none
    SCOPED_TRACE(::testing::Message() << ranks << " ranks");
    expect_matches_single_rank(model, make_request(config), sequence_only(ranks));
  }
}

TEST(SequenceParallelTest, ReferenceTokensRideInTheShards) {
  const Flux2Config config = twelve_head_config();
  // S = 5 + 6 + 4 = 15 over 4 ranks: 4, 4, 4, 3 rows; the last rank holds references only.
  expect_matches_single_rank(random_model(config), make_request(config, 4), sequence_only(4));
}

TEST(SequenceParallelTest, RepeatedRunsGiveTheSameBits) {
  const Flux2Config config = twelve_head_config();
  const TinyRequest q = make_request(config);
  const auto first = parallel_ranks(random_model(config), q, sequence_only(3));
  const auto second = parallel_ranks(random_model(config), q, sequence_only(3));
  for (size_t r = 0; r < first.size(); ++r) {
    ASSERT_TRUE(first[r].ok() && second[r].ok());
    EXPECT_TRUE(same_bits(*first[r], *second[r])) << "rank " << r;
  }
}

TEST(SequenceParallelTest, CfgOnTwoGroupsEqualsSingleRankCfg) {
  // klein base runs CFG: the tiny-klein transformer with a negative prompt, 2 CFG groups x 3
  // sequence ranks (its 3 heads) and 2 x 1; the 12-head config as 2 x 2 = 4 ranks.
  const ModelFactory klein = checkpoint_model("tiny-klein");
  CpuBackend be;
  const Flux2Config config = klein(be)->config();
  expect_matches_single_rank(klein, make_request(config), ParallelLayout{2, 3});
  // Branches on two ranks, each whole: the same GEMMs as one rank, so the same bits.
  EXPECT_TRUE(expect_matches_single_rank(klein, make_request(config), ParallelLayout{2, 1}));
  const Flux2Config twelve = twelve_head_config();
  expect_matches_single_rank(random_model(twelve), make_request(twelve), ParallelLayout{2, 2});
}

TEST(SequenceParallelTest, RefusesRankCountsThatDoNotDivideTheHeads) {
  const ModelFactory klein = checkpoint_model("tiny-klein");  // 3 heads
  CpuBackend be;
  const std::unique_ptr<Flux2Transformer> model = klein(be);
  for (int ranks : {2, 4}) {
    const absl::Status status = check_sequence_parallel(model->config(), ranks);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("has 3 heads"));
    EXPECT_THAT(std::string(status.message()), HasSubstr("num_attention_heads divisible by"));
  }
  const auto results = parallel_ranks(klein, make_request(model->config()), sequence_only(2));
  for (const auto& result : results) {
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(result.status().message()), HasSubstr("has 3 heads"));
  }
  // --gpus 4 on klein base: 2 CFG branches x 2 sequence ranks, and 2 does not divide 3.
  auto layout = plan_parallel_layout(model->config(), 4, true, "--gpus");
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(layout.status().message()),
              HasSubstr("--gpus 4 (2 CFG branches x 2 sequence ranks): sequence parallelism"));
  auto six = plan_parallel_layout(model->config(), 6, true, "--gpus");
  ASSERT_TRUE(six.ok()) << six.status();
  EXPECT_EQ(six->cfg, 2);
  EXPECT_EQ(six->sequence, 3);
}

TEST(SequenceParallelTest, AFailingRankEndsEveryRanksForward) {
  const Flux2Config config = twelve_head_config();
  const TinyRequest q = make_request(config);
  const int ranks = 3;
  std::vector<std::unique_ptr<CpuBackend>> backends;
  std::vector<std::unique_ptr<Flux2Transformer>> models;
  for (int r = 0; r < ranks; ++r) {
    backends.push_back(std::make_unique<CpuBackend>());
    models.push_back(random_model(config)(*backends.back()));
  }
  auto group = create_in_process_group(ranks);
  auto statuses = on_threads<absl::Status>(ranks, [&](int r) -> absl::Status {
    Backend& be = *backends[r];
    Tensor prompt = host_tensor(be, {q.l, config.joint_attention_dim}, q.prompt);
    Tensor x = host_tensor(be, {q.n(), config.in_channels}, q.latents);
    FLUX_ASSIGN_OR_RETURN(Flux2Conditioning cond,
                          models[r]->prepare(prompt, flux2_text_ids(q.l), flux2_image_ids(q.h, q.w),
                                             q.timesteps, {}));
    FLUX_RETURN_IF_ERROR(models[r]->enable_sequence_parallel(cond, *group[r]));
    Tensor v = be.empty(DType::kF32, {q.n(), config.out_channels}).value();
    // Rank 1 is cancelled before its second block; the others are stopped instead of waiting.
    return models[r]->forward(cond, 0, x, v, nullptr, [r] {
      return r == 1 ? absl::CancelledError("cancelled") : absl::OkStatus();
    });
  });
  EXPECT_EQ(statuses[1].code(), absl::StatusCode::kCancelled);
  for (int r : {0, 2}) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kAborted) << statuses[r];
    EXPECT_THAT(std::string(statuses[r].message()), HasSubstr("rank 1 of 3 ended the group"));
  }
}

// Whole generations on tiny-klein (3 heads, 48 x 32 pixels: 6 image tokens after 32 text tokens),
// each rank's pipeline on its own backend: the image every rank returns and its final latents.
struct RankGeneration {
  absl::StatusOr<GeneratedImage> image = absl::UnknownError("not run");
  std::vector<float> latents;
  // Each on_step_collectives call: the rank it named, the step, the seconds.
  std::vector<std::tuple<int, int64_t, CollectiveSeconds>> collectives;
};

GenerateParams small_request(bool cfg) {
  GenerateParams p;
  p.prompt = "a lighthouse at dusk";
  p.width = 48;
  p.height = 32;
  p.num_inference_steps = 2;
  p.max_sequence_length = 32;
  p.seed = 5;
  if (cfg) p.negative_prompt = "fog";
  return p;
}

// `layout` null: one rank, today's pipeline.
std::vector<RankGeneration> generate_on_ranks(bool distilled, const GenerateParams& params,
                                              std::optional<ParallelLayout> layout) {
  const int ranks = layout ? layout->ranks() : 1;
  std::vector<std::unique_ptr<CpuBackend>> backends;
  std::vector<std::unique_ptr<Pipeline>> pipelines;
  PipelineOptions options;
  options.is_distilled = distilled;
  for (int r = 0; r < ranks; ++r) {
    backends.push_back(std::make_unique<CpuBackend>());
    auto pipeline =
        Pipeline::load(*backends.back(), test_data_dir() + "/tiny-klein/checkpoint", options);
    EXPECT_TRUE(pipeline.ok()) << pipeline.status();
    if (!pipeline.ok()) return {};
    pipelines.push_back(std::move(*pipeline));
  }
  absl::StatusOr<std::vector<RankCommunicators>> comms = std::vector<RankCommunicators>();
  if (layout) {
    comms = make_rank_communicators(*layout, [](const std::vector<int>& members) {
      return absl::StatusOr<std::vector<std::unique_ptr<Communicator>>>(
          create_in_process_group(static_cast<int>(members.size())));
    });
    EXPECT_TRUE(comms.ok()) << comms.status();
    for (int r = 0; r < ranks; ++r) {
      const ParallelRank rank{*layout, r, (*comms)[r].sequence.get(), (*comms)[r].cfg.get()};
      const absl::Status joined = pipelines[r]->join_parallel(rank);
      EXPECT_TRUE(joined.ok()) << joined;
      if (!joined.ok()) return {};
    }
  }
  return on_threads<RankGeneration>(ranks, [&](int r) {
    RankGeneration out;
    GenerateHooks hooks;
    hooks.on_latents = [&](int64_t step, const Tensor& latents) {
      if (step == params.num_inference_steps - 1) out.latents = download(*backends[r], latents);
    };
    hooks.on_step_collectives = [&](int rank, int64_t step, const CollectiveSeconds& seconds) {
      out.collectives.emplace_back(rank, step, seconds);
    };
    out.image = pipelines[r]->generate(params, hooks);
    return out;
  });
}

// Every rank's image and latents against one rank's: the float32 bars of the golden README
// (latents within 1e-4 relative, image_u8 within one level on at most 0.5% of values); the ranks
// agree bit for bit. Returns whether the images equal one rank's byte for byte.
bool expect_generation_matches(bool distilled, const GenerateParams& params,
                               const ParallelLayout& layout) {
  const std::vector<RankGeneration> one = generate_on_ranks(distilled, params, std::nullopt);
  const std::vector<RankGeneration> many = generate_on_ranks(distilled, params, layout);
  if (one.size() != 1 || !one[0].image.ok() || many.size() != static_cast<size_t>(layout.ranks())) {
    ADD_FAILURE() << "a generation did not run";
    return false;
  }
  const std::vector<uint8_t>& ref = one[0].image->rgb;
  bool bitwise = true;
  for (size_t r = 0; r < many.size(); ++r) {
    if (!many[r].image.ok()) {
      ADD_FAILURE() << "rank " << r << ": " << many[r].image.status();
      return false;
    }
    const std::vector<uint8_t>& rgb = many[r].image->rgb;
    EXPECT_EQ(rgb, many[0].image->rgb) << "rank " << r << " differs from rank 0";
    EXPECT_LE(relative_error(many[r].latents, one[0].latents), kFloat32Bar) << "rank " << r;
    if (rgb.size() != ref.size()) {
      ADD_FAILURE() << "rank " << r << ": " << rgb.size() << " bytes, not " << ref.size();
      return false;
    }
    size_t off_by_one = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_LE(std::abs(int{rgb[i]} - int{ref[i]}), 1) << "rank " << r << " value " << i;
      off_by_one += rgb[i] != ref[i];
    }
    EXPECT_LE(static_cast<double>(off_by_one), 0.005 * static_cast<double>(ref.size()));
    bitwise = bitwise && rgb == ref;
    if (r == 0) {
      std::printf("%d x %d ranks: latents %.3g from one rank, %zu of %zu image bytes differ\n",
                  layout.cfg, layout.sequence, relative_error(many[r].latents, one[0].latents),
                  off_by_one, ref.size());
    }
  }
  return bitwise;
}

TEST(SequenceParallelPipelineTest, TinyKleinOverThreeRanksGivesTheSingleRankImage) {
  expect_generation_matches(true, small_request(false), ParallelLayout{1, 3});
}

TEST(SequenceParallelPipelineTest, KleinBaseCfgOverTwoGroupsGivesTheSingleRankImage) {
  // 2 CFG groups x 3 sequence ranks, and 2 x 1 (whole forwards per branch: the same bytes).
  expect_generation_matches(false, small_request(true), ParallelLayout{2, 3});
  EXPECT_TRUE(expect_generation_matches(false, small_request(true), ParallelLayout{2, 1}));
}

TEST(SequenceParallelPipelineTest, EveryRankReportsItsCollectiveTimeOncePerStep) {
  const GenerateParams params = small_request(true);
  const std::vector<RankGeneration> one = generate_on_ranks(false, params, std::nullopt);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_TRUE(one[0].collectives.empty()) << "one rank has no collectives";
  // 2 CFG groups x 3 sequence ranks: all-to-alls around attention, the velocity's gather and the
  // CFG exchange (all-gathers); 2 x 1: whole forwards per branch, the CFG exchange alone.
  for (const ParallelLayout layout : {ParallelLayout{2, 3}, ParallelLayout{2, 1}}) {
    const std::vector<RankGeneration> many = generate_on_ranks(false, params, layout);
    ASSERT_EQ(many.size(), static_cast<size_t>(layout.ranks()));
    for (int r = 0; r < layout.ranks(); ++r) {
      const auto& calls = many[r].collectives;
      ASSERT_EQ(calls.size(), static_cast<size_t>(params.num_inference_steps)) << "rank " << r;
      for (size_t i = 0; i < calls.size(); ++i) {
        const auto& [rank, step, seconds] = calls[i];
        EXPECT_EQ(rank, r);
        EXPECT_EQ(step, static_cast<int64_t>(i));
        EXPECT_GT(seconds.all_gather, 0.0) << "rank " << r << " step " << i;
        if (layout.sequence > 1) {
          EXPECT_GT(seconds.all_to_all, 0.0) << "rank " << r << " step " << i;
        } else {
          EXPECT_EQ(seconds.all_to_all, 0.0) << "rank " << r << " step " << i;
        }
      }
    }
  }
}

TEST(SequenceParallelPipelineTest, RefusesLayoutsThatDoNotFitAndStepCaching) {
  CpuBackend be;
  PipelineOptions options;
  options.is_distilled = true;
  auto pipeline = Pipeline::load(be, test_data_dir() + "/tiny-klein/checkpoint", options);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  auto two = create_in_process_group(2);
  auto one = create_in_process_group(1);
  const absl::Status heads =
      (*pipeline)->join_parallel({ParallelLayout{1, 2}, 0, two[0].get(), one[0].get()});
  EXPECT_EQ(heads.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(heads.message()), HasSubstr("has 3 heads"));
  const absl::Status no_cfg =
      (*pipeline)->join_parallel({ParallelLayout{2, 1}, 0, one[0].get(), two[0].get()});
  EXPECT_THAT(std::string(no_cfg.message()), HasSubstr("runs without CFG"));
  auto three = create_in_process_group(3);
  ASSERT_TRUE(
      (*pipeline)->join_parallel({ParallelLayout{1, 3}, 0, three[0].get(), one[0].get()}).ok());
  GenerateParams cached = small_request(false);
  cached.num_inference_steps = 12;
  cached.cache.mode = StepCacheOptions::Mode::kDbCache;
  EXPECT_THAT(std::string((*pipeline)->validate(cached).message()),
              HasSubstr("does not run over several ranks"));
}

}  // namespace
}  // namespace flux2
