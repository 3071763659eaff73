// What `trainctl watch` knows of a job while it follows the job's events: the live progress line's
// figures and the summary printed at the end. Pure (the caller passes the time); not thread-safe.
#ifndef TRAINCTL_CLI_WATCH_VIEW_H_
#define TRAINCTL_CLI_WATCH_VIEW_H_

#include <optional>
#include <string>

#include "absl/time/time.h"
#include "cli/progress_line.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::cli {

class WatchView {
 public:
  // `job` as GetJob returned it when the watch began.
  explicit WatchView(const trainctl::v1::Job& job);

  // Folds in one event (replayed or live). Returns whether it deserves a line of its own on a
  // terminal (everything but metric samples, which only update the live line).
  bool OnEvent(const trainctl::v1::JobEvent& event);
  // A fresher copy of the job (its ETA comes from the coordinator), fetched at `now`.
  void OnJob(const trainctl::v1::Job& job, absl::Time now);

  // The live line's figures at `now`: the ETA counts down from the coordinator's last estimate.
  ProgressView View(absl::Time now) const;
  // One line for the end: "job-3 succeeded after 4m12s: step 300/300, loss 2.301 -> 0.1234,
  // 0.84 s/step". A failed or cancelled job's message follows its state.
  std::string Summary(absl::Time now) const;

  trainctl::v1::JobState state() const { return state_; }

 private:
  std::string id_;
  trainctl::v1::JobState state_;
  std::string message_;
  std::string stage_;
  int64_t step_ = 0;
  int64_t total_steps_ = 0;
  std::optional<double> first_loss_, loss_;
  double tokens_per_second_ = 0;
  double step_time_ = 0;
  std::optional<absl::Time> start_, end_;
  // The coordinator's ETA and when we learned it (our clock, so a skewed one does not matter).
  double eta_seconds_ = 0;
  std::optional<absl::Time> eta_at_;
  google::protobuf::Timestamp eta_sample_time_;
};

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_WATCH_VIEW_H_
