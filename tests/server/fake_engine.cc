// The fake engine for server tests; see fake_engine.h.
#include "tests/server/fake_engine.h"

#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace flux2::server::testing {
namespace {

constexpr auto kWaitLimit = std::chrono::seconds(60);

class FakeEngine final : public Engine {
 public:
  explicit FakeEngine(std::shared_ptr<FakeEngineControl> control) : control_(std::move(control)) {
    info_.model_dir = "/fake";
    info_.model_name = "fake-klein";
    info_.pipeline_class = "Flux2KleinPipeline";
    info_.variant = control_->uses_cfg ? "klein-base" : "klein-distilled";
    info_.is_distilled = !control_->uses_cfg;
    info_.uses_cfg = control_->uses_cfg;
    info_.default_steps = control_->default_steps;
    info_.default_guidance = 4.0;
    info_.pixel_multiple = 16;
    info_.backend = "cpu";
    info_.weight_value_bytes = 4;
    info_.quality_high = true;  // the server still gates it on --enable-quality-high
    if (control_->dev) {
      info_.model_name = "fake-dev";
      info_.pipeline_class = "Flux2Pipeline";
      info_.variant = "dev";
      info_.is_distilled = false;
      info_.uses_cfg = false;
      info_.guidance_embedded = true;
      info_.default_steps = 50;
    }
    info_.text_encoder_streamed = control_->text_encoder_streamed;
    info_.text_encoder_host_bytes = control_->text_encoder_streamed ? 1 << 20 : 1 << 10;
    info_.prompt_cache_bytes = control_->prompt_cache_bytes;
  }

  const PipelineInfo& info() const override { return info_; }
  const Flux2Config* lora_config() const override {
    return control_->lora_config ? &*control_->lora_config : nullptr;
  }
  absl::Status pin_lora(const LoraRequest& lora) const override {
    (void)lora;
    return absl::OkStatus();
  }

  std::vector<FieldViolation> check(const GenerateParams& params) const override {
    std::vector<FieldViolation> violations;
    if (params.width % 16 != 0 || params.width <= 0) violations.push_back({"width", "bad"});
    if (params.height % 16 != 0 || params.height <= 0) violations.push_back({"height", "bad"});
    return violations;
  }

  absl::StatusOr<GeneratedImage> generate(const GenerateParams& params,
                                          const GenerateHooks& hooks) override {
    control_->on_generate(params);
    const int64_t steps =
        params.num_inference_steps > 0 ? params.num_inference_steps : info_.default_steps;
    GeneratedImage image;
    image.width = params.width;
    image.height = params.height;
    image.seed = params.seed;
    image.prompt_cache_hit =
        info_.prompt_cache_bytes > 0 && !prompts_seen_.insert(params.prompt).second;
    image.timings.tokenize = 1e-4;
    image.timings.text_encode = 2e-3;
    image.timings.reference_encode =
        kFakeReferenceEncodeSeconds * static_cast<double>(params.references.size());
    image.timings.decode = 3e-3;
    for (int64_t i = 0; i < steps; ++i) {
      if (hooks.check_continue) {
        absl::Status status = hooks.check_continue();
        if (!status.ok()) return status;
      }
      if (absl::Status status = control_->before_step(); !status.ok()) return status;
      const double seconds = 1e-3 * static_cast<double>(i + 1);
      image.timings.steps.push_back(seconds);
      image.timings.denoise += seconds;
      control_->after_step();
      if (hooks.on_step) hooks.on_step(i, steps, seconds);
    }
    if (hooks.check_continue) {  // the pipeline's check before the VAE decode
      absl::Status status = hooks.check_continue();
      if (!status.ok()) return status;
    }
    control_->in_decode();
    image.rgb.resize(static_cast<size_t>(params.width * params.height * 3));
    for (int64_t y = 0; y < params.height; ++y) {
      for (int64_t x = 0; x < params.width; ++x) {
        for (int c = 0; c < 3; ++c)
          image.rgb[(y * params.width + x) * 3 + c] = fake_pixel(params.seed, x, y, c);
      }
    }
    return image;
  }

