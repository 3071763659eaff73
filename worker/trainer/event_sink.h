// EventSink: how the trainer reports to whoever runs it. Events are JSON objects with a `type`
// (metric | checkpoint | topology | bandwidth | warning | status), written one per line to the fd
// named by TRAINCTL_EVENT_FD (the worker's pipe) or to a file when the trainer runs alone.
#ifndef TRAINCTL_WORKER_TRAINER_EVENT_SINK_H_
#define TRAINCTL_WORKER_TRAINER_EVENT_SINK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"

namespace trainctl::trainer {

class EventSink {
 public:
  virtual ~EventSink() = default;
  // Adds "type" and "time" (unix seconds, float) and writes one line. A sink that cannot write
  // (the worker went away) drops events: training does not stop for its reporting channel.
  virtual void Emit(const std::string& type, nlohmann::json fields) = 0;
};

// Writes JSON lines to a file descriptor it does not own, or to a file it opens. Thread-safe.
class JsonLinesEventSink final : public EventSink {
 public:
  // To `event_fd` (the worker's pipe, RankEnv::event_fd) when it is >= 0, else appends to
  // `fallback_path` (creating it), else to stderr when `fallback_path` is empty.
  static absl::StatusOr<std::unique_ptr<JsonLinesEventSink>> Open(int event_fd,
                                                                  const std::string& fallback_path);
  ~JsonLinesEventSink() override;

  void Emit(const std::string& type, nlohmann::json fields) override;

 private:
  JsonLinesEventSink(int fd, bool owned) : fd_(fd), owned_(owned) {}
  absl::Mutex mu_;
  const int fd_;
  const bool owned_;
};

// Passes every event on to `inner` and prints a human-readable line for the ones people read in a
// rank's log (metric, checkpoint, status, warning) to stdout, as the HF Trainer's console does.
// Thread-safe if `inner` is.
class ConsoleEchoEventSink final : public EventSink {
 public:
  explicit ConsoleEchoEventSink(EventSink* inner) : inner_(inner) {}
  void Emit(const std::string& type, nlohmann::json fields) override;

  // The line printed for an event, "" for none (for tests).
  static std::string Format(const std::string& type, const nlohmann::json& fields);

 private:
  EventSink* const inner_;
  absl::Mutex mu_;
};

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_EVENT_SINK_H_
