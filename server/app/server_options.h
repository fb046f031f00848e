// flux2_server configuration: the flag set of the server contract (`flux2_server --help`), parsed
// into a plain struct and validated with errors that name the flag.
// Tested by tests/server/server_options_test.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend_options.h"
#include "model/flux2_config.h"
#include "model/prompt_cache.h"
#include "server/common/checkpoint_flags.h"
#include "server/serving/engine.h"
#include "server/serving/limits.h"
#include "server/serving/stall_watchdog.h"

namespace flux2::server {

struct ServerOptions {
  std::string host = "0.0.0.0";  // address the gRPC port binds to
  int port = 50051;              // gRPC port; 0 picks a free one (printed at start-up)
  int metrics_port = 9464;       // Prometheus /metrics over HTTP; 0 picks a free one
  std::string metrics_host;      // address /metrics binds to; empty: --host
  // "user:password" on the file's first line: /metrics asks for HTTP basic auth (Prometheus'
  // basic_auth scrape setting). Empty: /metrics is open.
  std::string metrics_basic_auth_file;
  // The OpenAI-compatible HTTP API (server/http/http_api.h); 0 picks a free one, -1 turns it off.
  int http_port = 8000;
  // The HTTP API's connections (server/http/transport/options.h): the deadline for a request's
  // line and headers (slow clients get 408), for its body, the keep-alive wait, and the open
  // connections in all and per client address (idle keep-alive ones are closed first).
  double http_head_timeout_s = 10.0;
  double http_body_timeout_s = 60.0;
  double http_idle_timeout_s = 5.0;
  int http_max_connections = 1024;
  int http_max_connections_per_client = 64;
  std::string model_dir;         // empty: the embedded tiny checkpoint on the CPU backend
  std::string backend = "auto";  // auto | cpu | cuda
  // --gpus N or --gpus A,B,...: the device ordinals of the GPUs of this host one request is split
  // over, rank r on gpus[r] (sequence x CFG parallelism, model/README.md "Several GPUs";
  // server/serving/parallel_engine.h; parsed by server/common/gpus_flag.h), checked against the
  // model's attention heads once it is loaded; N CPU ranks with --backend cpu.
  std::vector<int> gpus = {0};
  int queue_depth = 8;           // requests that may wait behind the running one
  int64_t max_pixels = 4194304;  // width x height budget per image (2048 x 2048)
  int max_images = 4;            // num_images upper bound
  int max_steps = 200;           // num_inference_steps upper bound
  int max_prompt_bytes = 8192;   // prompt / negative_prompt size bound
  // Editing: reference images per request (4 as BFL's klein API; 0 refuses reference_images).
  int max_reference_images = 4;
  int64_t max_reference_bytes = int64_t{10} << 20;  // one reference's encoded bytes (10 MiB)
  // gRPC's max receive message size: four 10 MiB references plus the prompt and the rest fit.
  int64_t max_request_bytes = int64_t{48} << 20;
  // Largest worst-case unary GenerateImage response admitted (gRPC's default client receive limit,
  // 4 MiB); GenerateImageStream is not limited by it (server/serving/request_validation.h
  // unary_response_bound_bytes).
  int64_t max_response_bytes = int64_t{4} << 20;
  // Text-encoder sequence length of every request (prompts padded or truncated to it); 512 is
  // diffusers' default, the goldens use 64 and 96.
  int max_sequence_length = 512;
  double drain_timeout_s = 600.0;  // SIGTERM: time in-flight and queued work gets to finish
  int warmup_steps = 1;            // steps of the warm-up generation before readiness; 0: none
  std::string tls_cert;            // PEM certificate chain; with tls_key enables TLS
  std::string tls_key;             // PEM private key
  std::string auth_token_file;     // file holding the bearer token ImageGeneration requires
  // The token without --tls-cert travels in plaintext: refused unless this says TLS ends in front
  // of the server (an Ingress, a service mesh); then the start-up log warns.
  bool allow_insecure_token = false;
  // --fast-paths on|off: the fast-path switch of every request (RequestOptions::fast_paths; off:
  // every fused kernel runs its eager chain, same bytes; implementations such as cuDNN attention
  // and the quality=high FP8 GEMMs are kept).
  bool fast_paths = true;
  BackendOptions backend_options;    // --cpu-threads, --fp8-attention, --gemm-autotune
  bool enable_quality_high = false;  // accept QUALITY_HIGH requests
  // --text-encoder-offload: the text encoder's weights stay in pinned host memory and stream onto
  // the device layer by layer for each encode (WeightResidency::kStreamed: FLUX.2-dev on 80 GB).
  bool text_encoder_offload = false;
  // Device bytes of the prompt-embedding cache (repeated prompts skip the text encoder); 0: off.
  int64_t prompt_cache_bytes = kDefaultPromptCacheBytes;
  // --transformer-file, --text-encoder-file, --fp8-lossless resident|per_layer and
  // --fp8-input-scale dynamic|static: where the transformer and text encoder come from and how an
  // FP8 transformer checkpoint is served (server/common/checkpoint_flags.h, shared with `flux2
  // generate`; the words checked at parse).
  CheckpointFlags checkpoint;
  // LoRA adapters (README "LoRA adapters"): requests name files under lora_dir (empty: LoRA is
  // off); parsed adapters stay in a host LRU of lora_host_cache_bytes and uploaded ones in a
  // device LRU of lora_cache_bytes (part of the memory plan); lora_preload's are loaded and pinned
  // at start-up (--lora-preload a,b).
  std::string lora_dir;
  int64_t lora_cache_bytes = int64_t{2} << 30;
  int64_t lora_host_cache_bytes = int64_t{8} << 30;
  std::vector<std::string> lora_preload;
  int max_loras_per_request = 4;
  int max_lora_rank = 256;
  double max_lora_scale = 8.0;
  // --log-format text|json: stderr lines as text or one JSON object per line (server/common/log.h).
  std::string log_format = "text";
  double test_step_delay_s = 0.0;  // TEST ONLY: sleep after every denoising step (slow requests)
  // --stall-timeout-min-s, --stall-step-multiple: when the watchdog calls a stage stalled.
  StallPolicy stall;
  std::optional<TestFault> test_fault;  // TEST ONLY: --test-inject-fault KIND[@STEP][:SECONDS]

