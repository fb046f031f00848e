// flux2_server flag parsing and validation; see server_options.h.
// Tested by tests/server/server_options_test.cc.
#include "server/app/server_options.h"

#include <CLI/CLI.hpp>

#include <cmath>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/base/decimal.h"
#include "kernels/base/status.h"
#include "model/pipeline.h"
#include "server/common/backend_flags.h"
#include "server/common/embedded_checkpoint.h"
#include "server/common/gpus_flag.h"
#include "server/serving/validate.h"

#ifndef FLUX2_VERSION
#define FLUX2_VERSION "unknown"
#endif

namespace flux2::server {
namespace {

// FLUX2_<NAME>: the environment-variable equivalent of --name (containers); a flag on the command
// line wins over it.
std::string env_name(absl::string_view flag) {
  std::string name = "FLUX2_";
  for (char c : flag.substr(2)) name += c == '-' ? '_' : absl::ascii_toupper(c);
  return name;
}

// Flags converted after parsing (a unit conversion, a fault spec).
struct RawFlags {
  std::string gpus = "1";  // a count or a list of device ordinals (gpus_flag.h)
  double test_step_delay_ms = 0.0;
  std::string lora_preload;  // "a,b"

  std::string test_inject_fault;
};

// --test-inject-fault KIND[@STEP][:SECONDS]: device_oom, illegal_address or hang (SECONDS: how
// long the hang lasts, default 10); STEP (default 1): the steps run before the fault.
absl::StatusOr<TestFault> parse_test_fault(absl::string_view text) {
  const auto error = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("--test-inject-fault: \"", text, "\" ", why));
  };
  TestFault fault;
  fault.flag = std::string(text);
  absl::string_view rest = text;
  const size_t colon = rest.find(':');
  if (colon != absl::string_view::npos) {
    if (!absl::SimpleAtod(rest.substr(colon + 1), &fault.hang_seconds) ||
        !(fault.hang_seconds > 0.0 && fault.hang_seconds <= 3600.0)) {
      return error("has no hang length in seconds (0..3600) after ':'");
    }
    rest = rest.substr(0, colon);
  }
  const size_t at = rest.find('@');
  if (at != absl::string_view::npos) {
    if (!absl::SimpleAtoi(rest.substr(at + 1), &fault.step) || fault.step < 0) {
      return error("has no step count after '@'");
    }
    rest = rest.substr(0, at);
  }
  if (rest == "device_oom") {
    fault.fault = InjectedFault::kDeviceOutOfMemory;
  } else if (rest == "illegal_address") {
    fault.fault = InjectedFault::kIllegalAddress;
  } else if (rest == "hang") {
    fault.fault = InjectedFault::kHang;
  } else {
    return error("is not device_oom, illegal_address or hang[@STEP][:SECONDS]");
  }
  if (colon != absl::string_view::npos && fault.fault != InjectedFault::kHang) {
    return error("has a length, which only a hang takes");
  }
  return fault;
}

