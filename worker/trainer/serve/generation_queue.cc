#include "worker/trainer/serve/generation_queue.h"

#include <torch/torch.h>

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/trainer/data/batch.h"
#include "worker/trainer/model/generation.h"

namespace trainctl::serve {

struct GenerationQueue::Job {
  std::shared_ptr<const ChatPrompt> prompt;
  SamplingParams sampling;
  std::vector<Choice> choices;
  int64_t remaining = 0;
  bool done = false;
  std::promise<absl::StatusOr<std::vector<Choice>>> promise;
};

namespace {

// Rows batch together when they sample alike: all greedy rows, or equal temperature and top_p.
bool SameSampling(const SamplingParams& a, const SamplingParams& b) {
  if (a.temperature == 0 || b.temperature == 0) return a.temperature == b.temperature;
  return a.temperature == b.temperature && a.top_p == b.top_p;
}

}  // namespace

GenerationQueue::GenerationQueue(std::shared_ptr<model::Qwen2VLForConditionalGeneration> model,
                                 GenerationQueueOptions options)
    : model_(std::move(model)), options_(std::move(options)), thread_([this] { Loop(); }) {}

GenerationQueue::~GenerationQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
  absl::MutexLock lock(&mu_);
  for (Row& row : queue_) {
    if (row.job->done) continue;
    row.job->done = true;
    row.job->promise.set_value(absl::CancelledError("the server is shutting down"));
  }
}

std::future<absl::StatusOr<std::vector<Choice>>> GenerationQueue::Submit(
    std::shared_ptr<const ChatPrompt> prompt, const SamplingParams& sampling) {
  auto job = std::make_shared<Job>();
  job->prompt = std::move(prompt);
  job->sampling = sampling;
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
  for (int64_t i = 0; i < sampling.n; ++i) {
    queue_.push_back(Row{job, i, base + static_cast<uint64_t>(i)});
  }
  return future;
}

QueueStats GenerationQueue::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

std::vector<GenerationQueue::Row> GenerationQueue::NextBatch() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](GenerationQueue* q)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) { return q->stopping_ || !q->queue_.empty(); },
      this));
  if (stopping_) return {};
  const SamplingParams first = queue_.front().job->sampling;
  if (options_.batch_window > absl::ZeroDuration()) {
    struct Wait {
      GenerationQueue* queue;
      const SamplingParams* first;
    } wait{this, &first};
    auto ready = +[](Wait* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      const auto& q = w->queue->queue_;
      const auto matching = std::count_if(q.begin(), q.end(), [w](const Row& r) {
        return SameSampling(r.job->sampling, *w->first);
      });
      return w->queue->stopping_ || matching >= w->queue->options_.max_batch;
    };
    mu_.AwaitWithTimeout(absl::Condition(ready, &wait), options_.batch_window);
    if (stopping_) return {};
  }
  std::vector<Row> batch;
  for (auto it = queue_.begin();
       it != queue_.end() && static_cast<int64_t>(batch.size()) < options_.max_batch;) {
    if (SameSampling(it->job->sampling, first)) {
      batch.push_back(std::move(*it));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  stats_.generate_calls += 1;
  stats_.rows += static_cast<int64_t>(batch.size());
  stats_.largest_batch = std::max<int64_t>(stats_.largest_batch, batch.size());
  stats_.multi_row_calls += batch.size() > 1;
  return batch;
}

void GenerationQueue::Loop() {
  for (;;) {
    std::vector<Row> batch = NextBatch();
    if (batch.empty()) return;
    RunBatch(batch);
  }
}

void GenerationQueue::RunBatch(const std::vector<Row>& rows) {
  std::vector<std::vector<int64_t>> prompts;
  std::vector<torch::Tensor> pixels;
  std::vector<int64_t> grids;
  model::GenerationOptions options;
  const SamplingParams& sampling = rows.front().job->sampling;
  options.temperature = sampling.temperature;
  options.top_p = sampling.top_p;
  options.eos_token_ids = options_.eos_token_ids;
  options.pad_token_id = options_.pad_token_id;
  for (const Row& row : rows) {
    const ChatPrompt& p = *row.job->prompt;
    prompts.push_back(p.ids);
    if (!p.grid_thw.empty()) {
      const int64_t patches = static_cast<int64_t>(p.pixel_values.size()) / data::kPatchDim;
      pixels.push_back(torch::from_blob(const_cast<float*>(p.pixel_values.data()),
                                        {patches, data::kPatchDim}, torch::kFloat32));
      grids.insert(grids.end(), p.grid_thw.begin(), p.grid_thw.end());
    }
    options.row_seeds.push_back(row.seed);
    options.max_new_tokens = std::max(options.max_new_tokens, row.job->sampling.max_tokens);
  }
  absl::StatusOr<model::GenerationOutput> out = absl::InternalError("not run");
  try {
    absl::StatusOr<model::ModelInputs> inputs =
        model::LeftPadPrompts(prompts, options_.pad_token_id);
    if (!inputs.ok()) {
      out = inputs.status();
    } else {
      const torch::Device device = model_->parameters().front().device();
      inputs->input_ids = inputs->input_ids.to(device);
      inputs->attention_mask = inputs->attention_mask.to(device);
      if (!pixels.empty()) {
        inputs->pixel_values = torch::cat(pixels, 0).to(device);
        inputs->image_grid_thw = torch::tensor(grids, torch::kInt64)
                                     .view({static_cast<int64_t>(grids.size()) / 3, 3})
                                     .to(device);
      }
      out = model::Generate(*model_, *inputs, options);
    }
  } catch (const std::exception& e) {
    out = absl::InternalError(absl::StrCat("generation failed: ", e.what()));
  }
  for (size_t b = 0; b < rows.size(); ++b) {
    Job& job = *rows[b].job;
    if (job.done) continue;
    if (!out.ok()) {
      job.done = true;
      job.promise.set_value(out.status());
      continue;
    }
    Choice& choice = job.choices[static_cast<size_t>(rows[b].index)];
    choice.tokens = out->tokens[b];
    choice.eos = out->stopped[b];
    if (static_cast<int64_t>(choice.tokens.size()) > job.sampling.max_tokens) {
      choice.tokens.resize(static_cast<size_t>(job.sampling.max_tokens));
      choice.eos = false;
    }
    if (--job.remaining == 0) {
      job.done = true;
      job.promise.set_value(std::move(job.choices));
    }
  }
}

}  // namespace trainctl::serve
