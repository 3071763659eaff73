// The server's one model thread and the queue in front of it, batching at each decoding step
// (running_batch.h): each request becomes n rows (one per choice); between two steps, rows that
// finished, whose request was cancelled (the client went away) or ran past its deadline leave
// the running batch, and queued rows join it (prefilled together, up to max_batch rows in all),
// whatever their sampling settings. A short request thus completes while a long one is still
// generating. The last quarter of max_batch is kept for requests with no row running yet, so a
// request with a large n does not fill the batch (its other rows join as slots free up). While
// nothing runs, the thread waits up to batch_window after the first row for more to arrive, so a
// burst starts as one batch. Rows keep their own seeds (the request's seed + the choice's index,
// else a random one), so a row's tokens do not depend on the batch it ran in.
//
// Thread-safe: Submit from any thread (the HTTP handlers). Shutdown() (and the destructor) fails
// what is queued or running with UNAVAILABLE at the next step and ends the thread.
#ifndef TRAINCTL_WORKER_TRAINER_SERVE_GENERATION_QUEUE_H_
#define TRAINCTL_WORKER_TRAINER_SERVE_GENERATION_QUEUE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/serve/chat_request.h"
#include "worker/trainer/serve/running_batch.h"

namespace trainctl::serve {

struct GenerationQueueOptions {
  int64_t max_batch = 16;                               // rows decoding together, >= 1
  absl::Duration batch_window = absl::Milliseconds(2);  // wait for more rows after the first
  // From Submit to the last token; a request past it fails with DEADLINE_EXCEEDED.
  absl::Duration request_timeout = absl::InfiniteDuration();
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = 0;
};

struct Choice {
  std::vector<int64_t> tokens;  // the new tokens, eos included when it ended with one
  bool eos = false;             // ended with an eos id (else cut at max_tokens)
};

struct QueueStats {
  int64_t generate_calls = 0;   // prefill calls (rows joining the running batch together)
  int64_t rows = 0;             // rows admitted, over all calls
  int64_t largest_batch = 0;    // most rows decoding together
  int64_t multi_row_calls = 0;  // prefill calls with more than one row
  int64_t decode_steps = 0;
  int64_t row_steps = 0;       // rows over all decoding steps (/ decode_steps: mean batch)
  int64_t cancelled_rows = 0;  // left because the client went away
  int64_t expired_rows = 0;    // left at their deadline
};

class GenerationQueue {
 public:
  // `model` (eval mode, on its device) is used only by the queue's thread from now on.
  GenerationQueue(std::shared_ptr<model::Qwen2VLForConditionalGeneration> model,
                  GenerationQueueOptions options);
  ~GenerationQueue();
  GenerationQueue(const GenerationQueue&) = delete;
  GenerationQueue& operator=(const GenerationQueue&) = delete;

  // Queues `sampling.n` rows of `prompt`. The future holds the n choices in order, or INTERNAL
  // when the model throws (a LibTorch or allocator error), DEADLINE_EXCEEDED past the request
  // timeout, CANCELLED once `cancelled` is set (checked at every step), UNAVAILABLE at shutdown.
  std::future<absl::StatusOr<std::vector<Choice>>> Submit(
      std::shared_ptr<const ChatPrompt> prompt, const SamplingParams& sampling,
      std::shared_ptr<const std::atomic<bool>> cancelled = nullptr);

  // Fails every queued and running request with UNAVAILABLE at the model thread's next step
  // boundary and ends the thread; later Submits fail at once. Idempotent.
  void Shutdown();

  QueueStats stats() const;
  // Rows decoding now, and rows waiting to join (GET /health reports both).
  int64_t running_rows() const;
  int64_t queued_rows() const;

 private:
  struct Job;
  struct Row {
    std::shared_ptr<Job> job;
    int64_t index = 0;
    uint64_t seed = 0;
  };

  void Loop();
  // The rows joining a batch of `running` rows (waiting for the first when none runs); false
  // when stopping. Fails queued rows that were cancelled or expired.
  bool Admit(int64_t running, std::vector<Row>& joining);
  // Prefills `joining` into the batch, or fails their requests.
  void Join(RunningBatch& batch, std::vector<Row>& active, std::vector<Row>& joining);
  // Removes finished, failed, cancelled and expired rows, completing or failing their requests.
  void Retire(RunningBatch& batch, std::vector<Row>& active);

  const std::shared_ptr<model::Qwen2VLForConditionalGeneration> model_;
  const GenerationQueueOptions options_;
  mutable absl::Mutex mu_;
  std::deque<Row> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  QueueStats stats_ ABSL_GUARDED_BY(mu_);
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: started once everything above is set
};

}  // namespace trainctl::serve

#endif  // TRAINCTL_WORKER_TRAINER_SERVE_GENERATION_QUEUE_H_