// Every flag of the server contract, bound to `o` (defaults are the struct's) or `raw`.
void add_flags(CLI::App& app, ServerOptions& o, RawFlags& raw, ParsedFlags& parsed) {
  const auto option = [&](const std::string& name, auto& target) {
    app.add_option(name, target)->envname(env_name(name));
  };
  const auto flag = [&](const std::string& name, bool& target) {
    app.add_flag(name, target)->envname(env_name(name));
  };
  option("--host", o.host);
  option("--port", o.port);
  option("--metrics-port", o.metrics_port);
  option("--metrics-host", o.metrics_host);
  option("--metrics-basic-auth-file", o.metrics_basic_auth_file);
  option("--http-port", o.http_port);
  option("--http-head-timeout-s", o.http_head_timeout_s);
  option("--http-body-timeout-s", o.http_body_timeout_s);
  option("--http-idle-timeout-s", o.http_idle_timeout_s);
  option("--http-max-connections", o.http_max_connections);
  option("--http-max-connections-per-client", o.http_max_connections_per_client);
  option("--model-dir", o.model_dir);
  option("--backend", o.backend);
  option("--gpus", raw.gpus);
  option("--queue-depth", o.queue_depth);
  option("--max-pixels", o.max_pixels);
  option("--max-images", o.max_images);
  option("--max-steps", o.max_steps);
  option("--max-prompt-bytes", o.max_prompt_bytes);
  option("--max-reference-images", o.max_reference_images);
  option("--max-reference-bytes", o.max_reference_bytes);
  option("--max-request-bytes", o.max_request_bytes);
  option("--max-response-bytes", o.max_response_bytes);
  option("--max-sequence-length", o.max_sequence_length);
  option("--drain-timeout-s", o.drain_timeout_s);
  option("--warmup-steps", o.warmup_steps);
  option("--tls-cert", o.tls_cert);
  option("--tls-key", o.tls_key);
  option("--auth-token-file", o.auth_token_file);
  flag("--allow-insecure-token", o.allow_insecure_token);
  // The on|off switch and the backend flags the `flux2` CLI shares: both tools accept and refuse
  // the same values with the same messages.
  add_on_off_option(app, "--fast-paths", o.fast_paths)->envname(env_name("--fast-paths"));
  for (CLI::Option* backend_flag : add_backend_flags(app, o.backend_options)) {
    backend_flag->envname(env_name(backend_flag->get_name()));
  }
  flag("--enable-quality-high", o.enable_quality_high);
  flag("--text-encoder-offload", o.text_encoder_offload);
  option("--prompt-cache-bytes", o.prompt_cache_bytes);
  for (CLI::Option* checkpoint_flag : add_checkpoint_flags(app, o.checkpoint)) {
    checkpoint_flag->envname(env_name(checkpoint_flag->get_name()));
  }
  option("--lora-dir", o.lora_dir);
  option("--lora-cache-bytes", o.lora_cache_bytes);
  option("--lora-host-cache-bytes", o.lora_host_cache_bytes);
  option("--lora-preload", raw.lora_preload);
  option("--max-loras-per-request", o.max_loras_per_request);
  option("--max-lora-rank", o.max_lora_rank);
  option("--max-lora-scale", o.max_lora_scale);
  option("--log-format", o.log_format);
  option("--stall-timeout-min-s", o.stall.min_seconds);
  option("--stall-step-multiple", o.stall.step_multiple);
  option("--test-step-delay-ms", raw.test_step_delay_ms);
  option("--test-inject-fault", raw.test_inject_fault);
  option("--probe", o.probe);
  option("--addr", o.probe_addr);
  app.add_flag("-h,--help", parsed.help);
  app.add_flag("--version", parsed.version);
}

