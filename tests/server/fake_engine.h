// A fake Engine for the server tests: no model, deterministic pixels from the seed, and steps that
// can be held at a gate by the test, so queueing, cancellation, deadlines and drain are tested by
// ordering instead of by timing. Used by tests/server/*_test.cc (not by the end-to-end tests).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "server/serving/engine.h"

namespace flux2::server::testing {

// Shared between the test and the engine (the engine lives on the worker thread).
class FakeEngineControl {
 public:
  // Gate: while closed, a step may start only when fewer than `allowed` steps have started.
  void close_gate();
  void open_gate();
  void allow_steps(int n);  // lets n more steps start (gate closed)
  // Blocks until `n` steps in total have started (true) or 60 s passed (false).
  bool wait_steps_started(int n);
  // Blocks until `n` generate() calls in total have begun (true) or 60 s passed (false).
  bool wait_generations(int n);
  // Decode: after the last step and the check before the decode (as the real pipeline's), a
  // generation waits here while the decode is held, so a cancel or deadline can land mid-decode.
  void hold_decode();
  void release_decode();
  // Blocks until `n` decodes in total have begun (true) or 60 s passed (false).
  bool wait_decodes(int n);
  // Load: while held, the factory blocks (simulates loading weights).
  void hold_load();
  void release_load();
  void fail_load(absl::Status status);

  // Faults (Engine::inject_fault, which --test-inject-fault calls): the next step fails with
  // out of device memory (RESOURCE_EXHAUSTED), fails with an illegal address (INTERNAL) after
  // which device_status() stays INTERNAL, or sleeps hang_seconds.
  void inject(InjectedFault fault, double hang_seconds);
  bool device_broken() const;
  int faults_injected() const;

  int steps_started() const;
  int steps_finished() const;
  int generations() const;
  int decodes() const;
  // Seeds of every generate() call, in order (including the warm-up).
  std::vector<uint64_t> seeds() const;
  // The references of every generate() call, in order (including the warm-up).
  std::vector<std::vector<RgbImage>> references() const;

  // Engine side.
  // Waits at the gate, counts the start, then plays an injected fault (non-OK: the step's error).
  absl::Status before_step();
  void after_step();
  void in_decode();  // counts the decode, waits while it is held
  void on_generate(const GenerateParams& params);
  absl::Status wait_load();

  bool uses_cfg = false;
  int default_steps = 4;
  // Describe FLUX.2-dev instead of klein (variant "dev", Flux2Pipeline, embedded guidance, no
  // CFG, 50 default steps; uses_cfg and default_steps are then ignored), its text encoder
  // streamed from host memory when text_encoder_streamed.
  bool dev = false;
  bool text_encoder_streamed = false;
  // The prompt cache the engine reports (PipelineInfo::prompt_cache_bytes). Non-zero: a prompt
  // already generated (the warm-up's included) is a prompt_cache_hit, as the real pipeline's LRU
  // (which never evicts the few prompts of a test); 0: every generation is a miss.
  int64_t prompt_cache_bytes = kDefaultPromptCacheBytes;
  // The transformer shapes LoRA adapters are parsed against (Engine::lora_config); none: the
  // engine takes no adapters. Generations ignore the adapters.
  std::optional<Flux2Config> lora_config;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool gate_closed_ = false;
  int allowed_ = 0;
  int started_ = 0;
  int finished_ = 0;
  int generations_ = 0;
  std::vector<uint64_t> seeds_;
  std::vector<std::vector<RgbImage>> references_;
  bool decode_held_ = false;
  int decodes_ = 0;
  bool load_held_ = false;
  std::optional<InjectedFault> pending_fault_;
  double hang_seconds_ = 0.0;
  bool device_broken_ = false;
  int faults_injected_ = 0;
  absl::Status load_status_;
};

// Pixels: rgb[(y * W + x) * 3 + c] = (seed * 31 + x * 7 + y * 13 + c * 101) mod 256. A generation
// with references reports kFakeReferenceEncodeSeconds per reference as its reference_encode time.
inline constexpr double kFakeReferenceEncodeSeconds = 4e-3;
uint8_t fake_pixel(uint64_t seed, int64_t x, int64_t y, int c);

// A factory producing a FakeEngine bound to `control` (which must outlive it).
EngineFactory fake_engine_factory(std::shared_ptr<FakeEngineControl> control);

}  // namespace flux2::server::testing
