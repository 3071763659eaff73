#include "worker/trainer/serve/generation_queue.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace trainctl::serve {

struct GenerationQueue::Job {
  std::shared_ptr<const ChatPrompt> prompt;
  SamplingParams sampling;
  std::shared_ptr<const std::atomic<bool>> cancelled;  // may be null
  absl::Time deadline = absl::InfiniteFuture();
  std::vector<Choice> choices;
  int64_t remaining = 0;
  int64_t running = 0;  // rows in the batch or joining it (model thread only)
  bool done = false;
  std::promise<absl::StatusOr<std::vector<Choice>>> promise;

  void Fail(const absl::Status& status) {
    if (done) return;
    done = true;
    promise.set_value(status);
  }
  bool Cancelled() const { return cancelled != nullptr && cancelled->load(); }
};

namespace {

absl::Status ShuttingDown() { return absl::UnavailableError("the server is shutting down"); }

}  // namespace

GenerationQueue::GenerationQueue(std::shared_ptr<model::Qwen2VLForConditionalGeneration> model,
                                 GenerationQueueOptions options)
    : model_(std::move(model)), options_(std::move(options)), thread_([this] { Loop(); }) {}

GenerationQueue::~GenerationQueue() {
  Shutdown();
  thread_.join();
  absl::MutexLock lock(&mu_);
  for (Row& row : queue_) row.job->Fail(ShuttingDown());
  queue_.clear();
}

void GenerationQueue::Shutdown() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

std::future<absl::StatusOr<std::vector<Choice>>> GenerationQueue::Submit(
    std::shared_ptr<const ChatPrompt> prompt, const SamplingParams& sampling,
    std::shared_ptr<const std::atomic<bool>> cancelled) {
  auto job = std::make_shared<Job>();
  job->prompt = std::move(prompt);
  job->sampling = sampling;
  job->cancelled = std::move(cancelled);
  job->deadline = absl::Now() + options_.request_timeout;
  job->choices.resize(static_cast<size_t>(sampling.n));
  job->remaining = sampling.n;
  auto future = job->promise.get_future();
  uint64_t base = 0;
  if (sampling.seed) {
    base = *sampling.seed;
  } else {
    std::random_device device;
    base = (uint64_t{device()} << 32) ^ device();
  }
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    job->Fail(ShuttingDown());
    return future;
  }
  for (int64_t i = 0; i < sampling.n; ++i) {
    queue_.push_back(Row{job, i, base + static_cast<uint64_t>(i)});
  }
  return future;
}

QueueStats GenerationQueue::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

int64_t GenerationQueue::running_rows() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

int64_t GenerationQueue::queued_rows() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

bool GenerationQueue::Admit(int64_t running, std::vector<Row>& joining) {
  absl::MutexLock lock(&mu_);
  running_ = running;
  if (running == 0) {
    mu_.Await(absl::Condition(
        +[](GenerationQueue* q)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) { return q->stopping_ || !q->queue_.empty(); },
        this));
    if (!stopping_ && options_.batch_window > absl::ZeroDuration()) {
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](GenerationQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) {
                                 return q->stopping_ || static_cast<int64_t>(q->queue_.size()) >=
                                                            q->options_.max_batch;
                               },
                               this),
                           options_.batch_window);
    }
  }
  if (stopping_) return false;
  const absl::Time now = absl::Now();
  for (auto it = queue_.begin(); it != queue_.end();) {
    Job& job = *it->job;
    if (job.Cancelled()) {
      job.Fail(absl::CancelledError("the client closed the connection"));
      stats_.cancelled_rows += 1;
    } else if (now >= job.deadline) {
      job.Fail(absl::DeadlineExceededError(absl::StrCat(
          "the request waited past the server's request timeout (",
          absl::FormatDuration(options_.request_timeout), ", --request_timeout_s) in the queue")));
      stats_.expired_rows += 1;
    }
    it = job.done ? queue_.erase(it) : std::next(it);
  }
  // The last quarter of the batch is for requests with no row running yet, so one request's
  // many rows (a large n) cannot fill the batch and hold a short request back until they end.
  const int64_t reserved = options_.max_batch / 4;
  int64_t total = running;
  for (auto it = queue_.begin(); it != queue_.end() && total < options_.max_batch;) {
    if (it->job->running > 0 && total >= options_.max_batch - reserved) {
      ++it;
      continue;
    }
    it->job->running += 1;
    total += 1;
    joining.push_back(std::move(*it));
    it = queue_.erase(it);
  }
  if (!joining.empty()) {
    stats_.generate_calls += 1;
    stats_.rows += static_cast<int64_t>(joining.size());
    stats_.multi_row_calls += joining.size() > 1;
    stats_.largest_batch =
        std::max<int64_t>(stats_.largest_batch, running + static_cast<int64_t>(joining.size()));
  }
  return true;
}