absl::Status check_range(absl::string_view name, double value, double lo, double hi) {
  if (!(value >= lo && value <= hi)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", exact_decimal(value), " is outside ",
                                                   exact_decimal(lo), "..", exact_decimal(hi)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedFlags> parse_server_flags(int argc, char** argv) {
  ParsedFlags parsed;
  ServerOptions& o = parsed.options;
  RawFlags raw;
  CLI::App app("flux2_server", "flux2_server");
  app.set_help_flag();  // -h / --help print server_help_text() (main.cc), not CLI11's listing
  add_flags(app, o, raw, parsed);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return absl::InvalidArgumentError(absl::StrCat(
        error.what(), " (see --help; a flag's value may also come from its FLUX2_* variable)"));
  }
  FLUX_ASSIGN_OR_RETURN(o.gpus, parse_gpus_flag(raw.gpus));
  o.test_step_delay_s = raw.test_step_delay_ms / 1000.0;
  for (absl::string_view name : absl::StrSplit(raw.lora_preload, ',', absl::SkipWhitespace())) {
    o.lora_preload.emplace_back(absl::StripAsciiWhitespace(name));
  }
  if (!raw.test_inject_fault.empty()) {
    FLUX_ASSIGN_OR_RETURN(o.test_fault, parse_test_fault(raw.test_inject_fault));
  }
  FLUX_RETURN_IF_ERROR(check_checkpoint_flags(o.checkpoint));
  return parsed;
}

// The LoRA flags: ranges, and --lora-preload only with --lora-dir.
absl::Status check_lora_options(const ServerOptions& o) {
  FLUX_RETURN_IF_ERROR(check_range("--max-loras-per-request", o.max_loras_per_request, 1, 16));
  FLUX_RETURN_IF_ERROR(check_range("--max-lora-rank", o.max_lora_rank, 1, 4096));
  if (!std::isfinite(o.max_lora_scale)) {
    return absl::InvalidArgumentError("--max-lora-scale: not a finite number");
  }
  FLUX_RETURN_IF_ERROR(check_range("--max-lora-scale", o.max_lora_scale, 0.0, 1000.0));
  // 1 TiB only catches a typo: the memory plan checks the device cache when the model loads.
  FLUX_RETURN_IF_ERROR(check_range("--lora-cache-bytes", static_cast<double>(o.lora_cache_bytes),
                                   0.0, static_cast<double>(kMaxPromptCacheBytes)));
  FLUX_RETURN_IF_ERROR(check_range("--lora-host-cache-bytes",
                                   static_cast<double>(o.lora_host_cache_bytes), 0.0,
                                   static_cast<double>(kMaxPromptCacheBytes)));
  if (!o.lora_preload.empty() && o.lora_dir.empty()) {
    return absl::InvalidArgumentError("--lora-preload: needs --lora-dir (adapters come from it)");
  }
  return absl::OkStatus();
}

absl::Status validate_server_options(const ServerOptions& o) {
  if (!o.probe.empty()) {
    if (o.probe != "liveness" && o.probe != "readiness") {
      return absl::InvalidArgumentError(
          absl::StrCat("--probe: \"", o.probe, "\" is not liveness or readiness"));
    }
    if (o.probe_addr.empty()) return absl::InvalidArgumentError("--addr: empty address");
    return absl::OkStatus();
  }
  if (o.host.empty()) return absl::InvalidArgumentError("--host: empty address");
  FLUX_RETURN_IF_ERROR(check_range("--port", o.port, 0, 65535));
  // The GPUs of one host (options built in code too): the model's heads decide at load.
  FLUX_RETURN_IF_ERROR(check_gpus(o.gpus));
  FLUX_RETURN_IF_ERROR(check_range("--metrics-port", o.metrics_port, 0, 65535));
  if (o.port != 0 && o.port == o.metrics_port) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-port: ", o.metrics_port, " is also the gRPC --port"));
  }
  FLUX_RETURN_IF_ERROR(check_range("--http-port", o.http_port, -1, 65535));
  // Under a tenth of a second a loaded host would refuse honest clients; a day bounds a socket.
  FLUX_RETURN_IF_ERROR(check_range("--http-head-timeout-s", o.http_head_timeout_s, 0.1, 86400.0));
  FLUX_RETURN_IF_ERROR(check_range("--http-body-timeout-s", o.http_body_timeout_s, 0.1, 86400.0));
  FLUX_RETURN_IF_ERROR(check_range("--http-idle-timeout-s", o.http_idle_timeout_s, 0.1, 86400.0));
  // A socket each: well under the process's descriptor limit.
  FLUX_RETURN_IF_ERROR(check_range("--http-max-connections", o.http_max_connections, 1, 65536));
  FLUX_RETURN_IF_ERROR(check_range("--http-max-connections-per-client",
                                   o.http_max_connections_per_client, 1, o.http_max_connections));
  if (o.http_port > 0 && (o.http_port == o.port || o.http_port == o.metrics_port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-port: ", o.http_port, " is also the ",
                     o.http_port == o.port ? "gRPC --port" : "--metrics-port"));
  }
  if (o.log_format != "text" && o.log_format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-format: \"", o.log_format, "\" is not text or json"));
  }
  if (o.backend != "auto" && o.backend != "cpu" && o.backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend: \"", o.backend, "\" is not auto, cpu or cuda"));
  }
  // A queue of 0 would reject everything behind the running request; 4096 bounds memory.
  FLUX_RETURN_IF_ERROR(check_range("--queue-depth", o.queue_depth, 1, 4096));
  // 256 x 256 is the smallest useful budget; 64 MP bounds a single image's activations.
  FLUX_RETURN_IF_ERROR(check_range("--max-pixels", static_cast<double>(o.max_pixels), 256.0 * 256.0,
                                   64.0 * 1024 * 1024));
  FLUX_RETURN_IF_ERROR(check_range("--max-images", o.max_images, 1, 64));
  // The pipeline's own bound (model/pipeline.h): a flag may narrow it, never widen it.
  if (o.max_steps > kMaxInferenceSteps) {
    return absl::InvalidArgumentError(absl::StrCat("--max-steps: ", o.max_steps,
                                                   " exceeds the pipeline's step bound of ",
                                                   kMaxInferenceSteps));
  }
  FLUX_RETURN_IF_ERROR(check_range("--max-steps", o.max_steps, 1, kMaxInferenceSteps));
  FLUX_RETURN_IF_ERROR(check_range("--max-prompt-bytes", o.max_prompt_bytes, 1, 1 << 20));
  // 16 bounds the decoded references a queued request holds (each up to 1024 x 1024 x 3 bytes).
  FLUX_RETURN_IF_ERROR(check_range("--max-reference-images", o.max_reference_images, 0, 16));
  // 64 MiB per image; the decoder bounds the pixels separately (model/reference_image.h).
  FLUX_RETURN_IF_ERROR(check_range("--max-reference-bytes",
                                   static_cast<double>(o.max_reference_bytes), 1.0,
                                   64.0 * 1024 * 1024));
  // gRPC keeps a received message in memory until its call ends; 1 GiB bounds one request, and
  // below 4 MiB (gRPC's default) nothing is gained.
  FLUX_RETURN_IF_ERROR(check_range("--max-request-bytes", static_cast<double>(o.max_request_bytes),
                                   4.0 * 1024 * 1024, 1024.0 * 1024 * 1024));
  if (o.max_request_bytes < min_request_bytes(o)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-request-bytes: ", o.max_request_bytes, " is less than the ", min_request_bytes(o),
        " bytes the other limits need (", o.max_reference_images, " x --max-reference-bytes ",
        o.max_reference_bytes, " + 2 x --max-prompt-bytes ", o.max_prompt_bytes, " + ",
        kRequestOverheadBytes, " for the other fields)"));
  }
  // The smallest limit still fits a small image (64 KiB) beside the response's other fields
  // (kResponseMetadataBytes); 2 GiB is protobuf's hard message size limit.
  FLUX_RETURN_IF_ERROR(check_range("--max-response-bytes",
                                   static_cast<double>(o.max_response_bytes),
                                   static_cast<double>(kMinMaxResponseBytes), 2147483647.0));
  // The model's own bound (512 for klein) is checked when it is loaded.
  FLUX_RETURN_IF_ERROR(check_range("--max-sequence-length", o.max_sequence_length, 1, 4096));
  if (!std::isfinite(o.drain_timeout_s)) {
    return absl::InvalidArgumentError("--drain-timeout-s: not a finite number");
  }
  FLUX_RETURN_IF_ERROR(check_range("--drain-timeout-s", o.drain_timeout_s, 0.0, 86400.0));
  FLUX_RETURN_IF_ERROR(check_range("--warmup-steps", o.warmup_steps, 0, 1000));
  // Below a second a busy host's scheduling noise would count as a stall.
  FLUX_RETURN_IF_ERROR(check_range("--stall-timeout-min-s", o.stall.min_seconds, 1.0, 86400.0));
  FLUX_RETURN_IF_ERROR(check_range("--stall-step-multiple", o.stall.step_multiple, 2.0, 1e6));
  // 1 TiB only catches a typo: the memory plan checks the cache against the device's free memory
  // at load.
  FLUX_RETURN_IF_ERROR(check_range("--prompt-cache-bytes",
                                   static_cast<double>(o.prompt_cache_bytes), 0.0,
                                   static_cast<double>(kMaxPromptCacheBytes)));
  if (!o.auth_token_file.empty() && o.tls_cert.empty() && !o.allow_insecure_token) {
    return absl::InvalidArgumentError(
        "--auth-token-file: without --tls-cert/--tls-key the token would travel in plaintext; "
        "serve TLS, or pass --allow-insecure-token when TLS ends in front of the server (an "
        "Ingress, a service mesh)");
  }
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError(o.tls_cert.empty() ? "--tls-cert: required with --tls-key"
                                                         : "--tls-key: required with --tls-cert");
  }
  if (!std::isfinite(o.test_step_delay_s)) {
    return absl::InvalidArgumentError("--test-step-delay-ms: not a finite number");
  }
  FLUX_RETURN_IF_ERROR(
      check_range("--test-step-delay-ms", o.test_step_delay_s * 1000.0, 0.0, 60000.0));
  return check_lora_options(o);
}

