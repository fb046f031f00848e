// The engine over P ranks (server/serving/parallel_engine.h) on CPU ranks with the in-process
// communicator and the tiny checkpoints: its image is the single-rank engine's (float32 bar), a
// cancelled or late request stops every rank at one stage boundary and the next request runs, a
// rank that fails breaks the engine (device_status), memory is reported per rank, listed device
// ordinals name the ranks, every rank reports its collective time per step, and the bench's engine
// over random weights gives one rank's image.
// Run: ctest --test-dir build-cpu -R ParallelEngine --output-on-failure
#include "server/serving/parallel_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "kernels/base/read_file.h"
#include "kernels/cpu/cpu_backend.h"
#include "nlohmann/json.hpp"
#include "server/serving/pipeline_engine.h"
#include "server/serving/stage_decisions.h"

namespace flux2::server {
namespace {

using ::testing::HasSubstr;

// A rank that waits forever is a failed test, not a hung one.
constexpr auto kHangLimit = std::chrono::seconds(60);

std::string tiny_klein() {
  return std::string(FLUX2_TEST_DATA_DIR) + "/tiny-klein/checkpoint";
}

PipelineOptions pipeline_options(bool distilled) {
  PipelineOptions options;
  options.is_distilled = distilled;
  return options;
}

std::unique_ptr<Engine> single_engine(bool distilled) {
  auto engine = load_pipeline_engine("cpu", {}, true, tiny_klein(), pipeline_options(distilled));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Devices 0 .. count-1, as --gpus N gives them.
std::vector<int> first_devices(int count) {
  std::vector<int> devices;
  for (int i = 0; i < count; ++i) devices.push_back(i);
  return devices;
}

// Through the server's own wiring: CPU backends on "devices" 0 .. ranks-1, in-process groups.
std::unique_ptr<Engine> parallel_engine(int ranks, bool distilled) {
  auto engine = load_parallel_engine(first_devices(ranks), "cpu", {}, true, tiny_klein(),
                                     pipeline_options(distilled));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

GenerateParams small_request(bool cfg) {
  GenerateParams p;
  p.prompt = "a lighthouse at dusk";
  p.width = 48;
  p.height = 32;
  p.num_inference_steps = 3;
  p.max_sequence_length = 32;
  p.seed = 5;
  if (cfg) {
    p.negative_prompt = "fog";
    p.guidance_scale = 4.0;
  }
  return p;
}

// engine.generate on another thread; aborts the test binary if it does not return in time.
absl::StatusOr<GeneratedImage> generate_within_limit(Engine& engine, const GenerateParams& params,
                                                     const GenerateHooks& hooks = {}) {
  auto future = std::async(std::launch::async, [&] { return engine.generate(params, hooks); });
  if (future.wait_for(kHangLimit) != std::future_status::ready) {
    std::fprintf(stderr, "generate() did not return within the limit: a rank hangs\n");
    std::fflush(nullptr);
    std::abort();
  }
  return future.get();
}

// The float32 bar of the sequence-parallel tests on 8-bit images: every value within one level of
// the single-rank image's, at most 0.5% of them off by one (tests/data/README.md's image bar).
void expect_within_float32_bar(const GeneratedImage& image, const GeneratedImage& reference) {
  ASSERT_EQ(image.width, reference.width);
  ASSERT_EQ(image.height, reference.height);
  ASSERT_EQ(image.rgb.size(), reference.rgb.size());
  size_t off_by_one = 0;
  for (size_t i = 0; i < image.rgb.size(); ++i) {
    ASSERT_LE(std::abs(int{image.rgb[i]} - int{reference.rgb[i]}), 1) << "value " << i;
    off_by_one += image.rgb[i] != reference.rgb[i];
  }
  EXPECT_LE(static_cast<double>(off_by_one), 0.005 * static_cast<double>(image.rgb.size()));
}

TEST(ParallelEngineTest, ThreeSequenceRanksGiveTheSingleRankImageWithProgressFromRankZero) {
  std::unique_ptr<Engine> one = single_engine(true);
  std::unique_ptr<Engine> three = parallel_engine(3, true);  // tiny-klein: 3 heads, 1 x 3
  ASSERT_NE(one, nullptr);
  ASSERT_NE(three, nullptr);
  const GenerateParams params = small_request(false);
  absl::StatusOr<GeneratedImage> reference = one->generate(params, {});
  ASSERT_TRUE(reference.ok()) << reference.status();
  int steps_seen = 0, checks = 0;
  GenerateHooks hooks;
  hooks.on_step = [&](int64_t, int64_t, double) { ++steps_seen; };
  hooks.check_continue = [&] {
    ++checks;
    return absl::OkStatus();
  };
  absl::StatusOr<GeneratedImage> image = generate_within_limit(*three, params, hooks);
  ASSERT_TRUE(image.ok()) << image.status();
  expect_within_float32_bar(*image, *reference);
  EXPECT_EQ(steps_seen, params.num_inference_steps);  // rank 0's hooks only
  EXPECT_EQ(checks, params.num_inference_steps + 2);  // text encoder, each step, decode
  EXPECT_EQ(three->memory_stats().size(), 3u);
  EXPECT_TRUE(three->device_status().ok());
}

TEST(ParallelEngineTest, TwoCfgRanksGiveTheSingleRankImageBitForBit) {
  // klein base over 2 ranks: one CFG branch per rank (2 x 1), each forward the single-rank one.
  std::unique_ptr<Engine> one = single_engine(false);
  std::unique_ptr<Engine> two = parallel_engine(2, false);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  const GenerateParams params = small_request(true);
  absl::StatusOr<GeneratedImage> reference = one->generate(params, {});
  ASSERT_TRUE(reference.ok()) << reference.status();
  absl::StatusOr<GeneratedImage> image = generate_within_limit(*two, params);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->rgb, reference->rgb);
}

TEST(ParallelEngineTest, CancelledAndLateRequestsStopEveryRankAndTheNextRequestRuns) {
  std::unique_ptr<Engine> three = parallel_engine(3, true);
  ASSERT_NE(three, nullptr);
  const GenerateParams params = small_request(false);
  absl::StatusOr<GeneratedImage> first = generate_within_limit(*three, params);
  ASSERT_TRUE(first.ok()) << first.status();
  // Cancelled before step 1 (the third boundary), then late before the decode (the last).
  const std::vector<std::pair<int, absl::Status>> stops = {
      {3, absl::CancelledError("the client went away")},
      {params.num_inference_steps + 2, absl::DeadlineExceededError("the deadline passed")}};
  for (const auto& [at, stop] : stops) {
    int checks = 0, steps_seen = 0;
    GenerateHooks hooks;
    hooks.check_continue = [&, at = at, stop = stop] {
      return ++checks == at ? stop : absl::OkStatus();
    };
    hooks.on_step = [&](int64_t, int64_t, double) { ++steps_seen; };
    absl::StatusOr<GeneratedImage> stopped = generate_within_limit(*three, params, hooks);
    EXPECT_EQ(stopped.status(), stop);
    EXPECT_EQ(checks, at);
    EXPECT_EQ(steps_seen, at - 2);
    EXPECT_TRUE(three->device_status().ok()) << three->device_status();
    absl::StatusOr<GeneratedImage> next = generate_within_limit(*three, params);
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(next->rgb, first->rgb);
  }
}

TEST(ParallelEngineTest, ARankThatFailsBreaksTheEngine) {
  std::unique_ptr<Engine> three = parallel_engine(3, true);
  ASSERT_NE(three, nullptr);
  const GenerateParams params = small_request(false);
  int checks = 0;
  GenerateHooks hooks;
  // As the worker's --test-inject-fault does, from rank 0's check: the last rank provokes it at
  // its next boundary, and the CPU backend, which cannot, fails that rank instead.
  hooks.check_continue = [&] {
    if (++checks == 2) return three->inject_fault(InjectedFault::kIllegalAddress, 0.0);
    return absl::OkStatus();
  };
  absl::StatusOr<GeneratedImage> failed = generate_within_limit(*three, params, hooks);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("rank 2 of 3 failed"));
  const absl::Status device = three->device_status();
  EXPECT_FALSE(device.ok());
  EXPECT_THAT(std::string(device.message()), HasSubstr("rank 2 of 3 failed"));
  EXPECT_EQ(three->memory_stats().size(), 3u);
  absl::StatusOr<GeneratedImage> after = generate_within_limit(*three, params);
  EXPECT_EQ(after.status(), device);  // broken for good
}

TEST(ParallelEngineTest, RefusesLayoutsThatDoNotFitKleinKvAndMissingDevices) {
  // tiny-klein has 3 heads: 2 sequence ranks do not divide them (distilled: no CFG groups).
  auto two =
      load_parallel_engine(first_devices(2), "cpu", {}, true, tiny_klein(), pipeline_options(true));
  ASSERT_FALSE(two.ok());
  EXPECT_EQ(two.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(two.status().message()), HasSubstr("--gpus 2"));
  EXPECT_THAT(std::string(two.status().message()), HasSubstr("has 3 heads"));
  // klein-KV's cached reference K/V is not sharded: refused naming the flag.
  PipelineOptions kv = pipeline_options(true);
  kv.kv_cache = true;
  auto kv_three = load_parallel_engine(first_devices(3), "cpu", {}, true, tiny_klein(), kv);
  ASSERT_FALSE(kv_three.ok());
  EXPECT_THAT(std::string(kv_three.status().message()), HasSubstr("--gpus 3: "));
  EXPECT_THAT(std::string(kv_three.status().message()), HasSubstr("klein-kv"));
  // More CUDA devices than any CI machine has (or no CUDA backend at all in this build).
  auto cuda = load_parallel_engine(first_devices(64), "cuda", {}, true, tiny_klein(),
                                   pipeline_options(true));
  ASSERT_FALSE(cuda.ok());
  EXPECT_THAT(std::string(cuda.status().message()),
              ::testing::AnyOf(HasSubstr("--gpus 64: this process sees"),
                               HasSubstr("--backend cuda: this build has no CUDA backend")));
}

TEST(ParallelEngineTest, ListedDevicesNameTheRanksAndEveryRankReportsItsCollectives) {
  // --gpus 2,5,7 on the CPU: three ranks (the ordinals only name them), labelled 2, 5 and 7.
  auto engine =
      load_parallel_engine({2, 5, 7}, "cpu", {}, true, tiny_klein(), pipeline_options(true));
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->device_ordinals(), (std::vector<int>{2, 5, 7}));
  EXPECT_EQ((*engine)->memory_stats().size(), 3u);
  const GenerateParams params = small_request(false);
  std::mutex mu;
  std::map<int, std::vector<int64_t>> steps_by_rank;
  std::map<int, double> all_to_all_by_rank;
  GenerateHooks hooks;
  hooks.on_step_collectives = [&](int rank, int64_t step, const CollectiveSeconds& seconds) {
    std::lock_guard<std::mutex> lock(mu);  // from every rank's thread
    steps_by_rank[rank].push_back(step);
    all_to_all_by_rank[rank] += seconds.all_to_all;
  };
  absl::StatusOr<GeneratedImage> image = generate_within_limit(**engine, params, hooks);
  ASSERT_TRUE(image.ok()) << image.status();
  ASSERT_EQ(steps_by_rank.size(), 3u);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(steps_by_rank[rank], (std::vector<int64_t>{0, 1, 2})) << "rank " << rank;
    EXPECT_GT(all_to_all_by_rank[rank], 0.0) << "rank " << rank;
  }
}

