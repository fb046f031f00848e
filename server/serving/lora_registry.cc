// The adapters under --lora-dir; see lora_registry.h. Tested by tests/server/lora_registry_test.cc.
#include "server/serving/lora_registry.h"

#include <openssl/evp.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/base/read_file.h"
#include "server/common/log.h"
#include "server/ops/metrics.h"

namespace flux2::server {
namespace {

constexpr absl::string_view kSuffix = ".safetensors";

// The realpath of `path`, or "" when it does not resolve.
std::string real_path(const std::string& path) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (resolved == nullptr) return "";
  std::string out(resolved);
  ::free(resolved);
  return out;
}

// Host bytes of a parsed adapter: its float32 values and the module records.
int64_t adapter_host_bytes(const LoraAdapter& adapter) {
  return adapter.values() * 4 + static_cast<int64_t>(adapter.modules.size()) * 256;
}

// Host bytes of a loaded adapter: the parsed adapter and its image.
int64_t host_bytes(const ResolvedLora& lora) {
  return adapter_host_bytes(*lora.adapter) + (lora.image != nullptr ? lora.image->bytes() : 0);
}

std::string describe_ranks(const LoraAdapter& adapter) {
  std::map<int64_t, int> ranks;
  for (const LoraModule& module : adapter.modules) ++ranks[module.rank];
  std::vector<std::string> parts;
  for (const auto& [rank, count] : ranks) parts.push_back(absl::StrCat(count, "x r", rank));
  return absl::StrJoin(parts, " ");
}

}  // namespace

std::string sha256_hex(absl::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 15]);
  }
  return out;
}

absl::Status check_lora_name(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("is empty");
  if (name.front() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' is an absolute path; name an adapter relative to --lora-dir"));
  }
  if (absl::StrContains(name, '\\') || absl::StrContains(name, '\0')) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' holds a backslash or NUL; use / between directories"));
  }
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("'", name, "' has a '..' component; adapters live under --lora-dir"));
    }
    if (part.empty() || part == ".") {
      return absl::InvalidArgumentError(absl::StrCat("'", name, "' has an empty or '.' component"));
    }
  }
  return absl::OkStatus();
}

const char* lora_failure_reason(const absl::Status& status) {
  if (absl::IsNotFound(status) || absl::IsPermissionDenied(status)) return "not_found";
  if (absl::IsUnavailable(status)) return "io";
  const absl::string_view m = status.message();
  if (absl::StrContains(m, "--max-lora-rank")) return "rank";
  if (absl::StrContains(m, "unknown key")) return "unknown_key";
  if (absl::StrContains(m, "do not fit") || absl::StrContains(m, "rank ")) return "shape";
  if (absl::StrContains(m, "not supported") || absl::StrContains(m, "not a FLUX.2")) {
    return "unsupported";
  }
  return "format";
}

LoraRegistry::LoraRegistry(LoraRegistryOptions options, std::string root, const Flux2Config& config,
                           Metrics* metrics)
    : options_(std::move(options)), root_(std::move(root)), config_(config), metrics_(metrics) {
  stats_.capacity = options_.host_cache_bytes;
  std::lock_guard<std::mutex> lock(mu_);
  publish_stats();
}

absl::StatusOr<std::unique_ptr<LoraRegistry>> LoraRegistry::open(LoraRegistryOptions options,
                                                                 const Flux2Config& config,
                                                                 Metrics* metrics) {
  std::error_code error;
  if (!std::filesystem::is_directory(options.dir, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lora-dir: ", options.dir, " is not a readable directory"));
  }
  std::string root = real_path(options.dir);
  if (root.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--lora-dir: cannot resolve ", options.dir));
  }
  return std::unique_ptr<LoraRegistry>(
      new LoraRegistry(std::move(options), std::move(root), config, metrics));
}

absl::StatusOr<std::string> LoraRegistry::locate(const std::string& name,
                                                 Identity* identity) const {
  const std::string path = absl::StrCat(options_.dir, "/", name, kSuffix);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat("no adapter '", name, "' under --lora-dir"));
  }
  const std::string real = real_path(path);
  if (real.empty() || !absl::StartsWith(real, root_ + "/")) {
    return absl::PermissionDeniedError(
        absl::StrCat("'", name, "' resolves outside --lora-dir (a symlink?); refused"));
  }
  identity->size = st.st_size;
  identity->mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  return real;
}