std::vector<std::string> server_flag_names() {
  ParsedFlags parsed;
  RawFlags raw;
  CLI::App app("flux2_server", "flux2_server");
  app.set_help_flag();
  add_flags(app, parsed.options, raw, parsed);
  std::vector<std::string> names;
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
  }
  return names;
}

int64_t min_request_bytes(const ServerOptions& options) {
  return int64_t{options.max_reference_images} * options.max_reference_bytes +
         2 * int64_t{options.max_prompt_bytes} + kRequestOverheadBytes;
}

LimitFlags limit_flags(const ServerOptions& o) {
  LimitFlags flags;
  flags.max_pixels = o.max_pixels;
  flags.max_steps = o.max_steps;
  flags.max_images = o.max_images;
  flags.max_prompt_bytes = o.max_prompt_bytes;
  flags.max_reference_images = o.max_reference_images;
  flags.max_reference_bytes = o.max_reference_bytes;
  flags.max_request_bytes = o.max_request_bytes;
  flags.max_response_bytes = o.max_response_bytes;
  flags.max_sequence_length = o.max_sequence_length;
  flags.enable_quality_high = o.enable_quality_high;
  flags.fast_paths = o.fast_paths;
  flags.lora_enabled = !o.lora_dir.empty();
  flags.max_loras_per_request = o.max_loras_per_request;
  flags.max_lora_rank = o.max_lora_rank;
  flags.max_lora_scale = o.max_lora_scale;
  return flags;
}