// Random weights at tiny-klein's shapes (its configs and tokenizer), as `flux2 bench --concurrency
// --gpus` builds them at the published ones.
RandomPipelineSpec tiny_random_spec() {
  RandomPipelineSpec spec;
  spec.name = "tiny-klein (random weights)";
  const auto config = [](const std::string& component) {
    absl::StatusOr<std::string> text =
        read_file(tiny_klein() + "/" + component + "/config.json", component);
    EXPECT_TRUE(text.ok()) << text.status();
    return nlohmann::json::parse(text.value_or("{}"));
  };
  spec.transformer = Flux2Config::from_json(config("transformer"), "transformer").value();
  spec.text_encoder = TextEncoderConfig::from_json(config("text_encoder"), "text_encoder").value();
  spec.vae = VaeConfig::from_json(config("vae"), "vae").value();
  spec.tokenizer_dir = tiny_klein() + "/tokenizer";
  return spec;
}

TEST(ParallelEngineTest, RandomWeightsOverThreeRanksGiveTheSingleRankImage) {
  const RandomPipelineSpec spec = tiny_random_spec();
  auto one = random_pipeline_engine(std::make_unique<CpuBackend>(), spec);
  ASSERT_TRUE(one.ok()) << one.status();
  auto three = random_parallel_engine({0, 1, 2}, "cpu", {}, spec);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ((*three)->device_ordinals(), (std::vector<int>{0, 1, 2}));
  const GenerateParams params = small_request(false);
  absl::StatusOr<GeneratedImage> reference = (*one)->generate(params, {});
  ASSERT_TRUE(reference.ok()) << reference.status();
  absl::StatusOr<GeneratedImage> image = generate_within_limit(**three, params);
  ASSERT_TRUE(image.ok()) << image.status();
  expect_within_float32_bar(*image, *reference);  // every rank drew the same weights
  auto twice = random_parallel_engine({2, 2}, "cpu", {}, spec);
  EXPECT_EQ(twice.status().message(), "--gpus 2,2: device 2 is listed twice");
}