  std::vector<BackendMemoryStats> memory_stats() const override { return {BackendMemoryStats{}}; }
  absl::Status device_status() override {
    if (!control_->device_broken()) return absl::OkStatus();
    return absl::InternalError("the CUDA context is broken (fake)");
  }
  absl::Status inject_fault(InjectedFault fault, double hang_seconds) override {
    control_->inject(fault, hang_seconds);
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<FakeEngineControl> control_;
  PipelineInfo info_;
  std::set<std::string> prompts_seen_;  // worker thread only (generate)
};

}  // namespace

uint8_t fake_pixel(uint64_t seed, int64_t x, int64_t y, int c) {
  return static_cast<uint8_t>((seed * 31 + static_cast<uint64_t>(x * 7 + y * 13 + c * 101)) & 0xff);
}

void FakeEngineControl::close_gate() {
  std::lock_guard<std::mutex> lock(mu_);
  gate_closed_ = true;
  allowed_ = started_;
}

void FakeEngineControl::open_gate() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    gate_closed_ = false;
  }
  cv_.notify_all();
}

void FakeEngineControl::allow_steps(int n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    allowed_ += n;
  }
  cv_.notify_all();
}

bool FakeEngineControl::wait_steps_started(int n) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, kWaitLimit, [&] { return started_ >= n; });
}

bool FakeEngineControl::wait_generations(int n) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, kWaitLimit, [&] { return generations_ >= n; });
}

void FakeEngineControl::hold_decode() {
  std::lock_guard<std::mutex> lock(mu_);
  decode_held_ = true;
}

void FakeEngineControl::release_decode() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    decode_held_ = false;
  }
  cv_.notify_all();
}

bool FakeEngineControl::wait_decodes(int n) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, kWaitLimit, [&] { return decodes_ >= n; });
}

void FakeEngineControl::in_decode() {
  std::unique_lock<std::mutex> lock(mu_);
  ++decodes_;
  cv_.notify_all();
  cv_.wait(lock, [&] { return !decode_held_; });
}

void FakeEngineControl::hold_load() {
  std::lock_guard<std::mutex> lock(mu_);
  load_held_ = true;
}

void FakeEngineControl::release_load() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    load_held_ = false;
  }
  cv_.notify_all();
}

void FakeEngineControl::fail_load(absl::Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  load_status_ = std::move(status);
}

int FakeEngineControl::steps_started() const {
  std::lock_guard<std::mutex> lock(mu_);
  return started_;
}

int FakeEngineControl::steps_finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

int FakeEngineControl::decodes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return decodes_;
}

int FakeEngineControl::generations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generations_;
}

std::vector<uint64_t> FakeEngineControl::seeds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seeds_;
}

absl::Status FakeEngineControl::before_step() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !gate_closed_ || started_ < allowed_; });
  ++started_;
  cv_.notify_all();
  const std::optional<InjectedFault> fault = std::exchange(pending_fault_, std::nullopt);
  if (!fault) return absl::OkStatus();
  switch (*fault) {
    case InjectedFault::kDeviceOutOfMemory:
      return absl::ResourceExhaustedError(
          "out of device memory: cannot allocate 1099511627776 bytes for [1] (fake)");
    case InjectedFault::kIllegalAddress:
      device_broken_ = true;
      return absl::InternalError("synchronize: cudaErrorIllegalAddress (fake)");
    case InjectedFault::kHang: {
      const double seconds = hang_seconds_;
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

void FakeEngineControl::inject(InjectedFault fault, double hang_seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_fault_ = fault;
  hang_seconds_ = hang_seconds;
  ++faults_injected_;
}

bool FakeEngineControl::device_broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_broken_;
}

int FakeEngineControl::faults_injected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return faults_injected_;
}

void FakeEngineControl::after_step() {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_;
  cv_.notify_all();
}

std::vector<std::vector<RgbImage>> FakeEngineControl::references() const {
  std::lock_guard<std::mutex> lock(mu_);
  return references_;
}

void FakeEngineControl::on_generate(const GenerateParams& params) {
  std::lock_guard<std::mutex> lock(mu_);
  ++generations_;
  seeds_.push_back(params.seed);
  references_.push_back(params.references);
  cv_.notify_all();
}

absl::Status FakeEngineControl::wait_load() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !load_held_; });
  return load_status_;
}

EngineFactory fake_engine_factory(std::shared_ptr<FakeEngineControl> control) {
  return [control]() -> absl::StatusOr<std::unique_ptr<Engine>> {
    absl::Status loaded = control->wait_load();
    if (!loaded.ok()) return loaded;
    return std::unique_ptr<Engine>(new FakeEngine(control));
  };
}

}  // namespace flux2::server::testing
