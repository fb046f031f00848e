// flux2_server flag parsing and validation; see server_options.h.
// Tested by tests/server/server_options_test.cc.
#include "server/server_options.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "kernels/base/decimal.h"
#include "kernels/base/status.h"
#include "server/cli/args.h"
#include "server/cli/backend_flags.h"
#include "server/cli/embedded_checkpoint.h"
#include "server/request_validation.h"

namespace flux2::server {
namespace {

const std::set<std::string> kValueFlags = {"--host",
                                           "--port",
                                           "--metrics-port",
                                           "--http-port",
                                           "--model-dir",
                                           "--backend",
                                           "--queue-depth",
                                           "--max-pixels",
                                           "--max-images",
                                           "--max-steps",
                                           "--max-prompt-bytes",
                                           "--max-reference-images",
                                           "--max-reference-bytes",
                                           "--max-request-bytes",
                                           "--max-response-bytes",
                                           "--max-sequence-length",
                                           "--drain-timeout-s",
                                           "--warmup-steps",
                                           "--tls-cert",
                                           "--tls-key",
                                           "--auth-token-file",
                                           "--fast-paths",
                                           "--prompt-cache-bytes",
                                           "--transformer-file",
                                           "--log-format",
                                           "--test-step-delay-ms",
                                           "--probe",
                                           "--addr"};
const std::set<std::string> kBoolFlags = {"--help", "--enable-quality-high",
                                          "--text-encoder-offload"};

absl::Status read_int(const Args& args, absl::string_view name, int* out) {
  FLUX_ASSIGN_OR_RETURN(int64_t value, args.get_int(name, *out));
  if (value < INT32_MIN || value > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", value, " is out of range"));
  }
  *out = static_cast<int>(value);
  return absl::OkStatus();
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
  FLUX_ASSIGN_OR_RETURN(Args args, Args::parse(argc, argv, 1, kBoolFlags));
  if (!args.positional().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument \"", args.positional().front(), "\" (see --help)"));
  }
  std::set<std::string> known = kValueFlags;
  known.insert(backend_flag_names().begin(), backend_flag_names().end());
  known.insert(kBoolFlags.begin(), kBoolFlags.end());
  FLUX_RETURN_IF_ERROR(args.check_known(known));

