// The server's one model thread and the queue in front of it. Each request becomes n rows (one
// per choice); the thread takes the oldest row and every queued row with the same temperature and
// top_p (greedy rows all share one batch), up to max_batch rows, waiting up to batch_window for
// more to arrive, and runs them as one left-padded model::Generate call. Rows keep their own
// seeds (row_seeds: the request's seed + the choice's index, else a random one), so a row's tokens
// do not depend on the batch it ran in; the batch runs to its longest max_tokens and each row is
// cut to its own.
//
// Thread-safe: Submit from any thread (the HTTP handlers). The destructor fails what is queued
// with CANCELLED and joins the thread.
#ifndef TRAINCTL_WORKER_TRAINER_SERVE_GENERATION_QUEUE_H_
#define TRAINCTL_WORKER_TRAINER_SERVE_GENERATION_QUEUE_H_

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

namespace trainctl::serve {

struct GenerationQueueOptions {
  int64_t max_batch = 16;                               // rows per Generate call, >= 1
  absl::Duration batch_window = absl::Milliseconds(2);  // wait for more rows after the first
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = 0;
};

struct Choice {
  std::vector<int64_t> tokens;  // the new tokens, eos included when it ended with one
  bool eos = false;             // ended with an eos id (else cut at max_tokens)
};

struct QueueStats {
  int64_t generate_calls = 0;
  int64_t rows = 0;             // rows generated, over all calls
  int64_t largest_batch = 0;    // most rows in one call
  int64_t multi_row_calls = 0;  // calls with more than one row
};

class GenerationQueue {
 public:
  // `model` (eval mode, on its device) is used only by the queue's thread from now on.
  GenerationQueue(std::shared_ptr<model::Qwen2VLForConditionalGeneration> model,
                  GenerationQueueOptions options);
  ~GenerationQueue();
  GenerationQueue(const GenerationQueue&) = delete;
  GenerationQueue& operator=(const GenerationQueue&) = delete;

  // Queues `sampling.n` rows of `prompt`. The future holds the n choices in order, or the
  // generator's error (INVALID_ARGUMENT for inputs the model rejects), or CANCELLED at shutdown.
  std::future<absl::StatusOr<std::vector<Choice>>> Submit(std::shared_ptr<const ChatPrompt> prompt,
                                                          const SamplingParams& sampling);

  QueueStats stats() const;

 private:
  struct Job;
  struct Row {
    std::shared_ptr<Job> job;
    int64_t index = 0;
    uint64_t seed = 0;
  };

  void Loop();
  // Takes the next batch off the queue (empty when stopping).
  std::vector<Row> NextBatch();
  void RunBatch(const std::vector<Row>& rows);

  const std::shared_ptr<model::Qwen2VLForConditionalGeneration> model_;
  const GenerationQueueOptions options_;
  mutable absl::Mutex mu_;
  std::deque<Row> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  QueueStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: started once everything above is set
};

}  // namespace trainctl::serve

#endif  // TRAINCTL_WORKER_TRAINER_SERVE_GENERATION_QUEUE_H_
