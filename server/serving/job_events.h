// One job's event stream, the only way a front end hears from a job: progress after each
// denoising step and each image as soon as it is encoded (when the front end asked for them), then
// `done` exactly once, last. The worker and the encoder push; the front end is woken after each
// push and drains with next() (the gRPC reactors write one message per event, the HTTP API one
// server-sent event). Thread-safe. Tested by tests/server/job_queue_test.cc.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>

#include "absl/status/status.h"
#include "server/serving/job.h"

namespace flux2::server {

struct JobEvent {
  enum class Kind : uint8_t {
    kProgress,  // `progress`: a denoising step finished
    kImage,     // `image`, `image_index`: an image was encoded (its bytes are here, not in done)
    kDone,      // `status`, `result`: the job ended; nothing follows
  };
  Kind kind = Kind::kProgress;
  ProgressEvent progress;
  EncodedImage image;
  int image_index = 0;
  absl::Status status;
  JobResult result;
};

class JobEvents {
 public:
  // What the front end wants besides `done`: progress events (streams), and each image in its
  // own event (then done's result holds the images' metadata without their bytes).
  struct Wants {
    bool progress = false;
    bool images = false;
  };
  // `wake` runs after every push, outside the stream's lock, on the pushing thread (the worker,
  // the encoder, or whichever thread finished the job); it should only schedule the drain.
  JobEvents(Wants wants, std::function<void()> wake);

  const Wants& wants() const { return wants_; }
  void push(JobEvent event);
  // The oldest event not yet taken; nullopt when none waits.
  std::optional<JobEvent> next();
  // True once `done` was pushed (it may still wait in the stream).
  bool done() const;

 private:
  const Wants wants_;
  const std::function<void()> wake_;
  mutable std::mutex mu_;
  std::deque<JobEvent> events_;  // guarded by mu_
  bool done_ = false;            // guarded by mu_
};

}  // namespace flux2::server
