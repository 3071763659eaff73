// The sequences the server's model thread is decoding together, for iteration-level
// (continuous) batching: rows join between decoding steps (their prompts prefilled together,
// then merged into the running KV cache) and leave between steps (finished, cancelled, expired),
// so a short request never waits for a long one to end.
//
// One KV cache holds every row, [rows, Hkv, capacity, D] per layer, with one write position for
// all rows (the model's fixed-shape DecodeStepAt). A row's tokens are right-aligned at the
// cache's length when it joins, as left padding would place them, and masked out before that:
//
//   running rows, length S; newcomers prefilled alone to their padded length L:
//   M = max(S, L) is the new length; old rows move right by M - S, newcomers by M - L;
//   each row's rope delta drops by its move, so its next token still gets rotary position
//   (its own length) + (its own delta), exactly as when it runs alone.
//
// Keys are cached after rotary embedding, so moving a row's keys never touches its positions.
// The step attends over the whole capacity under the mask, so a row's attention sees its own
// tokens only, and greedy tokens do not depend on which rows share the batch (serve_test checks
// a request joining a running batch against Generate alone). When rows leave, the columns no
// remaining row uses are cut from the left once they are half the cache, and the capacity
// doubles when full.
//
// Sampling is per row (temperature, top_p, its own seeded generator: one uniform draw per token,
// inverse transform over the float64 cumulative distribution, as model::Generate), so rows of
// different sampling settings share a step; temperature 0 is greedy (argmax).
//
// Not thread-safe: the model thread alone uses it.
#ifndef TRAINCTL_WORKER_TRAINER_SERVE_RUNNING_BATCH_H_
#define TRAINCTL_WORKER_TRAINER_SERVE_RUNNING_BATCH_H_

#include <ATen/core/Generator.h>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/serve/chat_request.h"

namespace trainctl::serve {

struct NewRow {
  std::shared_ptr<const ChatPrompt> prompt;
  double temperature = 0;  // 0: greedy
  double top_p = 1;
  int64_t max_tokens = 1;
  uint64_t seed = 0;
};

struct BatchRow {
  double temperature = 0;
  double top_p = 1;
  int64_t max_tokens = 1;
  at::Generator generator;
  std::vector<int64_t> tokens;  // generated so far, eos included
  bool eos = false;             // ended with an eos id
  bool finished = false;        // eos, or max_tokens reached
  int64_t first = 0;            // cache position of the row's first prompt token
};

class RunningBatch {
 public:
  // `model` (eval mode, on its device) is used from the calling thread only.
  RunningBatch(std::shared_ptr<model::Qwen2VLForConditionalGeneration> model,
               std::vector<int64_t> eos_token_ids, int64_t pad_token_id);

  // Prefills `rows` in one left-padded call (images included), samples each one's first token
  // and appends the rows after the running ones. INTERNAL when the model throws (LibTorch or
  // allocator errors); the running rows are then untouched and no row is added.
  absl::Status Join(const std::vector<NewRow>& rows);

  // One decoding step: every unfinished row's last token in, its next token out. INTERNAL when
  // the model throws; the batch must then be Clear()ed.
  absl::Status Step();

  // Keeps the rows whose `keep` entry is true (keep.size() == size()), in order.
  void Retain(const std::vector<bool>& keep);
  void Clear();

  const std::vector<BatchRow>& rows() const { return rows_; }
  int64_t size() const { return static_cast<int64_t>(rows_.size()); }
  int64_t cache_length() const { return cache_.length; }

 private:
  // Appends `added`, prefilled into `fresh` to length `seq`, to the running cache (see above).
  void Merge(model::KvCache& fresh, int64_t seq, std::vector<BatchRow>& added);
  // Cuts the columns before every row's first token once they are half the cache.
  void Compact();
  // The next token of each row from its logits [B, vocab].
  std::vector<int64_t> Sample(const torch::Tensor& logits, std::vector<BatchRow>& rows) const;
  // Appends `token` to `row`, finishing it at an eos id or max_tokens.
  void Push(BatchRow& row, int64_t token) const;
  int64_t capacity() const;

  const std::shared_ptr<model::Qwen2VLForConditionalGeneration> model_;
  const std::vector<int64_t> eos_token_ids_;
  const int64_t pad_token_id_;
  model::KvCache cache_;
  std::vector<BatchRow> rows_;
};

}  // namespace trainctl::serve

#endif  // TRAINCTL_WORKER_TRAINER_SERVE_RUNNING_BATCH_H_