  ParsedFlags parsed;
  parsed.help = args.has("--help");
  ServerOptions& o = parsed.options;
  o.host = args.get("--host", o.host);
  FLUX_RETURN_IF_ERROR(read_int(args, "--port", &o.port));
  FLUX_RETURN_IF_ERROR(read_int(args, "--metrics-port", &o.metrics_port));
  FLUX_RETURN_IF_ERROR(read_int(args, "--http-port", &o.http_port));
  o.model_dir = args.get("--model-dir", o.model_dir);
  o.backend = args.get("--backend", o.backend);
  FLUX_RETURN_IF_ERROR(read_int(args, "--queue-depth", &o.queue_depth));
  { FLUX_ASSIGN_OR_RETURN(o.max_pixels, args.get_int("--max-pixels", o.max_pixels)); }
  FLUX_RETURN_IF_ERROR(read_int(args, "--max-images", &o.max_images));
  FLUX_RETURN_IF_ERROR(read_int(args, "--max-steps", &o.max_steps));
  FLUX_RETURN_IF_ERROR(read_int(args, "--max-prompt-bytes", &o.max_prompt_bytes));
  FLUX_RETURN_IF_ERROR(read_int(args, "--max-reference-images", &o.max_reference_images));
  {
    FLUX_ASSIGN_OR_RETURN(o.max_reference_bytes,
                          args.get_int("--max-reference-bytes", o.max_reference_bytes));
  }
  {
    FLUX_ASSIGN_OR_RETURN(o.max_request_bytes,
                          args.get_int("--max-request-bytes", o.max_request_bytes));
  }
  {
    FLUX_ASSIGN_OR_RETURN(o.max_response_bytes,
                          args.get_int("--max-response-bytes", o.max_response_bytes));
  }
  FLUX_RETURN_IF_ERROR(read_int(args, "--max-sequence-length", &o.max_sequence_length));
  {
    FLUX_ASSIGN_OR_RETURN(o.drain_timeout_s,
                          args.get_double("--drain-timeout-s", o.drain_timeout_s));
  }
  FLUX_RETURN_IF_ERROR(read_int(args, "--warmup-steps", &o.warmup_steps));
  o.tls_cert = args.get("--tls-cert", o.tls_cert);
  o.tls_key = args.get("--tls-key", o.tls_key);
  o.auth_token_file = args.get("--auth-token-file", o.auth_token_file);
  FLUX_ASSIGN_OR_RETURN(o.fast_paths, parse_on_off(args, "--fast-paths", o.fast_paths));
  FLUX_ASSIGN_OR_RETURN(o.backend_options, parse_backend_flags(args));
  o.enable_quality_high =
      args.has("--enable-quality-high") && args.get("--enable-quality-high") != "false";
  o.text_encoder_offload =
      args.has("--text-encoder-offload") && args.get("--text-encoder-offload") != "false";
  {
    FLUX_ASSIGN_OR_RETURN(o.prompt_cache_bytes,
                          args.get_int("--prompt-cache-bytes", o.prompt_cache_bytes));
  }
  o.transformer_file = args.get("--transformer-file", o.transformer_file);
  o.log_format = args.get("--log-format", o.log_format);
  {
    FLUX_ASSIGN_OR_RETURN(double delay_ms, args.get_double("--test-step-delay-ms", 0.0));
    o.test_step_delay_s = delay_ms / 1000.0;
  }
  o.probe = args.get("--probe", o.probe);
  o.probe_addr = args.get("--addr", o.probe_addr);
  return parsed;
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
  FLUX_RETURN_IF_ERROR(check_range("--metrics-port", o.metrics_port, 0, 65535));
  if (o.port != 0 && o.port == o.metrics_port) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-port: ", o.metrics_port, " is also the gRPC --port"));
  }
  FLUX_RETURN_IF_ERROR(check_range("--http-port", o.http_port, -1, 65535));
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
  FLUX_RETURN_IF_ERROR(check_range("--max-steps", o.max_steps, 1, 1000));
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
  // 1 TiB only catches a typo: the memory plan checks the cache against the device's free memory
  // at load.
  FLUX_RETURN_IF_ERROR(check_range("--prompt-cache-bytes",
                                   static_cast<double>(o.prompt_cache_bytes), 0.0,
                                   static_cast<double>(kMaxPromptCacheBytes)));
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError(o.tls_cert.empty() ? "--tls-cert: required with --tls-key"
                                                         : "--tls-key: required with --tls-cert");
  }
  if (!std::isfinite(o.test_step_delay_s)) {
    return absl::InvalidArgumentError("--test-step-delay-ms: not a finite number");
  }
  FLUX_RETURN_IF_ERROR(
      check_range("--test-step-delay-ms", o.test_step_delay_s * 1000.0, 0.0, 60000.0));
  return absl::OkStatus();
}

int64_t min_request_bytes(const ServerOptions& options) {
  return int64_t{options.max_reference_images} * options.max_reference_bytes +
         2 * int64_t{options.max_prompt_bytes} + kRequestOverheadBytes;
}

std::string resolved_model_dir(const ServerOptions& options) {
  return options.model_dir.empty() ? embedded_checkpoint_dir() : options.model_dir;
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
      "  --http-port N            OpenAI-compatible HTTP API: /v1/images/generations, /edits,\n"
      "                           /v1/models, /health, /ready, /openapi.json (default 8000;\n"
      "                           0 picks a free port, -1 turns it off); TLS and the token apply\n"
      "                           as on gRPC\n"
      "  --tls-cert FILE          PEM certificate chain; with --tls-key serves TLS instead of\n"
      "                           plaintext (gRPC and the HTTP API)\n"
      "  --tls-key FILE           PEM private key for --tls-cert\n"
      "  --auth-token-file FILE   require `authorization: Bearer <token>` (token = the file's\n"
      "                           first line) on ImageGeneration RPCs and the HTTP API's /v1\n"
      "                           routes; health and reflection stay open\n"
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
      "disables it)\n"
      "  --transformer-file FILE  load the transformer's weights from this single file (Black "
      "Forest\n"
      "                           Labs flux2-dev.safetensors naming) instead "
      "of\n"
      "                           <model-dir>/transformer/'s (whose config.json is still read)\n"
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
      "  --help                   this text\n");
}

}  // namespace flux2::server