absl::StatusOr<ResolvedLora> LoraRegistry::resolve(const std::string& name) {
  absl::Status status = check_lora_name(name);
  Identity identity;
  absl::StatusOr<std::string> path =
      status.ok() ? locate(name, &identity) : absl::StatusOr<std::string>(status);
  if (!path.ok()) {
    if (metrics_ && !absl::IsInvalidArgument(path.status())) {
      metrics_->lora().count_load_failure(lora_failure_reason(path.status()));
    }
    return path.status();
  }
  std::shared_ptr<Flight> flight;
  {
    std::unique_lock<std::mutex> lock(mu_);
    {
      auto entry = entries_.find(name);
      if (entry != entries_.end() && entry->second.identity == identity) {
        lru_.remove(name);
        lru_.push_front(name);
        ++stats_.hits;
        if (metrics_) metrics_->lora().count_cache("host", true);
        return entry->second.lora;
      }
      auto running = flights_.find(name);
      if (running != flights_.end()) {
        flight = running->second;  // another request loads it: wait for its result
        cv_.wait(lock, [&] { return flight->done; });
        if (flight->result.ok()) {
          ++stats_.hits;
          if (metrics_) metrics_->lora().count_cache("host", true);
        }
        return flight->result;
      }
    }
    flight = std::make_shared<Flight>();
    flights_[name] = flight;
    ++stats_.misses;
    if (metrics_) metrics_->lora().count_cache("host", false);
  }
  absl::StatusOr<ResolvedLora> result = load(name, *path, identity);
  if (result.ok()) insert(name, identity, *result);
  {
    std::lock_guard<std::mutex> lock(mu_);
    flight->result = result;
    flight->done = true;
    flights_.erase(name);
  }
  cv_.notify_all();
  return result;
}