  // Probe mode (container HEALTHCHECK): check one health service of a running server and exit.
  std::string probe;  // "" (serve), "liveness" or "readiness"
  std::string probe_addr = "127.0.0.1:50051";
};

// The result of parsing argv: the options, or a request for the help text or the version.
struct ParsedFlags {
  ServerOptions options;
  bool help = false;     // -h / --help
  bool version = false;  // --version
};

// Parses `--name value` / `--name=value` flags (argv[1..]) with CLI11 (Debian's libcli11-dev);
// every flag --foo-bar may instead come from the environment variable FLUX2_FOO_BAR (for
// containers; the command line wins). Unknown flags, missing values and values of the wrong type
// are errors that name the flag. Does not validate cross-field constraints; call
// validate_server_options next.
absl::StatusOr<ParsedFlags> parse_server_flags(int argc, char** argv);

// Checks ranges and combinations (ports, depth, TLS cert without key, probe service names, a
// receive limit smaller than what the reference and prompt limits need).
absl::Status validate_server_options(const ServerOptions& options);

// The --help text: every flag, its default and its meaning.
std::string server_help_text();
// Every long flag parse_server_flags accepts ("--port", ..., "--help"): the help text must
// document exactly these (tests/server/server_options_test.cc).
std::vector<std::string> server_flag_names();
// The version --version prints (the project's, as GetModelInfo.server_version reports it).
std::string server_version();

// The smallest --max-request-bytes the other limits need: every reference at its byte limit, the
// prompt and negative prompt at theirs, plus kRequestOverheadBytes for the other fields and the
// protobuf framing.
int64_t min_request_bytes(const ServerOptions& options);
inline constexpr int64_t kRequestOverheadBytes = 64 << 10;

// The largest --prompt-cache-bytes (1 TiB): a bound against typos, not a fit check (the memory
// plan compares the cache with the device's free memory when the model loads).
inline constexpr int64_t kMaxPromptCacheBytes = int64_t{1} << 40;

// The limit flags, for the serving core to narrow the model's bounds with (resolve_limits).
LimitFlags limit_flags(const ServerOptions& options);

// The model directory to serve: --model-dir, or the embedded tiny checkpoint.
std::string resolved_model_dir(const ServerOptions& options);

}  // namespace flux2::server
