// flux2_server flag parsing and validation (server/app/server_options.h): the contract's defaults,
// every flag parsed, and errors that name the flag. Run: build/bin/server_unit_tests
// --gtest_filter='ServerOptions*'
#include "server/app/server_options.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/common/gpus_flag.h"

namespace flux2::server {
namespace {

absl::StatusOr<ParsedFlags> parse(std::vector<std::string> args) {
  args.insert(args.begin(), "flux2_server");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  return parse_server_flags(static_cast<int>(argv.size()), argv.data());
}

TEST(ServerOptions, DefaultsFollowTheServerContract) {
  absl::StatusOr<ParsedFlags> parsed = parse({});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const ServerOptions& o = parsed->options;
  EXPECT_EQ(o.port, 50051);
  EXPECT_EQ(o.metrics_port, 9464);
  EXPECT_EQ(o.http_port, 8000);
  EXPECT_EQ(o.host, "0.0.0.0");
  EXPECT_EQ(o.model_dir, "");
  EXPECT_EQ(o.backend, "auto");
  EXPECT_EQ(o.queue_depth, 8);
  EXPECT_EQ(o.max_pixels, 4194304);
  EXPECT_EQ(o.max_images, 4);
  EXPECT_EQ(o.max_reference_images, 4);                // BFL's klein API
  EXPECT_EQ(o.max_reference_bytes, 10 * 1024 * 1024);  // per image
  EXPECT_EQ(o.max_request_bytes, 48 * 1024 * 1024);    // 4 x 10 MiB + the rest
  EXPECT_GE(o.max_request_bytes, min_request_bytes(o));
  EXPECT_EQ(o.max_response_bytes, 4 * 1024 * 1024);  // gRPC's default client receive limit
  EXPECT_EQ(o.max_sequence_length, 512);             // diffusers' default
  EXPECT_EQ(o.drain_timeout_s, 600.0);
  EXPECT_EQ(o.warmup_steps, 1);
  EXPECT_TRUE(o.fast_paths);
  EXPECT_FALSE(o.enable_quality_high);
  EXPECT_FALSE(o.text_encoder_offload);                 // the text encoder lives on the device
  EXPECT_EQ(o.prompt_cache_bytes, int64_t{256} << 20);  // model/prompt_cache.h's default
  EXPECT_EQ(o.checkpoint.transformer_file, "");
  EXPECT_EQ(o.checkpoint.fp8_input_scale, "dynamic");
  EXPECT_EQ(o.test_step_delay_s, 0.0);
  EXPECT_TRUE(o.probe.empty());
  EXPECT_FALSE(parsed->help);
  EXPECT_TRUE(validate_server_options(o).ok());
  EXPECT_NE(resolved_model_dir(o).find("tiny-klein/checkpoint"), std::string::npos);
}

TEST(ServerOptions, ParsesEveryFlag) {
  absl::StatusOr<ParsedFlags> parsed = parse({"--port",
                                              "1234",
                                              "--metrics-port=2345",
                                              "--metrics-host",
                                              "127.0.0.2",
                                              "--metrics-basic-auth-file",
                                              "m",
                                              "--allow-insecure-token",
                                              "--host",
                                              "127.0.0.1",
                                              "--model-dir",
                                              "/m",
                                              "--backend",
                                              "cuda",
                                              "--queue-depth",
                                              "3",
                                              "--max-pixels",
                                              "1048576",
                                              "--max-images",
                                              "2",
                                              "--max-steps",
                                              "60",
                                              "--max-prompt-bytes",
                                              "100",
                                              "--drain-timeout-s",
                                              "1.5",
                                              "--warmup-steps",
                                              "0",
                                              "--tls-cert",
                                              "c.pem",
                                              "--tls-key",
                                              "k.pem",
                                              "--auth-token-file",
                                              "t",
                                              "--fast-paths",
                                              "off",
                                              "--fp8-attention",
                                              "off",
                                              "--cpu-threads",
                                              "6",
                                              "--enable-quality-high",
                                              "--test-step-delay-ms",
                                              "250",
                                              "--max-reference-images",
                                              "2",
                                              "--max-reference-bytes",
                                              "1000000",
                                              "--max-request-bytes",
                                              "8388608",
                                              "--max-response-bytes",
                                              "16777216",
                                              "--max-sequence-length",
                                              "64",
                                              "--text-encoder-offload",
                                              "--prompt-cache-bytes",
                                              "1048576",
                                              "--transformer-file",
                                              "/w/flux2-dev.safetensors",
                                              "--text-encoder-file",
                                              "/w/mistral_3_small_flux2_fp8.safetensors",
                                              "--fp8-lossless",
                                              "per_layer",
                                              "--fp8-input-scale",
                                              "static"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const ServerOptions& o = parsed->options;
  EXPECT_EQ(o.port, 1234);
  EXPECT_EQ(o.metrics_port, 2345);
  EXPECT_EQ(o.metrics_host, "127.0.0.2");
  EXPECT_EQ(o.metrics_basic_auth_file, "m");
  EXPECT_TRUE(o.allow_insecure_token);
  EXPECT_EQ(o.host, "127.0.0.1");
  EXPECT_EQ(o.model_dir, "/m");
  EXPECT_EQ(resolved_model_dir(o), "/m");
  EXPECT_EQ(o.backend, "cuda");
  EXPECT_EQ(o.queue_depth, 3);
  EXPECT_EQ(o.max_pixels, 1048576);
  EXPECT_EQ(o.max_images, 2);
  EXPECT_EQ(o.max_steps, 60);
  EXPECT_EQ(o.max_prompt_bytes, 100);
  EXPECT_EQ(o.drain_timeout_s, 1.5);
  EXPECT_EQ(o.warmup_steps, 0);
  EXPECT_EQ(o.tls_cert, "c.pem");
  EXPECT_EQ(o.tls_key, "k.pem");
  EXPECT_EQ(o.auth_token_file, "t");
  EXPECT_FALSE(o.fast_paths);
  EXPECT_FALSE(o.backend_options.fp8_attention);
  EXPECT_EQ(o.backend_options.cpu_threads, 6);
  EXPECT_FALSE(o.backend_options.gemm_autotune);
  EXPECT_TRUE(o.enable_quality_high);
  EXPECT_DOUBLE_EQ(o.test_step_delay_s, 0.25);
  EXPECT_EQ(o.max_reference_images, 2);
  EXPECT_EQ(o.max_reference_bytes, 1000000);
  EXPECT_EQ(o.max_request_bytes, 8388608);
  EXPECT_EQ(o.max_response_bytes, 16777216);
  EXPECT_EQ(o.max_sequence_length, 64);
  EXPECT_TRUE(o.text_encoder_offload);
  EXPECT_EQ(o.prompt_cache_bytes, 1048576);
  EXPECT_EQ(o.checkpoint.text_encoder_file, "/w/mistral_3_small_flux2_fp8.safetensors");
  EXPECT_EQ(o.checkpoint.fp8_lossless, "per_layer");
  EXPECT_EQ(o.checkpoint.fp8_input_scale, "static");
  EXPECT_EQ(o.checkpoint.transformer_file, "/w/flux2-dev.safetensors");
  EXPECT_TRUE(validate_server_options(o).ok());
}

TEST(ServerOptions, PromptCacheBytesZeroTurnsTheCacheOffAndIsRangeChecked) {
  absl::StatusOr<ParsedFlags> parsed = parse({"--prompt-cache-bytes", "0"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.prompt_cache_bytes, 0);
  EXPECT_TRUE(validate_server_options(parsed->options).ok());
  parsed = parse({"--prompt-cache-bytes", std::to_string(kMaxPromptCacheBytes)});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(validate_server_options(parsed->options).ok());
  parsed = parse({"--text-encoder-offload=false"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->options.text_encoder_offload);
}

TEST(ServerOptions, GpusTakesACountOrDeviceOrdinals) {
  absl::StatusOr<ParsedFlags> parsed = parse({});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.gpus, (std::vector<int>{0}));
  parsed = parse({"--gpus", "3"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.gpus, (std::vector<int>{0, 1, 2}));
  parsed = parse({"--gpus", "2,3"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.gpus, (std::vector<int>{2, 3}));
  EXPECT_TRUE(validate_server_options(parsed->options).ok());
  parsed = parse({"--gpus= 5, 1 ,0"});  // spaces around entries; any order (rank r on the r-th)
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.gpus, (std::vector<int>{5, 1, 0}));
  // Against the devices and the model's heads once it loads: tests/server/parallel_engine_test.cc.
}

TEST(ServerOptions, GpusFlagErrorsNameTheFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"0", "--gpus: 0 is outside 1..64"},
      {"65", "--gpus: 65 is outside 1..64"},
      {"",
       "--gpus: empty; give a count (--gpus 2: devices 0 and 1) or device ordinals "
       "(--gpus 2,3)"},
      {"two", "--gpus: \"two\" is not a count N or a list of device ordinals such as 2,3"},
      {"2,,3", "--gpus 2,,3: entry 2 is empty"},
      {"2,3,", "--gpus 2,3,: entry 3 is empty"},
      {"2,x", "--gpus 2,x: \"x\" is not a device ordinal"},
      {"-1,2", "--gpus -1,2: -1 is not a device ordinal (they count from 0)"},
      {"2,3,2", "--gpus 2,3,2: device 2 is listed twice"},
  };
  for (const auto& [value, message] : cases) {
    absl::StatusOr<ParsedFlags> parsed = parse({"--gpus", value});
    ASSERT_FALSE(parsed.ok()) << value;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_EQ(parsed.status().message(), message) << value;
  }
  std::string many = "1";  // 1 .. 65
  for (int i = 2; i <= kMaxGpus + 1; ++i) many.append(",").append(std::to_string(i));
  EXPECT_EQ(parse({"--gpus", many}).status().message(),
            "--gpus " + many + ": 65 GPUs exceed the limit of 64");
  // Options built in code are checked too.
  ServerOptions options;
  options.gpus = {};
  EXPECT_EQ(validate_server_options(options).message(), "--gpus: no GPU given");
  options.gpus = {3};
  EXPECT_EQ(validate_server_options(options).message(),
            "--gpus: one GPU runs on device 0, the process's first, not 3 "
            "(CUDA_VISIBLE_DEVICES=3 makes device 3 that one)");
  options.gpus = {1, 1};
  EXPECT_EQ(validate_server_options(options).message(), "--gpus 1,1: device 1 is listed twice");
  EXPECT_EQ(gpus_flag_text({0, 1, 2}), "3");
  EXPECT_EQ(gpus_flag_text({1, 0}), "1,0");
  EXPECT_EQ(gpu_ordinals_text({0, 1, 2}), "0,1,2");
}

TEST(ServerOptions, RequestLimitMustFitTheReferences) {
  // 8 x 10 MiB references do not fit the default 48 MiB: the flag parser says what they need.
  absl::StatusOr<ParsedFlags> parsed = parse({"--max-reference-images", "8"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  absl::Status status = validate_server_options(parsed->options);
  EXPECT_NE(status.message().find("--max-request-bytes: 50331648 is less than the"),
            std::string::npos)
      << status;
  parsed = parse({"--max-reference-images", "8", "--max-request-bytes", "100000000"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(validate_server_options(parsed->options).ok());
  // Editing off needs no room for references.
  parsed = parse({"--max-reference-images", "0", "--max-request-bytes", "4194304"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(validate_server_options(parsed->options).ok());
}

TEST(ServerOptions, ProbeMode) {
  absl::StatusOr<ParsedFlags> parsed = parse({"--probe", "readiness", "--addr", "127.0.0.1:6000"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.probe, "readiness");
  EXPECT_EQ(parsed->options.probe_addr, "127.0.0.1:6000");
  EXPECT_TRUE(validate_server_options(parsed->options).ok());
  parsed = parse({"--probe", "startup"});
  ASSERT_TRUE(parsed.ok());
  EXPECT_NE(validate_server_options(parsed->options).message().find("--probe"), std::string::npos);
}

TEST(ServerOptions, StallWatchdogAndInjectedFaults) {
  absl::StatusOr<ParsedFlags> parsed = parse({});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.stall.min_seconds, 60.0);
  EXPECT_EQ(parsed->options.stall.step_multiple, 20.0);
  EXPECT_FALSE(parsed->options.test_fault.has_value()) << "no fault unless asked";
  parsed = parse({"--stall-timeout-min-s", "5", "--stall-step-multiple", "4", "--test-inject-fault",
                  "hang@3:2.5"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.stall.min_seconds, 5.0);
  EXPECT_EQ(parsed->options.stall.step_multiple, 4.0);
  EXPECT_EQ(parsed->options.stall.limit(2.0), 8.0);
  EXPECT_EQ(parsed->options.stall.limit(0.5), 5.0);
  ASSERT_TRUE(parsed->options.test_fault.has_value());
  EXPECT_EQ(parsed->options.test_fault->fault, InjectedFault::kHang);
  EXPECT_EQ(parsed->options.test_fault->step, 3);
  EXPECT_EQ(parsed->options.test_fault->hang_seconds, 2.5);
  EXPECT_EQ(parsed->options.test_fault->flag, "hang@3:2.5");
  EXPECT_TRUE(validate_server_options(parsed->options).ok());
  for (const auto& [text, fault] :
       {std::pair<const char*, InjectedFault>{"device_oom", InjectedFault::kDeviceOutOfMemory},
        {"illegal_address@0", InjectedFault::kIllegalAddress}}) {
    parsed = parse({"--test-inject-fault", text});
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->options.test_fault->fault, fault);
  }
  EXPECT_EQ(parsed->options.test_fault->step, 0);
  for (const char* bad : {"segfault", "hang@x", "hang:0", "device_oom:3", "hang@-1"}) {
    parsed = parse({"--test-inject-fault", bad});
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.status().message().find("--test-inject-fault"), std::string::npos)
        << parsed.status();
  }
  parsed = parse({"--stall-timeout-min-s", "0.5"});
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(validate_server_options(parsed->options).message(),
            "--stall-timeout-min-s: 0.5 is outside 1..86400");
}

TEST(ServerOptions, ParseErrorsNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string flag;
  };
  const std::vector<Case> cases = {
      {{"--port", "abc"}, "--port"},
      {{"--bogus", "1"}, "--bogus"},
      {{"--fast-paths", "maybe"}, "--fast-paths"},
      {{"--fp8-attention", "1"}, "--fp8-attention"},
      {{"--cpu-threads", "-1"}, "--cpu-threads"},
      {{"--queue-depth"}, "--queue-depth"},
      {{"--drain-timeout-s", "soon"}, "--drain-timeout-s"},
      {{"--prompt-cache-bytes", "lots"}, "--prompt-cache-bytes"},
      {{"--fp8-lossless", "lazy"}, "--fp8-lossless \"lazy\": expected resident or per_layer"},
      {{"--fp8-input-scale", "calibrated"},
       "--fp8-input-scale \"calibrated\": expected dynamic or static"},
      {{"extra"}, "extra"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ParsedFlags> parsed = parse(c.args);
    ASSERT_FALSE(parsed.ok()) << c.flag;
    EXPECT_NE(parsed.status().message().find(c.flag), std::string::npos) << parsed.status();
  }
}

TEST(ServerOptions, EnvironmentVariablesSetFlagsAndTheCommandLineWins) {
  setenv("FLUX2_QUEUE_DEPTH", "3", 1);
  setenv("FLUX2_ENABLE_QUALITY_HIGH", "true", 1);
  setenv("FLUX2_FAST_PATHS", "off", 1);
  absl::StatusOr<ParsedFlags> parsed = parse({});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.queue_depth, 3);
  EXPECT_TRUE(parsed->options.enable_quality_high);
  EXPECT_FALSE(parsed->options.fast_paths);
  parsed = parse({"--queue-depth", "5"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.queue_depth, 5);
  setenv("FLUX2_QUEUE_DEPTH", "many", 1);
  parsed = parse({});
  EXPECT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("--queue-depth = many"), std::string::npos)
      << parsed.status();
  EXPECT_NE(parsed.status().message().find("FLUX2_* variable"), std::string::npos);
  unsetenv("FLUX2_QUEUE_DEPTH");
  unsetenv("FLUX2_ENABLE_QUALITY_HIGH");
  unsetenv("FLUX2_FAST_PATHS");
}

TEST(ServerOptions, HelpAndVersion) {
  for (const char* flag : {"-h", "--help"}) {
    absl::StatusOr<ParsedFlags> parsed = parse({flag});
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_TRUE(parsed->help);
  }
  absl::StatusOr<ParsedFlags> parsed = parse({"--version"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->version);
  EXPECT_FALSE(server_version().empty());
  EXPECT_NE(server_help_text().find("FLUX2_FOO_BAR"), std::string::npos);
}

TEST(ServerOptions, RangeErrorsPrintExactBounds) {
  absl::StatusOr<ParsedFlags> parsed = parse({"--max-pixels", "100"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const absl::Status status = validate_server_options(parsed->options);
  EXPECT_EQ(status.message(), "--max-pixels: 100 is outside 65536..67108864") << status;
}

// A bearer token without TLS is refused unless --allow-insecure-token says TLS ends in front.
TEST(ServerOptions, TokenWithoutTlsNeedsTheOptIn) {
  absl::StatusOr<ParsedFlags> plain = parse({"--auth-token-file", "t"});
  ASSERT_TRUE(plain.ok());
  EXPECT_NE(validate_server_options(plain->options).message().find("--allow-insecure-token"),
            std::string::npos);
  absl::StatusOr<ParsedFlags> opted = parse({"--auth-token-file", "t", "--allow-insecure-token"});
  ASSERT_TRUE(opted.ok());
  EXPECT_TRUE(validate_server_options(opted->options).ok());
  absl::StatusOr<ParsedFlags> tls =
      parse({"--auth-token-file", "t", "--tls-cert", "c.pem", "--tls-key", "k.pem"});
  ASSERT_TRUE(tls.ok());
  EXPECT_TRUE(validate_server_options(tls->options).ok());
}

TEST(ServerOptions, ValidationErrorsNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string flag;
  };
  const std::vector<Case> cases = {
      {{"--port", "70000"}, "--port"},
      {{"--metrics-port", "-1"}, "--metrics-port"},
      {{"--port", "5000", "--metrics-port", "5000"}, "--metrics-port"},
      {{"--http-port", "-2"}, "--http-port"},
      {{"--log-format", "xml"}, "--log-format"},
      {{"--http-port", "50051"}, "--http-port"},
      {{"--http-port", "9464"}, "--http-port"},
      {{"--backend", "tpu"}, "--backend"},
      {{"--queue-depth", "0"}, "--queue-depth"},
      {{"--max-pixels", "100"}, "--max-pixels"},
      {{"--max-images", "0"}, "--max-images"},
      {{"--max-steps", "0"}, "--max-steps"},
      {{"--drain-timeout-s", "-1"}, "--drain-timeout-s"},
      {{"--warmup-steps", "-1"}, "--warmup-steps"},
      {{"--tls-cert", "c.pem"}, "--tls-key"},
      {{"--auth-token-file", "t"}, "--auth-token-file"},  // plaintext without the opt-in
      {{"--tls-key", "k.pem"}, "--tls-cert"},
      {{"--test-step-delay-ms", "-5"}, "--test-step-delay-ms"},
      {{"--max-reference-images", "-1"}, "--max-reference-images"},
      {{"--max-reference-images", "17"}, "--max-reference-images"},
      {{"--max-reference-bytes", "0"}, "--max-reference-bytes"},
      {{"--max-request-bytes", "1000"}, "--max-request-bytes"},
      {{"--max-response-bytes", "1000"}, "--max-response-bytes"},
      {{"--max-response-bytes", "4294967296"}, "--max-response-bytes"},
      {{"--max-reference-bytes", "20000000"}, "--max-request-bytes"},
      {{"--max-sequence-length", "0"}, "--max-sequence-length"},
      {{"--prompt-cache-bytes", "-1"}, "--prompt-cache-bytes"},
      {{"--prompt-cache-bytes", std::to_string(kMaxPromptCacheBytes + 1)}, "--prompt-cache-bytes"},
      {{"--max-loras-per-request", "0"}, "--max-loras-per-request: 0 is outside 1..16"},
      {{"--max-loras-per-request", "17"}, "--max-loras-per-request"},
      {{"--max-lora-rank", "0"}, "--max-lora-rank: 0 is outside 1..4096"},
      {{"--max-lora-rank", "4097"}, "--max-lora-rank"},
      {{"--max-lora-scale", "nan"}, "--max-lora-scale: not a finite number"},
      {{"--max-lora-scale", "inf"}, "--max-lora-scale: not a finite number"},
      {{"--max-lora-scale", "-1"}, "--max-lora-scale"},
      {{"--max-lora-scale", "1000.5"}, "--max-lora-scale"},
      {{"--lora-cache-bytes", "-1"}, "--lora-cache-bytes"},
      {{"--lora-host-cache-bytes", "-1"}, "--lora-host-cache-bytes"},
      {{"--lora-preload", "style"}, "--lora-preload: needs --lora-dir"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ParsedFlags> parsed = parse(c.args);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    const absl::Status status = validate_server_options(parsed->options);
    ASSERT_FALSE(status.ok()) << c.flag;
    EXPECT_NE(status.message().find(c.flag), std::string::npos) << status;
  }
}

// The help text documents exactly the flags the parser accepts: each flag has a line of its own
// ("  --name ..."), and each such line names a flag.
TEST(ServerOptions, HelpDocumentsEveryFlag) {
  absl::StatusOr<ParsedFlags> parsed = parse({"--help"});
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->help);
  const std::string help = server_help_text();
  const std::vector<std::string> flags = server_flag_names();
  EXPECT_GE(flags.size(), 35u);
  for (const std::string& flag : flags) {
    const bool documented = help.find("\n  " + flag + " ") != std::string::npos ||
                            help.find(", " + flag + " ") != std::string::npos;
    EXPECT_TRUE(documented) << flag << " has no line in --help";
  }
  std::istringstream lines(help);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("  --", 0) != 0) continue;
    const std::string flag = line.substr(2, line.find(' ', 2) - 2);
    EXPECT_NE(std::find(flags.begin(), flags.end(), flag), flags.end())
        << flag << " is in --help but not a flag";
  }
  EXPECT_NE(help.find("TEST ONLY"), std::string::npos);
}

}  // namespace
}  // namespace flux2::server