TEST(ParallelEngineTest, RefusesListedDevicesThatRepeatDoNotFitOrDoNotExist) {
  auto twice = load_parallel_engine({1, 1}, "cpu", {}, true, tiny_klein(), pipeline_options(true));
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(twice.status().message(), "--gpus 1,1: device 1 is listed twice");
  // Two listed devices are two sequence ranks, which do not divide tiny-klein's 3 heads.
  auto heads = load_parallel_engine({4, 6}, "cpu", {}, true, tiny_klein(), pipeline_options(true));
  ASSERT_FALSE(heads.ok());
  EXPECT_THAT(std::string(heads.status().message()), HasSubstr("--gpus 4,6: rank count 2"));
  EXPECT_THAT(std::string(heads.status().message()), HasSubstr("has 3 heads"));
  // An ordinal past any CI machine's devices (or no CUDA backend at all in this build).
  auto cuda = load_parallel_engine({0, 63}, "cuda", {}, true, tiny_klein(), pipeline_options(true));
  ASSERT_FALSE(cuda.ok());
  EXPECT_THAT(std::string(cuda.status().message()),
              ::testing::AnyOf(HasSubstr("--gpus 0,63: this process sees"),
                               HasSubstr("--backend cuda: this build has no CUDA backend")));
}

TEST(StageDecisionsTest, OtherRanksGetRankZerosAnswersAndEndWakesThem) {
  StageDecisions decisions(2);
  EXPECT_TRUE(decisions.decide(nullptr).ok());
  EXPECT_TRUE(decisions.await(1).ok());
  EXPECT_EQ(decisions.decide([] { return absl::CancelledError("stop"); }).code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(decisions.await(1).code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(decisions.stop().has_value());
  EXPECT_EQ(decisions.stop()->code(), absl::StatusCode::kCancelled);
  // Rank 1 waits at a boundary rank 0 never reaches: end() wakes it.
  auto waiting = std::async(std::launch::async, [&] { return decisions.await(1); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  decisions.end(absl::InternalError("rank 0 failed"));
  ASSERT_EQ(waiting.wait_for(kHangLimit), std::future_status::ready);
  const absl::Status ended = waiting.get();
  EXPECT_EQ(ended.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(ended.message()), HasSubstr("rank 0 failed"));
}

}  // namespace
}  // namespace flux2::server
