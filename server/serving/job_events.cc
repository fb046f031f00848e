// A job's event stream; see job_events.h. Tested by tests/server/job_queue_test.cc.
#include "server/serving/job_events.h"

#include <utility>

namespace flux2::server {

JobEvents::JobEvents(Wants wants, std::function<void()> wake)
    : wants_(wants), wake_(std::move(wake)) {}

void JobEvents::push(JobEvent event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;  // nothing follows done
    done_ = event.kind == JobEvent::Kind::kDone;
    events_.push_back(std::move(event));
  }
  if (wake_) wake_();
}

std::optional<JobEvent> JobEvents::next() {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.empty()) return std::nullopt;
  JobEvent event = std::move(events_.front());
  events_.pop_front();
  return event;
}

bool JobEvents::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

}  // namespace flux2::server