void GenerationQueue::Join(RunningBatch& batch, std::vector<Row>& active,
                           std::vector<Row>& joining) {
  std::vector<NewRow> rows;
  for (const Row& row : joining) {
    const SamplingParams& s = row.job->sampling;
    rows.push_back(NewRow{row.job->prompt, s.temperature, s.top_p, s.max_tokens, row.seed});
  }
  const absl::Status status = batch.Join(rows);
  for (Row& row : joining) {
    if (!status.ok()) {
      row.job->running -= 1;
      row.job->Fail(status);
    } else {
      active.push_back(std::move(row));
    }
  }
  joining.clear();
}

void GenerationQueue::Retire(RunningBatch& batch, std::vector<Row>& active) {
  const absl::Time now = absl::Now();
  std::vector<bool> keep(active.size(), true);
  int64_t cancelled = 0, expired = 0;
  for (size_t b = 0; b < active.size(); ++b) {
    Job& job = *active[b].job;
    const BatchRow& row = batch.rows()[b];
    if (job.done) {
      keep[b] = false;
    } else if (row.finished) {
      keep[b] = false;
      Choice& choice = job.choices[static_cast<size_t>(active[b].index)];
      choice.tokens = row.tokens;
      choice.eos = row.eos;
      if (--job.remaining == 0) {
        job.done = true;
        job.promise.set_value(std::move(job.choices));
      }
    } else if (job.Cancelled()) {
      keep[b] = false;
      ++cancelled;
      job.Fail(absl::CancelledError("the client closed the connection"));
    } else if (now >= job.deadline) {
      keep[b] = false;
      ++expired;
      job.Fail(absl::DeadlineExceededError(absl::StrCat(
          "the request ran past the server's request timeout (",
          absl::FormatDuration(options_.request_timeout), ", --request_timeout_s) after ",
          row.tokens.size(), " of ", row.max_tokens, " tokens")));
    }
  }
  batch.Retain(keep);
  std::vector<Row> kept;
  for (size_t b = 0; b < active.size(); ++b) {
    if (keep[b]) {
      kept.push_back(std::move(active[b]));
    } else {
      active[b].job->running -= 1;
    }
  }
  active = std::move(kept);
  absl::MutexLock lock(&mu_);
  stats_.cancelled_rows += cancelled;
  stats_.expired_rows += expired;
  running_ = batch.size();
}

void GenerationQueue::Loop() {
  RunningBatch batch(model_, options_.eos_token_ids, options_.pad_token_id);
  std::vector<Row> active;  // aligned with batch.rows()
  std::vector<Row> joining;
  while (Admit(batch.size(), joining)) {
    if (!joining.empty()) Join(batch, active, joining);
    Retire(batch, active);
    if (batch.size() == 0) continue;
    const int64_t rows = batch.size();
    const absl::Status status = batch.Step();
    if (!status.ok()) {
      for (Row& row : active) row.job->Fail(status);
      active.clear();
      batch.Clear();
    } else {
      absl::MutexLock lock(&mu_);
      stats_.decode_steps += 1;
      stats_.row_steps += rows;
    }
    Retire(batch, active);
  }
  for (Row& row : active) row.job->Fail(ShuttingDown());
  absl::MutexLock lock(&mu_);
  for (Row& row : queue_) row.job->Fail(ShuttingDown());
  queue_.clear();
  running_ = 0;
}

}  // namespace trainctl::serve
