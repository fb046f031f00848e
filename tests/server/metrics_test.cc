// Prometheus metrics (server/ops/metrics.h) against server/ops/METRICS.md: every name with its
// type, the bucket layouts, labels, zeros exported up front, fast-path counters from the registry,
// GPU gauges only once set, and a real scrape through prometheus-cpp's Exposer in a process that
// links OpenBLAS (the civetweb stack problem thread_stack_floor.cc solves). Run:
// build/bin/server_unit_tests --gtest_filter='Metrics*'
#include "server/ops/metrics.h"

#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/fast_path_registry.h"
#include "prometheus/exposer.h"
#include "tests/server/test_support.h"

namespace flux2::server {
namespace {

using testing::metric_value;

bool has_line(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(Metrics, EveryContractNameWithItsType) {
  Metrics metrics;
  metrics.set_build_info("1.2.3", "cpu", "tiny");
  const std::string text = metrics.render();
  const std::vector<std::pair<std::string, std::string>> families = {
      {"flux2_requests_total", "counter"},
      {"flux2_request_duration_seconds", "histogram"},
      {"flux2_queue_duration_seconds", "histogram"},
      {"flux2_stage_duration_seconds", "histogram"},
      {"flux2_denoise_step_duration_seconds", "histogram"},
      {"flux2_fast_path_invocations_total", "counter"},
      {"flux2_fast_path_fallbacks_total", "counter"},
      {"flux2_queue_depth", "gauge"},
      {"flux2_requests_in_flight", "gauge"},
      {"flux2_images_generated_total", "counter"},
      {"flux2_pixels_generated_total", "counter"},
      {"flux2_reference_images_total", "counter"},
      {"flux2_prompt_cache_requests_total", "counter"},
      {"flux2_prompt_cache_capacity_bytes", "gauge"},
      {"flux2_model_load_duration_seconds", "gauge"},
      {"flux2_ready", "gauge"},
      {"flux2_build_info", "gauge"},
  };
  for (const auto& [name, type] : families) {
    EXPECT_TRUE(has_line(text, "# TYPE " + name + " " + type)) << name;
  }
  EXPECT_EQ(metric_value(text, "flux2_build_info",
                         {{"version", "1.2.3"}, {"backend", "cpu"}, {"model", "tiny"}}),
            1.0);
  // Zeros for the series known to exist.
  EXPECT_EQ(
      metric_value(text, "flux2_requests_total", {{"method", "GenerateImage"}, {"code", "OK"}}),
      0.0);
  EXPECT_EQ(metric_value(text, "flux2_requests_total",
                         {{"method", "GenerateImage"}, {"code", "RESOURCE_EXHAUSTED"}}),
            0.0);
  for (const char* stage :
       {"tokenize", "text_encode", "reference_encode", "denoise", "decode", "encode"}) {
    EXPECT_EQ(metric_value(text, "flux2_stage_duration_seconds_count", {{"stage", stage}}), 0.0)
        << stage;
  }
  for (const char* result : {"hit", "miss"}) {
    EXPECT_EQ(metric_value(text, "flux2_prompt_cache_requests_total", {{"result", result}}), 0.0)
        << result;
  }
  // No GPU gauges on the CPU.
  EXPECT_EQ(text.find("flux2_gpu_memory"), std::string::npos);
}

// METRICS.md's bucket lists: the backticked lists after "requests and stages" and "steps".
std::vector<std::string> metrics_md_buckets(const std::string& after) {
  std::ifstream in(FLUX2_METRICS_MD);
  std::stringstream text;
  text << in.rdbuf();
  const std::string md = text.str();
  const size_t at = md.find(after);
  if (at == std::string::npos) return {};
  const size_t open = md.find('`', at), close = md.find('`', open + 1);
  if (open == std::string::npos || close == std::string::npos) return {};
  std::vector<std::string> buckets;
  std::stringstream list(md.substr(open + 1, close - open - 1));
  for (std::string le; list >> le;) buckets.push_back(le);
  return buckets;
}

// The table rows of METRICS.md: (name, type) with the type's first word ("gauge (1)" -> "gauge").
// The NVML families (read from a real GPU at scrape time, "through NVML") are left out here: the
// GPU runner's server part checks them on the H200.
std::vector<std::pair<std::string, std::string>> metrics_md_names() {
  std::ifstream in(FLUX2_METRICS_MD);
  std::vector<std::pair<std::string, std::string>> names;
  for (std::string line; std::getline(in, line);) {
    const bool ours = line.rfind("| `flux2_", 0) == 0 || line.rfind("| `process_", 0) == 0;
    if (!ours || line.find("through NVML") != std::string::npos) continue;
    const size_t name_end = line.find('`', 3);
    const size_t type_start = line.find("| ", name_end) + 2;
    const size_t type_end = line.find_first_of(" |", type_start);
    names.emplace_back(line.substr(3, name_end - 3),
                       line.substr(type_start, type_end - type_start));
  }
  return names;
}

// Every `le` of `histogram`'s buckets (the series whose labels include `label`), in order.
std::vector<std::string> rendered_buckets(const std::string& text, const std::string& histogram,
                                          const std::string& label) {
  std::vector<std::string> buckets;
  std::stringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(histogram + "_bucket{", 0) != 0 || line.find(label) == std::string::npos) {
      continue;
    }
    const size_t le = line.find("le=\"");
    if (le == std::string::npos) continue;
    const size_t end = line.find('"', le + 4);
    buckets.push_back(line.substr(le + 4, end - le - 4));
  }
  return buckets;
}

TEST(Metrics, EveryNameOfMetricsMdIsExportedWithItsType) {
  const std::vector<std::pair<std::string, std::string>> names = metrics_md_names();
  ASSERT_GE(names.size(), 15u) << "METRICS.md: no table of metric names";
  Metrics metrics;
  metrics.set_build_info("1.2.3", "cpu", "tiny");
  metrics.set_gpu_memory({0}, {{1, 2, 3}});  // the CUDA-only gauges
  metrics.observe_step_collectives(0, {});   // exported once a request ran over several GPUs
  const std::string text = metrics.render();
  for (const auto& [name, type] : names) {
    EXPECT_TRUE(has_line(text, "# TYPE " + name + " " + type)) << name << " " << type;
  }
}

TEST(Metrics, BucketsFollowMetricsMd) {
  std::vector<std::string> slow = metrics_md_buckets("requests and stages");
  std::vector<std::string> steps = metrics_md_buckets("; steps");
  ASSERT_GE(slow.size(), 5u) << "METRICS.md: no bucket list after \"requests and stages\"";
  ASSERT_GE(steps.size(), 5u) << "METRICS.md: no bucket list after \"steps\"";
  slow.push_back("+Inf");
  steps.push_back("+Inf");
  Metrics metrics;
  metrics.count_request("GenerateImage", "OK", 0.3);  // a request series exists only once counted
  const std::string text = metrics.render();
  EXPECT_EQ(rendered_buckets(text, "flux2_request_duration_seconds", "method=\"GenerateImage\""),
            slow);
  EXPECT_EQ(rendered_buckets(text, "flux2_queue_duration_seconds", ""), slow);
  EXPECT_EQ(rendered_buckets(text, "flux2_stage_duration_seconds", "stage=\"denoise\""), slow);
  EXPECT_EQ(rendered_buckets(text, "flux2_denoise_step_duration_seconds", "quality=\"lossless\""),
            steps);
}

TEST(Metrics, LoraFamiliesExportTheirSeriesAndBuckets) {
  std::vector<std::string> buckets = metrics_md_buckets("into the host cache; buckets");
  ASSERT_GE(buckets.size(), 5u) << "METRICS.md: no bucket list for flux2_lora_load_duration";
  buckets.push_back("+Inf");
  Metrics metrics;
  metrics.lora().count_request(0);
  metrics.lora().count_request(5);
  metrics.lora().count_cache("device", false, 2);
  metrics.lora().count_load_failure("rank");
  const std::string text = metrics.render();
  EXPECT_EQ(rendered_buckets(text, "flux2_lora_load_duration_seconds", ""), buckets);
  EXPECT_EQ(rendered_buckets(text, "flux2_lora_upload_duration_seconds", ""), buckets);
  EXPECT_EQ(metric_value(text, "flux2_lora_requests_total", {{"adapters", "0"}}), 1.0);
  EXPECT_EQ(metric_value(text, "flux2_lora_requests_total", {{"adapters", "2"}}), 0.0);
  EXPECT_EQ(metric_value(text, "flux2_lora_requests_total", {{"adapters", "3+"}}), 1.0);
  EXPECT_EQ(metric_value(text, "flux2_lora_cache_requests_total",
                         {{"tier", "device"}, {"result", "miss"}}),
            2.0);
  EXPECT_EQ(metric_value(text, "flux2_lora_load_failures_total", {{"reason", "rank"}}), 1.0);
  EXPECT_EQ(metric_value(text, "flux2_lora_load_failures_total", {{"reason", "io"}}), 0.0);
}

TEST(Metrics, CountsAndObservations) {
  Metrics metrics;
  metrics.count_request("GenerateImage", "OK", 0.3);
  metrics.count_request("GenerateImage", "RESOURCE_EXHAUSTED", 0.001);
  metrics.count_request("GenerateImage", "RESOURCE_EXHAUSTED", 0.001);
  metrics.observe_step(Quality::kLossless, 0.02);
  metrics.observe_step(Quality::kHigh, 0.01);
  metrics.observe_stage(Stage::kTextEncode, 0.2);
  metrics.observe_queue(0.07);
  metrics.set_queue_depth(3);
  metrics.add_in_flight(1);
  metrics.count_images(2, 2 * 64 * 48);
  metrics.count_reference_images(3);
  metrics.observe_stage(Stage::kReferenceEncode, 0.04);
  metrics.set_ready(true);
  metrics.set_model_load_seconds(12.5);
  const std::string text = metrics.render();
  EXPECT_EQ(
      metric_value(text, "flux2_requests_total", {{"method", "GenerateImage"}, {"code", "OK"}}),
      1.0);
  EXPECT_EQ(metric_value(text, "flux2_requests_total", {{"code", "RESOURCE_EXHAUSTED"}}), 2.0);
  EXPECT_EQ(
      metric_value(text, "flux2_request_duration_seconds_count", {{"method", "GenerateImage"}}),
      3.0);
  EXPECT_EQ(
      metric_value(text, "flux2_denoise_step_duration_seconds_count", {{"quality", "lossless"}}),
      1.0);
  EXPECT_EQ(metric_value(text, "flux2_denoise_step_duration_seconds_count", {{"quality", "high"}}),
            1.0);
  // 0.02 s falls in the 0.025 bucket and above, not in 0.01.
  EXPECT_EQ(metric_value(text, "flux2_denoise_step_duration_seconds_bucket",
                         {{"quality", "lossless"}, {"le", "0.01"}}),
            0.0);
  EXPECT_EQ(metric_value(text, "flux2_denoise_step_duration_seconds_bucket",
                         {{"quality", "lossless"}, {"le", "0.025"}}),
            1.0);
  EXPECT_EQ(metric_value(text, "flux2_stage_duration_seconds_count", {{"stage", "text_encode"}}),
            1.0);
  EXPECT_EQ(metric_value(text, "flux2_queue_duration_seconds_count"), 1.0);
  EXPECT_EQ(metric_value(text, "flux2_queue_depth"), 3.0);
  EXPECT_EQ(metric_value(text, "flux2_requests_in_flight"), 1.0);
  EXPECT_EQ(metric_value(text, "flux2_images_generated_total"), 2.0);
  EXPECT_EQ(metric_value(text, "flux2_pixels_generated_total"), 2.0 * 64 * 48);
  EXPECT_EQ(metric_value(text, "flux2_reference_images_total"), 3.0);
  EXPECT_EQ(
      metric_value(text, "flux2_stage_duration_seconds_count", {{"stage", "reference_encode"}}),
      1.0);
  EXPECT_EQ(metric_value(text, "flux2_ready"), 1.0);
  EXPECT_EQ(metric_value(text, "flux2_model_load_duration_seconds"), 12.5);
}

TEST(Metrics, StepCacheCountsForwardsByListAndDecisionAndEveryDiff) {
  Metrics metrics;
  StepCacheCounts counts;
  counts.enabled = true;
  counts.computed[0] = 16;  // double list
  counts.cached[0] = 34;
  counts.computed[1] = 15;  // single list
  counts.cached[1] = 35;
  metrics.observe_step_cache(counts, {0.1f, 0.3f});
  metrics.observe_step_cache(counts, {});
  const std::string text = metrics.render();
  EXPECT_EQ(metric_value(text, "flux2_step_cache_forwards_total",
                         {{"list", "double"}, {"decision", "computed"}}),
            32.0);
  EXPECT_EQ(metric_value(text, "flux2_step_cache_forwards_total",
                         {{"list", "double"}, {"decision", "cached"}}),
            68.0);
  EXPECT_EQ(metric_value(text, "flux2_step_cache_forwards_total",
                         {{"list", "single"}, {"decision", "computed"}}),
            30.0);
  EXPECT_EQ(metric_value(text, "flux2_step_cache_forwards_total",
                         {{"list", "single"}, {"decision", "cached"}}),
            70.0);
  EXPECT_EQ(metric_value(text, "flux2_step_cache_relative_diff_count"), 2.0);
  EXPECT_NEAR(metric_value(text, "flux2_step_cache_relative_diff_sum").value_or(-1), 0.4, 1e-6);
}

TEST(Metrics, PromptCacheHitsAndMissesAndCapacity) {
  Metrics metrics;
  metrics.set_prompt_cache_capacity(int64_t{256} << 20);
  metrics.count_prompt_cache(/*hit=*/false);
  metrics.count_prompt_cache(/*hit=*/true);
  metrics.count_prompt_cache(/*hit=*/true);
  const std::string text = metrics.render();
  EXPECT_EQ(metric_value(text, "flux2_prompt_cache_requests_total", {{"result", "hit"}}), 2.0);
  EXPECT_EQ(metric_value(text, "flux2_prompt_cache_requests_total", {{"result", "miss"}}), 1.0);
  EXPECT_EQ(metric_value(text, "flux2_prompt_cache_requests_total"), 3.0);  // both series
  EXPECT_EQ(metric_value(text, "flux2_prompt_cache_capacity_bytes"), 268435456.0);
}

TEST(Metrics, FastPathCountersComeFromTheRegistry) {
  static FastPath path(FastPathSpec{"server_metrics_test_path", FastPathKind::kImplementation,
                                    Quality::kLossless, ""});
  Metrics metrics;
  const double before = metric_value(metrics.render(), "flux2_fast_path_invocations_total",
                                     {{"path", "server_metrics_test_path"}})
                            .value_or(0.0);
  path.count_invocation();
  path.count_invocation();
  EXPECT_FALSE(path.admit(RequestOptions{}, "unaligned"));
  const std::string text = metrics.render();
  EXPECT_EQ(metric_value(text, "flux2_fast_path_invocations_total",
                         {{"path", "server_metrics_test_path"}}),
            before + 2.0);
  EXPECT_EQ(metric_value(text, "flux2_fast_path_fallbacks_total",
                         {{"path", "server_metrics_test_path"}, {"reason", "unaligned"}}),
            1.0);
}

TEST(Metrics, GpuGaugesOnceSet) {
  Metrics metrics;
  metrics.set_gpu_memory({0}, {{100, 200, 1000}});
  const std::string text = metrics.render();
  EXPECT_EQ(metric_value(text, "flux2_gpu_memory_used_bytes", {{"gpu", "0"}}), 100.0);
  EXPECT_EQ(metric_value(text, "flux2_gpu_memory_peak_bytes", {{"gpu", "0"}}), 200.0);
  EXPECT_EQ(metric_value(text, "flux2_gpu_memory_total_bytes", {{"gpu", "0"}}), 1000.0);
}

TEST(Metrics, GpuMemoryGaugesPerRank) {
  // --gpus 2,3: one series per rank, labelled by its device ordinal.
  Metrics metrics;
  metrics.set_gpu_memory({2, 3}, {{100, 200, 1000}, {150, 250, 2000}});
  const std::string text = metrics.render();
  EXPECT_EQ(metric_value(text, "flux2_gpu_memory_used_bytes", {{"gpu", "2"}}), 100.0);
  EXPECT_EQ(metric_value(text, "flux2_gpu_memory_used_bytes", {{"gpu", "3"}}), 150.0);
  EXPECT_EQ(metric_value(text, "flux2_gpu_memory_peak_bytes", {{"gpu", "3"}}), 250.0);
  EXPECT_EQ(metric_value(text, "flux2_gpu_memory_total_bytes", {{"gpu", "3"}}), 2000.0);
  EXPECT_EQ(metric_value(text, "flux2_gpu_memory_total_bytes"), 3000.0);  // summed over ranks
  EXPECT_EQ(metric_value(text, "flux2_gpu_memory_used_bytes", {{"gpu", "0"}}), std::nullopt);
}

TEST(Metrics, CollectiveSecondsPerStepByGpuAndKind) {
  std::vector<std::string> buckets = metrics_md_buckets("; collectives");
  ASSERT_GE(buckets.size(), 5u) << "METRICS.md: no bucket list after \"collectives\"";
  buckets.push_back("+Inf");
  Metrics metrics;
  EXPECT_EQ(metrics.render().find("flux2_denoise_step_collective_seconds"), std::string::npos)
      << "no series before a request ran over several GPUs";
  // Two steps on the ranks of --gpus 2,3.
  for (int step = 0; step < 2; ++step) {
    metrics.observe_step_collectives(2, {0.004, 0.001});
    metrics.observe_step_collectives(3, {0.003, 0.0005});
  }
  const std::string text = metrics.render();
  const std::string name = "flux2_denoise_step_collective_seconds";
  EXPECT_EQ(metric_value(text, name + "_count", {{"gpu", "2"}, {"collective", "all_to_all"}}), 2.0);
  EXPECT_EQ(metric_value(text, name + "_sum", {{"gpu", "2"}, {"collective", "all_to_all"}}), 0.008);
  EXPECT_EQ(metric_value(text, name + "_sum", {{"gpu", "3"}, {"collective", "all_gather"}}), 0.001);
  EXPECT_EQ(metric_value(text, name + "_count", {{"gpu", "0"}}), std::nullopt);
  EXPECT_EQ(rendered_buckets(text, name, "collective=\"all_to_all\",gpu=\"3\""), buckets);
}

TEST(Metrics, ExposerServesThemOverHttp) {
  Metrics metrics;
  metrics.set_ready(true);
  prometheus::Exposer exposer("127.0.0.1:0");
  for (const auto& collectable : metrics.collectables()) exposer.RegisterCollectable(collectable);
  ASSERT_FALSE(exposer.GetListeningPorts().empty());
  const int port = exposer.GetListeningPorts().front();
  // Several scrapes: civetweb's worker threads run out of stack on the first one without the floor.
  for (int i = 0; i < 3; ++i) {
    const std::string body = testing::http_get(port, "/metrics");
    EXPECT_EQ(metric_value(body, "flux2_ready"), 1.0) << body.substr(0, 200);
  }
}

}  // namespace
}  // namespace flux2::server
