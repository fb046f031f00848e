// The tuned GEMM algorithm table (kernels/cuda/gemm_algorithm_table.h): its JSON form (no device
// needed: these run in CI too), and on the GPU that a table written by --gemm-autotune gives a new
// backend the same algorithm, so the same output bits, within one bf16 rounding of the heuristic's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "kernels/backend_factory.h"
#include "kernels/base/dtype.h"
#include "kernels/cuda/gemm_algorithm_table.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2::testing {
namespace {

using cuda::GemmAlgorithmTable;
using cuda::merge_gemm_algorithms;
using cuda::parse_gemm_algorithms;

GemmAlgorithmTable table_of(const std::string& device, size_t version,
                            std::map<std::string, uint64_t> first_words) {
  GemmAlgorithmTable table{device, version, {}};
  for (const auto& [key, word] : first_words) {
    table.entries[key].algorithm = {word, 2, 3, 4, 5, 6, 7, 0xffffffffffffffffull};
    table.entries[key].tuned_ms = 0.5;
    table.entries[key].heuristic_ms = 0.6;
  }
  return table;
}

TEST(GemmAlgorithmTable, MergeThenParseRoundTripsPerDeviceAndVersion) {
  auto one = merge_gemm_algorithms("", table_of("NVIDIA H200", 130100, {{"m=1 a", 10}}));
  ASSERT_TRUE(one.ok()) << one.status();
  auto two = merge_gemm_algorithms(*one, table_of("NVIDIA H100", 130100, {{"m=1 a", 20}}));
  ASSERT_TRUE(two.ok()) << two.status();
  // Same section: a new key is added, an existing one replaced.
  auto three =
      merge_gemm_algorithms(*two, table_of("NVIDIA H200", 130100, {{"m=1 a", 11}, {"m=2 b", 12}}));
  ASSERT_TRUE(three.ok()) << three.status();

  auto h200 = parse_gemm_algorithms(*three, "NVIDIA H200", 130100);
  ASSERT_TRUE(h200.ok()) << h200.status();
  ASSERT_EQ(h200->entries.size(), 2u);
  EXPECT_EQ(h200->entries.at("m=1 a").algorithm[0], 11u);
  EXPECT_EQ(h200->entries.at("m=2 b").algorithm[0], 12u);
  EXPECT_EQ(h200->entries.at("m=2 b").algorithm[7], 0xffffffffffffffffull);
  EXPECT_DOUBLE_EQ(h200->entries.at("m=2 b").tuned_ms, 0.5);
  EXPECT_DOUBLE_EQ(h200->entries.at("m=2 b").heuristic_ms, 0.6);
  auto h100 = parse_gemm_algorithms(*three, "NVIDIA H100", 130100);
  ASSERT_TRUE(h100.ok());
  ASSERT_EQ(h100->entries.size(), 1u);
  EXPECT_EQ(h100->entries.at("m=1 a").algorithm[0], 20u);
  // Another cuBLASLt version, or a GPU without a section: nothing (the heuristic's algorithms).
  auto other_version = parse_gemm_algorithms(*three, "NVIDIA H200", 130200);
  ASSERT_TRUE(other_version.ok());
  EXPECT_TRUE(other_version->entries.empty());
  auto other_gpu = parse_gemm_algorithms(*three, "NVIDIA B200", 130100);
  ASSERT_TRUE(other_gpu.ok());
  EXPECT_TRUE(other_gpu->entries.empty());
}

TEST(GemmAlgorithmTable, MalformedDocumentsNameWhatIsWrong) {
  for (const char* bad : {"not json", "[]", R"({"tables": 3})", R"({"tables": [{"device": 1}]})"}) {
    auto parsed = parse_gemm_algorithms(bad, "NVIDIA H200", 1);
    EXPECT_TRUE(absl::IsInvalidArgument(parsed.status())) << bad;
  }
  const std::string bad_bits =
      R"({"tables": [{"device": "G", "cublaslt_version": 1, "algorithms": {"m=1": {"algorithm": "1 2 3"}}}]})";
  auto parsed = parse_gemm_algorithms(bad_bits, "G", 1);
  ASSERT_TRUE(absl::IsInvalidArgument(parsed.status()));
  EXPECT_EQ(parsed.status().message(),
            "algorithms[\"m=1\"].algorithm: expected 8 hexadecimal words, got 3");
  const std::string not_hex =
      R"({"tables": [{"device": "G", "cublaslt_version": 1, "algorithms": {"k": {"algorithm": "1 2 3 4 5 6 7 xyz"}}}]})";
  EXPECT_EQ(parse_gemm_algorithms(not_hex, "G", 1).status().message(),
            "algorithms[\"k\"].algorithm: \"xyz\" is not a 64-bit hex word");
}

TEST(GemmAlgorithmTable, TheBuiltinTableParses) {
  EXPECT_TRUE(parse_gemm_algorithms(cuda::builtin_gemm_algorithms(), "any", 0).ok());
}

// One bf16 rounding of the larger magnitude: the most two fp32 sums of the same products in
// different orders can differ after rounding to bf16 (their fp32 difference, at most
// 2·K·2^-24·Σ|x·w| ~ 1e-4 relative here, is far below bf16's 2^-8 spacing).
bool within_one_rounding(uint16_t a, uint16_t b) {
  const float fa = bf16_bits_to_f32(a), fb = bf16_bits_to_f32(b);
  const float larger = std::max(std::fabs(fa), std::fabs(fb));
  return std::fabs(fa - fb) <= std::ldexp(1.0f, std::ilogb(larger) - 7) + 1e-30f;
}

TEST(GemmAlgorithmTableGpu, TunedTableGivesANewBackendTheSameBits) {
  FLUX2_REQUIRE_GPU(shared);
  constexpr int64_t m = 1536, n = 3072, k = 3072;
  auto run = [&](const BackendOptions& options, std::vector<uint16_t>* out,
                 std::map<std::string, int64_t>* stats, std::string* table) {
    auto be = create_backend("cuda", options);
    ASSERT_TRUE(be.ok()) << be.status();
    Backend& b = **be;
    const Tensor x = random_bf16(b, m, k, 1);
    const Weight w{random_bf16(b, n, k, 2)};
    auto y = b.empty(DType::kBF16, {m, n});
    ASSERT_TRUE(y.ok());
    ASSERT_TRUE(b.linear(x, w, Tensor(), *y).ok());
    *out = bits(b, *y);
    *stats = b.gemm_plan_stats();
    if (table != nullptr) {
      auto exported = b.export_gemm_algorithms("");
      ASSERT_TRUE(exported.ok()) << exported.status();
      *table = *exported;
    }
  };
  BackendOptions heuristic;
  heuristic.gemm_algorithms = "heuristic";
  BackendOptions tuning = heuristic;
  tuning.gemm_autotune = true;
  std::vector<uint16_t> plain, tuned, replayed;
  std::map<std::string, int64_t> plain_stats, tuned_stats, replayed_stats;
  std::string table;
  run(heuristic, &plain, &plain_stats, nullptr);
  run(tuning, &tuned, &tuned_stats, &table);
  EXPECT_EQ(plain_stats.at("from_table"), 0);
  EXPECT_EQ(tuned_stats.at("timed"), 1);
  ASSERT_NE(table.find("\"algorithms\""), std::string::npos);

  const std::string path = ::testing::TempDir() + "/gemm_algorithms_test.json";
  std::ofstream(path) << table;
  BackendOptions from_file;
  from_file.gemm_algorithms = path;
  run(from_file, &replayed, &replayed_stats, nullptr);
  std::remove(path.c_str());
  EXPECT_EQ(replayed_stats.at("from_table"), 1);
  EXPECT_EQ(replayed_stats.at("timed"), 0);
  ASSERT_EQ(replayed.size(), tuned.size());
  EXPECT_TRUE(replayed == tuned) << "the table's algorithm must reproduce the tuned bits";
  int64_t beyond = 0, differ = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    differ += plain[i] != tuned[i];
    beyond += !within_one_rounding(plain[i], tuned[i]);
  }
  EXPECT_EQ(beyond, 0) << differ << " of " << plain.size() << " outputs differ";
}

