// The LoRA adapters a server may apply: files under --lora-dir, named by their path below it
// without ".safetensors" (`styles/pixel-art`), parsed for the running transformer and kept in a
// host LRU (--lora-host-cache-bytes) keyed by (name, size, mtime), loaded once per name at a time.
// Transport-free. Tested by tests/server/lora_registry_test.cc.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/flux2_config.h"
#include "model/lora_adapter.h"
#include "model/lora_host_image.h"

namespace flux2::server {

class Metrics;

struct LoraRegistryOptions {
  std::string dir;                              // --lora-dir
  int64_t host_cache_bytes = int64_t{8} << 30;  // --lora-host-cache-bytes
  int64_t max_rank = 256;                       // --max-lora-rank
  double max_scale = 8.0;                       // --max-lora-scale
  // Packs each adapter for the engine's device as it is loaded (lora_host_image_maker), so its
  // upload is one copy; null: none (uploads convert the f32 values on the engine's thread).
  LoraHostImageMaker make_host_image{};
};

// An adapter ready for a request.
struct ResolvedLora {
  std::string name;
  std::string sha256;  // of the file's bytes, 64 hex digits: the device cache's key
  std::shared_ptr<const LoraAdapter> adapter;
  std::shared_ptr<const LoraHostImage> image{};  // null without make_host_image or when it failed
  int64_t file_bytes = 0;
};

// One adapter file of list().
struct LoraListing {
  std::string name;
  int64_t bytes = 0;    // the file's
  bool loaded = false;  // parsed and in the host cache: the fields below are known
  std::string layout;   // lora_layout_name()
  int64_t max_rank = 0;
  int64_t modules = 0;
  std::string sha256_prefix;  // 12 hex digits
  bool resident = false;      // on the device now
  bool pinned = false;        // --lora-preload
};

struct LoraHostStats {
  int64_t hits = 0, misses = 0, evictions = 0;
  int64_t bytes = 0, capacity = 0, adapters = 0;
};

// OK when `name` may name an adapter: non-empty, relative, no "." / ".." / empty component, no
// NUL or backslash; else InvalidArgument saying why (no field prefix).
absl::Status check_lora_name(absl::string_view name);

// The label of flux2_lora_load_failures_total{reason} for an error of LoraRegistry::resolve:
// not_found, format, unknown_key, shape, rank, unsupported or io.
const char* lora_failure_reason(const absl::Status& status);

// Lowercase hex SHA-256 of `bytes` (OpenSSL).
std::string sha256_hex(absl::string_view bytes);

class LoraRegistry {
 public:
  // InvalidArgument naming --lora-dir when it is not a readable directory. `metrics` (may be null)
  // counts the host cache, load times and failures.
  static absl::StatusOr<std::unique_ptr<LoraRegistry>> open(LoraRegistryOptions options,
                                                            const Flux2Config& config,
                                                            Metrics* metrics);

  // The adapter `name` (check_lora_name first): from the host cache when the file's size and
  // mtime are unchanged, else read, hashed and parsed (one load per name at a time; concurrent
  // callers wait for it). Errors: InvalidArgument for a bad name; NotFound "no adapter 'foo' under
  // --lora-dir"; PermissionDenied when the file resolves outside --lora-dir; Unavailable when it
  // cannot be read; the parser's InvalidArgument otherwise.
  absl::StatusOr<ResolvedLora> resolve(const std::string& name);

  // Every *.safetensors under --lora-dir, sorted by name; `resident` says whether a sha256 is on
  // the device (null: none is).
  std::vector<LoraListing> list(const std::function<bool(const std::string&)>& resident) const;
  // Marks a preloaded adapter (reported as pinned by list()).
  void mark_pinned(const std::string& name);

  LoraHostStats stats() const;
  const LoraRegistryOptions& options() const { return options_; }

 private:
  struct Identity {
    int64_t size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const Identity&) const = default;
  };
  struct Entry {
    Identity identity;
    ResolvedLora lora;
    int64_t bytes = 0;  // host bytes held
  };
  struct Flight {  // one load in progress
    bool done = false;
    absl::StatusOr<ResolvedLora> result = absl::UnknownError("loading");
  };

  LoraRegistry(LoraRegistryOptions options, std::string root, const Flux2Config& config,
               Metrics* metrics);
  // The file of `name` and its identity, checked to stay under the directory.
  absl::StatusOr<std::string> locate(const std::string& name, Identity* identity) const;
  absl::StatusOr<ResolvedLora> load(const std::string& name, const std::string& path,
                                    const Identity& identity);
  void insert(const std::string& name, const Identity& identity, const ResolvedLora& lora);
  void publish_stats() const;  // mu_ held

  const LoraRegistryOptions options_;
  const std::string root_;  // the directory's realpath
  const Flux2Config config_;
  Metrics* const metrics_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Entry> entries_;                    // guarded by mu_
  std::list<std::string> lru_;                              // guarded by mu_; front: newest
  std::map<std::string, std::shared_ptr<Flight>> flights_;  // guarded by mu_
  std::set<std::string> pinned_;                            // guarded by mu_
  LoraHostStats stats_;                                     // guarded by mu_
};

}  // namespace flux2::server
