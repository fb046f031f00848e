// Small host units: command-line parsing and the backend flags, backend creation by name, request
// scopes, parallel_for, the relative-error measure, RoPE tables, the timestep embedding and the
// CUDA driver message (each against values derived by hand from their spec), and read_file.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "kernels/backend_factory.h"
#include "kernels/base/cuda_driver.h"
#include "kernels/base/decimal.h"
#include "kernels/base/numerics.h"
#include "kernels/base/parallel.h"
#include "kernels/base/read_file.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/rope.h"
#include "model/timestep_embedding.h"
#include "server/common/backend_flags.h"
#include "server/common/command_line.h"
#include "server/common/embedded_checkpoint.h"

namespace flux2 {
namespace {

// `--name value`, `--name=value`, flags, positional words; a value of the wrong type, an unknown
// option and a missing value are errors that name the flag; a repeated option keeps its last
// value, one bound to a vector every value.
TEST(CommandLineTest, ParsesValuesFlagsAndPositionals) {
  const char* argv[] = {"flux2", "cmd", "--a", "1", "--b=x y", "--json", "word", "--c", "2.5"};
  CommandLine app("flux2 cmd");
  int64_t a = 0, missing = 7;
  std::string b;
  bool json = false;
  double c = 0;
  app.add_option("--a", a);
  app.add_option("--b", b);
  app.add_flag("--json", json);
  app.add_option("--c", c);
  app.add_option("--missing", missing);
  auto words = app.parse_words(9, const_cast<char**>(argv), 2);
  ASSERT_TRUE(words.ok()) << words.status();
  EXPECT_EQ(b, "x y");
  EXPECT_TRUE(json);
  EXPECT_EQ(a, 1);
  EXPECT_EQ(c, 2.5);
  EXPECT_EQ(missing, 7);
  EXPECT_EQ(*words, std::vector<std::string>{"word"});
  EXPECT_NE(app.parse_flags(9, const_cast<char**>(argv), 2).message().find("\"word\""),
            std::string::npos);
  {
    CommandLine typed("flux2 cmd");
    int64_t b_as_int = 0;
    typed.add_option("--b", b_as_int);
    const char* one[] = {"flux2", "cmd", "--b=x y"};
    const absl::Status status = typed.parse_flags(3, const_cast<char**>(one), 2);
    EXPECT_NE(status.message().find("--b"), std::string::npos) << status;
  }
  {
    CommandLine known("flux2 cmd");
    std::string ignored;
    known.add_option("--a", ignored);
    known.add_option("--b", ignored);
    known.add_flag("--json");
    const absl::Status unknown = known.parse_flags(9, const_cast<char**>(argv), 2);
    EXPECT_EQ(unknown.message(), "unknown option --c (known: --a --b --json)") << unknown;
  }
  {
    CommandLine dangling_app("flux2 cmd");
    dangling_app.add_option("--a", a);
    const char* dangling[] = {"flux2", "cmd", "--a"};
    const absl::Status status = dangling_app.parse_flags(3, const_cast<char**>(dangling), 2);
    EXPECT_FALSE(status.ok());
    EXPECT_NE(status.message().find("--a"), std::string::npos) << status;
  }
  CommandLine repeated("flux2 cmd");
  std::vector<std::string> all;
  repeated.add_option("--a", a);
  repeated.add_option("--all", all)->allow_extra_args(false);
  const char* twice[] = {"flux2", "--a", "1", "--all", "x", "--a=2", "--all=y"};
  ASSERT_TRUE(repeated.parse_flags(7, const_cast<char**>(twice), 1).ok());
  EXPECT_EQ(a, 2);
  EXPECT_EQ(all, (std::vector<std::string>{"x", "y"}));
}

TEST(EmbeddedCheckpointTest, InstalledLayoutIsBesideTheBinary) {
  EXPECT_EQ(installed_checkpoint_dir("/opt/flux2/bin/flux2_server"),
            "/opt/flux2/share/flux2/tiny-klein/checkpoint");
  // This test binary is not installed: the build's directory, which holds the checkpoint.
  EXPECT_EQ(embedded_checkpoint_dir(), FLUX2_TINY_CHECKPOINT_DIR);
}

TEST(BackendFactoryTest, CreatesByName) {
  auto cpu = create_backend("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ((*cpu)->name(), "cpu");
  EXPECT_EQ(create_backend("tpu").status().code(), absl::StatusCode::kInvalidArgument);
  auto cuda = create_backend("cuda");
  // Without a CUDA device (or without CUDA in the build) the backend is NotFound, never a crash
  // (and never another code: that would make GPU tests and `--backend auto` treat a broken GPU as
  // an absent one).
  if (!cuda.ok()) {
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kNotFound) << cuda.status();
  }
}

// No driver reads as no GPU (the CPU fallback applies); an old driver is a GPU that cannot be used,
// said with both versions and what to do.
TEST(CudaDriverTest, NoDriverIsNoDeviceAndAnOldOneSaysWhichVersions) {
  EXPECT_TRUE(absl::IsNotFound(insufficient_driver_status(0, 13000)));
  const absl::Status old = insufficient_driver_status(12020, 13000);
  EXPECT_TRUE(absl::IsFailedPrecondition(old));
  EXPECT_EQ(old.message(),
            "the NVIDIA driver is too old: it supports CUDA 12.2 but this build needs CUDA 13.0; "
            "install a driver for CUDA 13.0 or newer (or run with --backend cpu)");
}

TEST(BackendFlagsTest, ParseDescribeAndNameTheFlagOnErrors) {
  const char* argv[] = {"flux2",
                        "--cpu-threads",
                        "3",
                        "--fp8-attention",
                        "off",
                        "--gemm-autotune=on",
                        "--gemm-algorithms",
                        "heuristic"};
  CommandLine app("flux2");
  BackendOptions options;
  add_backend_flags(app, options);
  const absl::Status parsed = app.parse_flags(8, const_cast<char**>(argv), 1);
  ASSERT_TRUE(parsed.ok()) << parsed;
  EXPECT_EQ(options.cpu_threads, 3);
  EXPECT_FALSE(options.fp8_attention);
  EXPECT_TRUE(options.gemm_autotune);
  using Pairs = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(options.describe(), (Pairs{{"cpu-threads", "3"},
                                       {"fp8-attention", "off"},
                                       {"gemm-autotune", "on"},
                                       {"gemm-algorithms", "heuristic"}}));
  EXPECT_EQ(BackendOptions{}.describe(), (Pairs{{"cpu-threads", "0"},
                                                {"fp8-attention", "on"},
                                                {"gemm-autotune", "off"},
                                                {"gemm-algorithms", "builtin"}}));
  for (const char* bad :
       {"--fp8-attention=maybe", "--cpu-threads=-2", "--gemm-autotune=1", "--gemm-algorithms="}) {
    const char* one[] = {"flux2", bad};
    CommandLine bad_app("flux2");
    BackendOptions ignored;
    add_backend_flags(bad_app, ignored);
    const absl::Status status = bad_app.parse_flags(2, const_cast<char**>(one), 1);
    const std::string flag = std::string(bad).substr(0, std::string(bad).find('='));
    EXPECT_NE(status.message().find(flag), std::string::npos) << bad << ": " << status;
  }
}

// The messages flux2_server and every subcommand print for bad backend flags and on|off switches.
TEST(BackendFlagsTest, ErrorsSayWhatIsWrong) {
  for (const auto& [word, message] : std::vector<std::pair<std::string, std::string>>{
           {"--cpu-threads=x", "--cpu-threads: \"x\" is not an integer"},
           {"--cpu-threads=2000", "--cpu-threads: 2000 is outside 0..1024 (0: one per core)"},
           {"--fp8-attention=maybe", "--fp8-attention: \"maybe\" is not on or off"},
           {"--gemm-algorithms=", "--gemm-algorithms: 1 required SRC missing"},
           {"--fast-paths=1", "--fast-paths: \"1\" is not on or off"}}) {
    CommandLine app("flux2");
    BackendOptions options;
    bool fast_paths = true;
    add_backend_flags(app, options);
    add_on_off_option(app, "--fast-paths", fast_paths);
    std::string copy = word;
    char* one[] = {const_cast<char*>("flux2"), copy.data()};
    EXPECT_EQ(app.parse_flags(2, one, 1).message(), message);
  }
  const char* empty[] = {"flux2", "--gemm-algorithms", ""};
  CommandLine app("flux2");
  BackendOptions options;
  add_backend_flags(app, options);
  EXPECT_EQ(app.parse_flags(3, const_cast<char**>(empty), 1).message(),
            "--gemm-algorithms: expected builtin, heuristic or a table file");
}

// A request's options hold for its scope only; a nested scope (the text encoder's lossless one
// inside a quality=high request) restores its request's options at its end.
TEST(RequestScopeTest, OptionsHoldForTheScopeAndNestedScopesRestore) {
  CpuBackend be;
  EXPECT_EQ(be.request().quality, Quality::kLossless);
  EXPECT_TRUE(be.request().fast_paths);
  {
    const RequestScope request(be, {Quality::kHigh, false});
    EXPECT_EQ(be.request().quality, Quality::kHigh);
    EXPECT_FALSE(be.request().fast_paths);
    {
      const RequestScope text(be, be.request().at_lossless());
      EXPECT_EQ(be.request().quality, Quality::kLossless);
      EXPECT_FALSE(be.request().fast_paths) << "at_lossless keeps the request's switch";
    }
    EXPECT_EQ(be.request().quality, Quality::kHigh);
  }
  EXPECT_EQ(be.request().quality, Quality::kLossless);
  EXPECT_TRUE(be.request().fast_paths);
}

// parallel_for covers [0, n) with disjoint chunks, at most one per thread, none below
// min_chunk items (unless n is smaller), and runs nested calls serially on the calling thread.
TEST(ParallelForTest, ChunksCoverTheRangeOnceAndNestedCallsRunInline) {
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003}}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::mutex mutex;
    std::vector<std::pair<int64_t, int64_t>> chunks;
    parallel_for(n, 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hits[i]++;
      std::lock_guard<std::mutex> lock(mutex);
      chunks.emplace_back(begin, end);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << ", item " << i;
    EXPECT_LE(static_cast<int>(chunks.size()), std::max(1, parallel_thread_count()));
    for (const auto& [begin, end] : chunks) {
      if (chunks.size() > 1) {
        EXPECT_GE(end - begin, 16) << "n " << n;
      }
    }
  }
  std::atomic<int> inner_total{0};
  parallel_for(64, 1, [&](int64_t begin, int64_t end) {
    const std::thread::id outer = std::this_thread::get_id();
    parallel_for(10, 1, [&](int64_t b, int64_t e) {
      EXPECT_TRUE(std::this_thread::get_id() == outer) << "a nested call left its thread";
      inner_total += static_cast<int>(e - b);
    });
  });
  EXPECT_EQ(inner_total.load() % 10, 0);
  EXPECT_GE(inner_total.load(), 10);
  // The pool is sized once: asking for its own size again is fine, another size is refused.
  EXPECT_TRUE(set_parallel_thread_count(parallel_thread_count()).ok());
  EXPECT_EQ(set_parallel_thread_count(parallel_thread_count() + 1).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(set_parallel_thread_count(-1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(NumericsTest, RelativeL2Error) {
  EXPECT_DOUBLE_EQ(relative_l2_error(std::vector<float>{3, 4}, std::vector<float>{3, 4}), 0.0);
  EXPECT_NEAR(relative_l2_error(std::vector<float>{3, 5}, std::vector<float>{3, 4}), 0.2,
              1e-12);  // |(0,1)| / 5
  EXPECT_TRUE(std::isinf(relative_l2_error(std::vector<float>{NAN, 4}, std::vector<float>{3, 4})));
  EXPECT_TRUE(std::isinf(relative_l2_error(std::vector<float>{1}, std::vector<float>{0})));
  EXPECT_TRUE(std::isinf(relative_l2_error(std::vector<float>{1, 2}, std::vector<float>{1})));
}

TEST(RopeTest, Flux2TablesFollowTheAxisLayout) {
  // One text token (0, 0, 0, l = 5) and one image token (0, row 2, col 3, 0); axes of 4 dims.
  const std::vector<int64_t> ids = {0, 0, 0, 5, 0, 2, 3, 0};
  const RopeTables t = flux2_rope_tables(ids, {4, 4, 4, 4}, 2000.0);
  ASSERT_EQ(t.cos.size(), 32u);
  for (int d = 0; d < 16; ++d) {
    const int axis = d / 4, pair = (d % 4) / 2;
    const double frequency = 1.0 / std::pow(2000.0, 2.0 * pair / 4.0);
    const double text_position = axis == 3 ? 5 : 0;
    const double image_position = axis == 1 ? 2 : (axis == 2 ? 3 : 0);
    EXPECT_NEAR(t.cos[d], std::cos(text_position * frequency), 1e-6) << d;
    EXPECT_NEAR(t.sin[d], std::sin(text_position * frequency), 1e-6) << d;
    EXPECT_NEAR(t.cos[16 + d], std::cos(image_position * frequency), 1e-6) << d;
    EXPECT_NEAR(t.sin[16 + d], std::sin(image_position * frequency), 1e-6) << d;
  }
  EXPECT_EQ(flux2_text_ids(2), (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(flux2_image_ids(1, 2), (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 1, 0}));
}

TEST(RopeTest, Qwen3TablesDuplicateTheirHalves) {
  const RopeTables t = qwen3_rope_tables(3, 8, 1e6);
  for (int s = 0; s < 3; ++s) {
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(t.cos[s * 8 + j], t.cos[s * 8 + j + 4]);
      EXPECT_NEAR(t.cos[s * 8 + j], std::cos(s / std::pow(1e6, 2.0 * j / 8)), 1e-6);
    }
  }
}

TEST(TimestepEmbeddingTest, SinusoidAndBf16Scaling) {
  const std::vector<float> values = {0.0f, 1000.0f};
  const std::vector<float> emb = timestep_sinusoids(values, 8);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(emb[k], 1.0f);      // cos(0)
    EXPECT_EQ(emb[4 + k], 0.0f);  // sin(0)
    const double f = std::exp(-std::log(10000.0) * k / 4);
    EXPECT_NEAR(emb[8 + k], std::cos(1000.0 * f), 2e-4);
    EXPECT_NEAR(emb[12 + k], std::sin(1000.0 * f), 2e-4);
  }
  // tests/data/README.md: 0.65 is not a bf16 value; diffusers' bf16 path feeds 648, not 650.
  EXPECT_EQ(scale_conditioning(0.65f, DType::kBF16), 648.0f);
  EXPECT_FLOAT_EQ(scale_conditioning(0.65f, DType::kF32), 650.0f);
  EXPECT_EQ(scale_conditioning(4.0f, DType::kBF16), 4000.0f);
}

// Error messages show the value the caller gave, not a rounded one (they once read "100 is outside
// 0..100" for 100.0001; "65536..6.71089e+07" for a flag range).
TEST(ExactDecimalTest, ReadsBackAsTheSameDouble) {
  EXPECT_EQ(exact_decimal(100.0001), "100.0001");
  EXPECT_EQ(exact_decimal(67108864.0), "67108864");
  EXPECT_EQ(exact_decimal(65536.0), "65536");
  EXPECT_EQ(exact_decimal(0.1), "0.1");
  EXPECT_EQ(exact_decimal(-0.5), "-0.5");
  EXPECT_EQ(std::stod(exact_decimal(1.0 / 3.0)), 1.0 / 3.0);
}

TEST(ReadFileTest, GivesEveryByteOrNamesTheFlagAndPath) {
  const std::string path = ::testing::TempDir() + "read_file_test.bin";
  const std::string bytes("a\0b\r\n\xff", 6);  // NUL, CR LF and a high byte survive
  std::ofstream(path, std::ios::binary) << bytes;
  absl::StatusOr<std::string> read = read_file(path, "--flag");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, bytes);
  std::ofstream(path, std::ios::binary | std::ios::trunc).flush();
  read = read_file(path, "--flag");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "");  // an empty file is no error
  std::remove(path.c_str());
  read = read_file(path, "--flag");
  EXPECT_TRUE(absl::IsNotFound(read.status()));
  EXPECT_EQ(read.status().message(), "--flag: cannot read " + path);
  EXPECT_EQ(read_file(path, "").status().message(), "cannot read " + path);
}

}  // namespace
}  // namespace flux2