// The step tuner's handle (Backend::gemm_candidates): every candidate of a plan computes the same
// product within one bf16 rounding, the chosen one is what later calls run and what the exported
// table holds, and an index outside the candidates is refused.
TEST(GemmAlgorithmTableGpu, EveryCandidateComputesTheSameProduct) {
  FLUX2_REQUIRE_GPU(shared);
  BackendOptions options;
  options.gemm_algorithms = "heuristic";
  auto be = create_backend("cuda", options);
  ASSERT_TRUE(be.ok()) << be.status();
  Backend& b = **be;
  constexpr int64_t m = 1024, n = 2048, k = 3072;
  const Tensor x = random_bf16(b, m, k, 3);
  const Weight w{random_bf16(b, n, k, 4)};
  auto y = b.empty(DType::kBF16, {m, n});
  ASSERT_TRUE(y.ok());
  ASSERT_TRUE(b.linear(x, w, Tensor(), *y).ok());
  const std::vector<uint16_t> first = bits(b, *y);
  GemmCandidates* tuner = b.gemm_candidates();
  ASSERT_NE(tuner, nullptr);
  const std::vector<std::string> keys = tuner->keys();
  ASSERT_EQ(keys.size(), 1u);
  const int count = tuner->count(keys[0]);
  ASSERT_GE(count, 2) << keys[0];
  for (int i = 1; i < count; ++i) {
    ASSERT_TRUE(tuner->choose(keys[0], i, 1.0, 2.0).ok());
    ASSERT_TRUE(b.linear(x, w, Tensor(), *y).ok());
    const std::vector<uint16_t> other = bits(b, *y);
    int64_t beyond = 0;
    for (size_t j = 0; j < first.size(); ++j) beyond += !within_one_rounding(first[j], other[j]);
    EXPECT_EQ(beyond, 0) << "candidate " << i << " of " << keys[0];
  }
  EXPECT_TRUE(absl::IsOutOfRange(tuner->choose(keys[0], count, 0.0, 0.0)));
  EXPECT_TRUE(absl::IsNotFound(tuner->choose("m=1 no such plan", 0, 0.0, 0.0)));
  auto exported = b.export_gemm_algorithms("");
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_NE(exported->find(keys[0]), std::string::npos);
  EXPECT_NE(exported->find("\"tuned_ms\": 1.0"), std::string::npos) << *exported;
}

}  // namespace
}  // namespace flux2::testing