absl::StatusOr<ResolvedLora> LoraRegistry::load(const std::string& name, const std::string& path,
                                                const Identity& identity) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> read = read_file(path, "");
  if (!read.ok()) {
    const absl::Status error = absl::UnavailableError(absl::StrCat("cannot read ", name, kSuffix));
    if (metrics_) metrics_->lora().count_load_failure("io");
    return error;
  }
  const std::string& file = *read;
  // The content hash on a thread of its own beside the parse (each ~0.3 s for 300 MB).
  std::future<std::string> sha256 =
      std::async(std::launch::async, [&file] { return sha256_hex(file); });
  absl::StatusOr<LoraAdapter> adapter = parse_lora_adapter(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(file.data()), file.size()), config_,
      LoraParseOptions{options_.max_rank, options_.max_scale});
  if (!adapter.ok()) {
    if (metrics_) metrics_->lora().count_load_failure(lora_failure_reason(adapter.status()));
    return adapter.status();
  }
  ResolvedLora lora;
  lora.name = name;
  lora.sha256 = sha256.get();
  lora.file_bytes = identity.size;
  lora.adapter = std::make_shared<const LoraAdapter>(std::move(*adapter));
  std::string image;
  // An adapter too large for the host cache is served, not kept: no image to pack each time it is
  // loaded again (the bound of an f32 image: the most an image can take).
  const bool kept =
      adapter_host_bytes(*lora.adapter) + lora_packed_bytes_bound(*lora.adapter, sizeof(float)) <=
      options_.host_cache_bytes;
  if (options_.make_host_image && kept) {
    absl::StatusOr<std::shared_ptr<const LoraHostImage>> made =
        options_.make_host_image(*lora.adapter);
    if (made.ok()) {
      lora.image = *std::move(made);
      image = absl::StrCat(", packed for upload in ", lora.image->bytes(), " bytes");
    } else {  // served all the same: each upload converts the values instead
      log_line(LogLevel::kWarning, absl::StrCat("LoRA adapter ", name, ": no upload image (",
                                                made.status().message(), ")"));
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (metrics_) metrics_->lora().observe_load(seconds);
  const LoraAdapter& a = *lora.adapter;
  log_line(
      LogLevel::kInfo,
      absl::StrCat("loaded LoRA adapter ", name, ": sha256 ", lora.sha256.substr(0, 12),
                   ", layout ", lora_layout_name(a.layout), ", max rank ", a.max_rank(), " (",
                   describe_ranks(a), "), ", a.modules.size(), " modules, ", identity.size,
                   " bytes in ", absl::StrFormat("%.3f", seconds), " s", image, "; deviations: ",
                   a.deviations.empty() ? "none" : absl::StrJoin(a.deviations, "; ")));
  return lora;
}

void LoraRegistry::insert(const std::string& name, const Identity& identity,
                          const ResolvedLora& lora) {
  const int64_t bytes = host_bytes(lora);
  // Dropped entries die after the lock is released: freeing an image's page-locked memory takes
  // milliseconds that every resolve would wait for.
  std::vector<Entry> dropped;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto old = entries_.find(name); old != entries_.end()) {  // a changed file: replace it
    stats_.bytes -= old->second.bytes;
    dropped.push_back(std::move(old->second));
    entries_.erase(old);
    lru_.remove(name);
  }
  if (bytes > options_.host_cache_bytes) {  // served, not kept
    publish_stats();
    return;
  }
  int64_t evicted = 0;
  while (stats_.bytes + bytes > options_.host_cache_bytes && !lru_.empty()) {
    const std::string victim = lru_.back();
    lru_.pop_back();
    stats_.bytes -= entries_[victim].bytes;
    dropped.push_back(std::move(entries_[victim]));
    entries_.erase(victim);
    ++evicted;
  }
  entries_[name] = Entry{identity, lora, bytes};
  lru_.push_front(name);
  stats_.bytes += bytes;
  stats_.evictions += evicted;
  if (metrics_ && evicted > 0) metrics_->lora().count_evictions("host", evicted);
  publish_stats();
}

void LoraRegistry::publish_stats() const {
  if (metrics_) metrics_->lora().set_cache("host", stats_.bytes, stats_.capacity);
}

std::vector<LoraListing> LoraRegistry::list(
    const std::function<bool(const std::string&)>& resident) const {
  std::vector<LoraListing> out;
  std::error_code error;
  namespace fs = std::filesystem;
  for (fs::recursive_directory_iterator
           it(options_.dir, fs::directory_options::skip_permission_denied, error),
       end;
       !error && it != end; it.increment(error)) {
    const fs::path& path = it->path();
    if (!it->is_regular_file(error) || path.extension().string() != kSuffix) continue;
    std::string relative = fs::relative(path, options_.dir, error).generic_string();
    LoraListing entry;
    entry.name = relative.substr(0, relative.size() - kSuffix.size());
    Identity identity;
    if (!locate(entry.name, &identity).ok()) continue;  // escapes the directory
    entry.bytes = identity.size;
    std::lock_guard<std::mutex> lock(mu_);
    entry.pinned = pinned_.count(entry.name) > 0;
    auto found = entries_.find(entry.name);
    if (found != entries_.end() && found->second.identity == identity) {
      const ResolvedLora& lora = found->second.lora;
      entry.loaded = true;
      entry.layout = lora_layout_name(lora.adapter->layout);
      entry.max_rank = lora.adapter->max_rank();
      entry.modules = static_cast<int64_t>(lora.adapter->modules.size());
      entry.sha256_prefix = lora.sha256.substr(0, 12);
      entry.resident = resident && resident(lora.sha256);
    }
    out.push_back(std::move(entry));
  }
  std::sort(out.begin(), out.end(),
            [](const LoraListing& a, const LoraListing& b) { return a.name < b.name; });
  return out;
}

void LoraRegistry::mark_pinned(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  pinned_.insert(name);
}

LoraHostStats LoraRegistry::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  LoraHostStats out = stats_;
  out.adapters = static_cast<int64_t>(entries_.size());
  return out;
}

}  // namespace flux2::server