std::string resolved_model_dir(const ServerOptions& options) {
  return options.model_dir.empty() ? embedded_checkpoint_dir() : options.model_dir;
}

std::string server_version() {
  return FLUX2_VERSION;
}

std::string server_help_text() {
  return absl::StrCat(
      "usage: flux2_server [flags]\n"
      "       flux2_server --probe liveness|readiness [--addr HOST:PORT] [--tls-cert FILE]\n"
      "\n"
      "Serves FLUX.2 text-to-image generation and editing over gRPC (flux2.v1.ImageGeneration, "
      "grpc.health.v1,\n"
      "server reflection) with Prometheus metrics on a separate HTTP port.\n"
      "\n"
      "network:\n"
      "  --host ADDR              address to bind (default 0.0.0.0)\n"
      "  --port N                 gRPC port (default 50051; 0 picks a free port)\n"
      "  --metrics-port N         Prometheus /metrics HTTP port (default 9464; 0 picks a free "
      "port)\n"
      "  --metrics-host ADDR      address /metrics binds to (default: --host), e.g. 127.0.0.1 for\n"
      "                           a node-local scraper\n"
      "  --metrics-basic-auth-file FILE  /metrics asks for HTTP basic auth with the file's first\n"
      "                           line, user:password (Prometheus' basic_auth); default open\n"
      "  --http-port N            OpenAI-compatible HTTP API: /v1/images/generations, /edits,\n"
      "                           /v1/models, /health, /ready, /openapi.json (default 8000;\n"
      "                           0 picks a free port, -1 turns it off); TLS and the token apply\n"
      "                           as on gRPC\n"
      "  --http-head-timeout-s S  a request's line and headers must arrive within S seconds, or\n"
      "                           it gets 408 (default 10: slow clients cannot hold sockets)\n"
      "  --http-body-timeout-s S  its body within S seconds after them (default 60)\n"
      "  --http-idle-timeout-s S  an idle keep-alive connection closes after S seconds (default "
      "5)\n"
      "  --http-max-connections N open HTTP connections in all (default 1024); at the limit the\n"
      "                           least recently used idle one is closed, else the new one gets "
      "503\n"
      "  --http-max-connections-per-client N  the same per client IP address (default 64)\n"
      "  --tls-cert FILE          PEM certificate chain; with --tls-key serves TLS instead of\n"
      "                           plaintext (gRPC and the HTTP API)\n"
      "  --tls-key FILE           PEM private key for --tls-cert\n"
      "  --auth-token-file FILE   require `authorization: Bearer <token>` (token = the file's\n"
      "                           first line) on ImageGeneration RPCs and the HTTP API's /v1\n"
      "                           routes; health and reflection stay open. Needs --tls-cert\n"
      "                           unless --allow-insecure-token\n"
      "  --allow-insecure-token   accept --auth-token-file without TLS (TLS ends in front of the\n"
      "                           server: an Ingress, a service mesh); the start-up log warns\n"
      "model:\n"
      "  --model-dir DIR          FLUX.2-klein or FLUX.2-dev checkpoint directory (Hugging Face "
      "layout).\n"
      "                           Absent: the embedded tiny checkpoint (",
      embedded_checkpoint_dir(),
      ")\n"
      "                           on the CPU backend\n"
      "  --backend auto|cpu|cuda  (default auto: cuda when --model-dir is given and a GPU is "
      "usable,\n"
      "                           else cpu)\n"
      "  --gpus N|A,B,...         GPUs of this host one request is split over (sequence x CFG\n"
      "                           parallelism over NCCL): a count N (CUDA devices 0..N-1) or\n"
      "                           distinct device ordinals (2,3: devices 2 and 3, the gpu label\n"
      "                           of the per-GPU metrics); must fit the model's attention heads.\n"
      "                           With the CPU backend, that many ranks as threads (for tests;\n"
      "                           no faster than one) (default 1)\n"
      "  --warmup-steps N         steps of the warm-up generation run before readiness (default "
      "1;\n"
      "                           0 skips it)\n"
      "  --fast-paths on|off      fused kernels (default on); off: each runs its eager chain\n"
      "                           instead (same bytes); cuDNN attention and the quality=high FP8\n"
      "                           paths are implementations, kept either way\n",
      backend_flags_help(),
      "  --text-encoder-offload   keep the text encoder's weights in pinned host memory and "
      "stream them\n"
      "                           onto the GPU layer by layer for each prompt encode (the 80 GB\n"
      "                           memory plan of FLUX.2-dev: the device holds two layer buffers\n"
      "                           instead of every layer; encodes are slower); default off: the\n"
      "                           weights live on the device. A model whose memory plan does not\n"
      "                           fit the free device memory is refused at start-up (exit 1)\n"
      "  --prompt-cache-bytes N   device bytes of the LRU prompt-embedding cache: a repeated "
      "prompt\n"
      "                           skips the text encoder (default 268435456 = 256 MiB; 0 "
      "disables it)\n",
      checkpoint_flags_help(),
      "  --enable-quality-high    accept QUALITY_HIGH requests (numerically different fast paths,\n"
      "                           FP8 weight copies made at load; needs the cuda backend, else "
      "the\n"
      "                           server fails to start)\n"
      "admission and limits:\n"
      "  --queue-depth N          requests that may wait behind the running one; more are rejected "
      "at\n"
      "                           once with RESOURCE_EXHAUSTED (default 8)\n"
      "  --max-pixels N           width x height budget per image (default 4194304 = 2048 x 2048)\n"
      "  --max-images N           largest num_images per request (default 4)\n"
      "  --max-steps N            largest num_inference_steps (default 200)\n"
      "  --max-prompt-bytes N     largest prompt / negative_prompt in bytes (default 8192)\n"
      "  --max-sequence-length N  text-encoder tokens of every request: prompts are padded or\n"
      "                           truncated to N (default 512, diffusers' default; at most the\n"
      "                           model's own limit)\n"
      "  --max-reference-images N largest number of reference_images (editing) per request\n"
      "                           (default 4, as BFL's klein API; 0 refuses reference images)\n"
      "  --max-reference-bytes N  largest encoded reference image (PNG/JPEG) in bytes (default\n"
      "                           10485760 = 10 MiB)\n"
      "  --max-request-bytes N    gRPC's max receive message size (default 50331648 = 48 MiB);\n"
      "                           must fit max-reference-images x max-reference-bytes + 2 x\n"
      "                           max-prompt-bytes + 64 KiB, or the server refuses to start\n"
      "  --max-response-bytes N   largest worst-case unary GenerateImage response (default\n"
      "                           4194304 = gRPC's default client receive limit): a request\n"
      "                           whose num_images x encoded-size bound exceeds it is refused\n"
      "                           with INVALID_ARGUMENT before compute (GenerateImageStream sends\n"
      "                           one image per message and is not limited); raise it together\n"
      "                           with the clients' max receive message size\n"
      "  --drain-timeout-s S      on SIGTERM/SIGINT, time queued and running requests get to "
      "finish\n"
      "                           before they are cancelled (default 600); the exit code is 0\n"
      "faults:\n"
      "  --stall-timeout-min-s S  the watchdog calls a stage of the running request (a step, the\n"
      "                           text encoder, the VAE decode) stalled after max(S, M x its\n"
      "                           expected time): liveness NOT_SERVING and flux2_engine_stalled 1\n"
      "                           until it ends (default 60)\n"
      "  --stall-step-multiple M  expected time: the request's longest step so far, before its\n"
      "                           first the last step measured, scaled by (pixels ratio)^2\n"
      "                           (default 20)\n"
      "                           A request out of device memory fails alone "
      "(RESOURCE_EXHAUSTED);\n"
      "                           a sticky CUDA error fails it (INTERNAL), turns liveness\n"
      "                           NOT_SERVING, answers queued requests UNAVAILABLE and exits 1\n"
      "LoRA adapters (README \"LoRA adapters\"):\n"
      "  --lora-dir DIR           requests' loras name .safetensors files under DIR by their path\n"
      "                           without the suffix (styles/pixel-art); default none: LoRA off\n"
      "  --lora-cache-bytes N     device bytes of uploaded adapters kept between requests (LRU,\n"
      "                           part of the start-up memory plan; default 2147483648 = 2 GiB)\n"
      "  --lora-host-cache-bytes N  host bytes of parsed adapters kept (LRU; default 8589934592\n"
      "                           = 8 GiB)\n"
      "  --lora-preload A,B       adapters loaded and pinned on the device at start-up; one that\n"
      "                           fails to load refuses start-up naming it\n"
      "  --max-loras-per-request N  adapters per request (default 4)\n"
      "  --max-lora-rank N        an adapter module of higher rank is refused (default 256)\n"
      "  --max-lora-scale S       largest |scale| of an adapter (default 8)\n"
      "logging:\n"
      "  --log-format text|json   stderr lines: text (default; \"<UTC time> <LEVEL> flux2_server:\n"
      "                           ...\") or one JSON object per line, each finished request as\n"
      "                           {\"event\": \"request\", method, request_id, code, seconds, "
      "peer,\n"
      "                           width, height, steps, num_images, quality, error}\n"
      "probe mode (container HEALTHCHECK):\n"
      "  --probe liveness|readiness  run one grpc.health.v1 Check against --addr within 2 s and "
      "exit\n"
      "                           0 when SERVING, 1 otherwise (TLS when --tls-cert names the "
      "CA/cert)\n"
      "  --addr HOST:PORT         server to probe (default 127.0.0.1:50051)\n"
      "testing only:\n"
      "  --test-step-delay-ms MS  TEST ONLY: sleep MS after every denoising step so requests are "
      "slow\n"
      "                           enough for overload/cancellation/drain tests; never in "
      "production\n"
      "  --test-inject-fault KIND[@STEP][:SECONDS]  TEST ONLY: provoke a device fault once, after\n"
      "                           STEP steps (default 1) of the first request: device_oom (its\n"
      "                           next allocation asks for more than the device has),\n"
      "                           illegal_address (a sticky error), hang (a kernel spinning\n"
      "                           SECONDS, default 10); the cuda backend only\n"
      "  -h, --help               this text\n"
      "  --version                print the version and exit\n"
      "environment:\n"
      "  every flag --foo-bar may instead be set by the environment variable FLUX2_FOO_BAR\n"
      "  (FLUX2_QUEUE_DEPTH=4, FLUX2_ENABLE_QUALITY_HIGH=true); the command line wins\n");
}

}  // namespace flux2::server
