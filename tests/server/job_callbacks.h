// For the job tests: a job event stream (server/serving/job_events.h) that calls plain callbacks
// with each progress event and with the outcome, on the thread that pushed it (the worker, the
// encoder or whoever finished the job). Used by job_queue_test.cc and engine_worker_test.cc.
#pragma once

#include <functional>
#include <memory>
#include <utility>

#include "server/serving/job_events.h"

namespace flux2::server::testing {

using ProgressCallback = std::function<void(const ProgressEvent&)>;
using DoneCallback = std::function<void(const absl::Status&, JobResult&&)>;

inline std::shared_ptr<JobEvents> callback_events(ProgressCallback on_progress,
                                                  DoneCallback on_done) {
  // The stream's wake-up drains the stream itself, which exists only once constructed.
  auto self = std::make_shared<std::weak_ptr<JobEvents>>();
  auto events = std::make_shared<JobEvents>(
      JobEvents::Wants{.progress = on_progress != nullptr}, [self, on_progress, on_done] {
        const std::shared_ptr<JobEvents> stream = self->lock();
        if (!stream) return;
        while (std::optional<JobEvent> event = stream->next()) {
          if (event->kind == JobEvent::Kind::kProgress && on_progress) on_progress(event->progress);
          if (event->kind == JobEvent::Kind::kDone && on_done) {
            on_done(event->status, std::move(event->result));
          }
        }
      });
  *self = events;
  return events;
}

}  // namespace flux2::server::testing
