#include "common/data/loader.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/chat_template.h"

namespace trainctl::data {
namespace {

using tokenizer::kIgnoreLabel;

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, n), by rejection so it is unbiased.
uint64_t Below(uint64_t n, uint64_t* state) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = SplitMix64(state);
  } while (x >= limit);
  return x % n;
}

std::vector<int64_t> EpochOrder(int64_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (!shuffle) return order;
  uint64_t state = seed;
  state = SplitMix64(&state) ^ (static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ull);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(Below(static_cast<uint64_t>(i) + 1, &state));
    std::swap(order[i], order[j]);
  }
  return order;
}

}  // namespace

Loader::Loader(std::shared_ptr<const ShardReader> reader, const LoaderOptions& options)
    : reader_(std::move(reader)),
      options_(options),
      pad_token_id_(options.pad_token_id >= 0 ? options.pad_token_id
                                              : reader_->manifest().pad_token_id) {}

absl::StatusOr<std::unique_ptr<Loader>> Loader::Create(std::shared_ptr<const ShardReader> reader,
                                                       const LoaderOptions& options) {
  if (reader == nullptr) return absl::InvalidArgumentError("loader: no shard reader");
  if (options.batch_size < 1 || options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size || options.pack_length < 0 ||
      options.pad_to_multiple_of < 1 || options.prefetch_batches < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loader: need batch_size >= 1, 0 <= rank < world_size, pack_length >= 0, ",
        "pad_to_multiple_of >= 1 and prefetch_batches >= 0; got batch_size ", options.batch_size,
        ", rank ", options.rank, ", world_size ", options.world_size, ", pack_length ",
        options.pack_length, ", pad_to_multiple_of ", options.pad_to_multiple_of,
        ", prefetch_batches ", options.prefetch_batches));
  }
  if (options.pad_token_id < 0 && reader->manifest().pad_token_id < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("loader: ", reader->dir(), " records no pad token id; set pad_token_id"));
  }
  const int64_t n = reader->size();
  if (n == 0) {
    return absl::FailedPreconditionError(absl::StrCat("loader: ", reader->dir(), " is empty"));
  }
  if (options.pack_length == 0 && options.remainder == LoaderOptions::Remainder::kDrop &&
      n < options.world_size) {
    return absl::FailedPreconditionError(absl::StrCat("loader: ", n, " samples cannot give each ",
                                                      "of ", options.world_size,
                                                      " ranks one (use Remainder::kPad)"));
  }
  if (options.pack_length > 0) {
    for (int64_t i = 0; i < n; ++i) {
      if (reader->NumTokens(i) > options.pack_length) {
        return absl::InvalidArgumentError(
            absl::StrCat("loader: sample ", i, " of ", reader->dir(), " has ", reader->NumTokens(i),
                         " tokens, more than pack_length ", options.pack_length,
                         " (prepare with --max_seq_len ", options.pack_length, ")"));
      }
    }
  }
  std::unique_ptr<Loader> loader(new Loader(std::move(reader), options));
  if (options.prefetch_batches > 0) loader->StartPrefetch(LoaderState{});
  return loader;
}

Loader::~Loader() { StopPrefetch(); }

Loader::EpochPlan Loader::Plan(int64_t epoch) const {
  const int64_t n = reader_->size();
  const std::vector<int64_t> order = EpochOrder(n, options_.shuffle, options_.seed, epoch);
  // Units over the whole order: [unit_starts[u], unit_starts[u + 1]) of `order`.
  std::vector<int64_t> unit_starts;
  if (options_.pack_length == 0) {
    unit_starts.resize(static_cast<size_t>(n) + 1);
    std::iota(unit_starts.begin(), unit_starts.end(), 0);
  } else {
    int64_t used = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t len = reader_->NumTokens(order[i]);
      if (i == 0 || used + len > options_.pack_length) {
        unit_starts.push_back(i);
        used = 0;
      }
      used += len;
    }
    unit_starts.push_back(n);
  }
  const int64_t units = static_cast<int64_t>(unit_starts.size()) - 1;
  const int64_t world = options_.world_size;
  const int64_t per_rank = options_.remainder == LoaderOptions::Remainder::kDrop
                               ? units / world
                               : (units + world - 1) / world;
  EpochPlan plan;
  plan.epoch = epoch;
  plan.unit_begin.push_back(0);
  for (int64_t k = 0; k < per_rank; ++k) {
    const int64_t u = (options_.rank + k * world) % units;  // wraps only with kPad
    for (int64_t i = unit_starts[u]; i < unit_starts[u + 1]; ++i) plan.samples.push_back(order[i]);
    plan.unit_begin.push_back(static_cast<int64_t>(plan.samples.size()));
  }
  return plan;
}

int64_t Loader::UnitsInEpoch(int64_t epoch) const {
  if (options_.pack_length == 0) {
    const int64_t n = reader_->size(), w = options_.world_size;
    return options_.remainder == LoaderOptions::Remainder::kDrop ? n / w : (n + w - 1) / w;
  }
  return Plan(epoch).units();
}

int64_t Loader::BatchesInEpoch(int64_t epoch) const {
  const int64_t units = UnitsInEpoch(epoch), b = options_.batch_size;
  return options_.drop_last_batch ? units / b : (units + b - 1) / b;
}

bool Loader::HasBatch(const EpochPlan& plan, const LoaderState& pos) const {
  const int64_t left = plan.units() - pos.index;
  return left > 0 && !(options_.drop_last_batch && left < options_.batch_size);
}

void Loader::Normalize(const EpochPlan& plan, LoaderState* pos) const {
  if (!HasBatch(plan, *pos)) *pos = LoaderState{pos->epoch + 1, 0};
}

Batch Loader::Assemble(const EpochPlan& plan, int64_t first_unit, int64_t units) const {
  const bool packed = options_.pack_length > 0;
  int64_t seq_len = options_.pack_length;
  if (!packed) {
    seq_len = 0;
    for (int64_t u = first_unit; u < first_unit + units; ++u) {
      seq_len = std::max(seq_len, reader_->NumTokens(plan.samples[plan.unit_begin[u]]));
    }
    const int64_t m = options_.pad_to_multiple_of;
    seq_len = (seq_len + m - 1) / m * m;
  }
  Batch batch;
  batch.batch_size = units;
  batch.seq_len = seq_len;
  const size_t cells = static_cast<size_t>(units * seq_len);
  batch.input_ids.assign(cells, pad_token_id_);
  batch.labels.assign(cells, kIgnoreLabel);
  batch.attention_mask.assign(cells, 0);
  batch.segment_ids.assign(cells, 0);
  for (int64_t row = 0; row < units; ++row) {
    const int64_t u = first_unit + row;
    int64_t at = row * seq_len;
    int32_t segment = 0;
    for (int64_t s = plan.unit_begin[u]; s < plan.unit_begin[u + 1]; ++s) {
      const SampleView v = reader_->View(plan.samples[s]);
      ++segment;
      std::copy(v.input_ids, v.input_ids + v.num_tokens, batch.input_ids.begin() + at);
      std::copy(v.labels, v.labels + v.num_tokens, batch.labels.begin() + at);
      if (packed && v.num_tokens > 0) batch.labels[at] = kIgnoreLabel;
      std::fill_n(batch.attention_mask.begin() + at, v.num_tokens, 1);
      std::fill_n(batch.segment_ids.begin() + at, v.num_tokens, segment);
      batch.image_grid_thw.insert(batch.image_grid_thw.end(), v.image_grid_thw,
                                  v.image_grid_thw + v.num_images * 3);
      const size_t old = batch.pixel_values.size();
      batch.pixel_values.resize(old + static_cast<size_t>(v.num_patches * kPatchDim));
      v.CopyPatches(batch.pixel_values.data() + old);
      batch.solutions.emplace_back(v.solution);
      at += v.num_tokens;
    }
  }
  for (const int32_t label : batch.labels) batch.num_label_tokens += label != kIgnoreLabel;
  return batch;
}

absl::StatusOr<Batch> Loader::Produce(EpochPlan* plan, LoaderState* pos) const {
  if (plan->epoch != pos->epoch) *plan = Plan(pos->epoch);
  if (!HasBatch(*plan, *pos) && pos->index > 0) {
    *pos = LoaderState{pos->epoch + 1, 0};
    *plan = Plan(pos->epoch);
  }
  if (!HasBatch(*plan, *pos)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "loader: epoch ", plan->epoch, " has no batch for rank ", options_.rank, " of ",
        options_.world_size, " (", plan->units(), " units, batch size ", options_.batch_size,
        options_.drop_last_batch ? ", drop_last_batch" : "", ")"));
  }
  const int64_t take = std::min(options_.batch_size, plan->units() - pos->index);
  Batch batch = Assemble(*plan, pos->index, take);
  pos->index += take;
  Normalize(*plan, pos);
  return batch;
}

absl::StatusOr<Batch> Loader::Next() {
  if (!error_.ok()) return error_;
  absl::StatusOr<Batch> batch;
  if (options_.prefetch_batches == 0) {
    LoaderState pos = state_;
    batch = Produce(&sync_plan_, &pos);
    if (batch.ok()) state_ = pos;
  } else {
    Item item;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](std::deque<Item>* q) { return !q->empty(); }, &queue_));
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    batch = std::move(item.batch);
    if (batch.ok()) state_ = item.next;
  }
  if (!batch.ok()) error_ = batch.status();
  return batch;
}

absl::Status Loader::SetState(const LoaderState& state) {
  if (state.epoch < 0 || state.index < 0 || state.index > UnitsInEpoch(state.epoch)) {
    return absl::OutOfRangeError(absl::StrCat(
        "loader: position (epoch ", state.epoch, ", index ", state.index, ") is outside epoch ",
        state.epoch, "'s ", UnitsInEpoch(std::max<int64_t>(0, state.epoch)), " units"));
  }
  StopPrefetch();
  state_ = state;
  EpochPlan plan = Plan(state.epoch);
  if (state_.index > 0) Normalize(plan, &state_);
  sync_plan_ = std::move(plan);
  error_ = absl::OkStatus();
  if (options_.prefetch_batches > 0) StartPrefetch(state_);
  return absl::OkStatus();
}

void Loader::StartPrefetch(LoaderState from) {
  {
    absl::MutexLock lock(&mu_);
    stop_ = false;
    queue_.clear();
  }
  thread_ = std::thread([this, from] { PrefetchLoop(from); });
}

void Loader::StopPrefetch() {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  absl::MutexLock lock(&mu_);
  queue_.clear();
}

void Loader::PrefetchLoop(LoaderState pos) {
  EpochPlan plan;
  const size_t bound = static_cast<size_t>(options_.prefetch_batches);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto room = [this, bound]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || queue_.size() < bound; };
      mu_.Await(absl::Condition(&room));
      if (stop_) return;
    }
    Item item;
    item.batch = Produce(&plan, &pos);
    item.next = pos;
    const bool failed = !item.batch.ok();
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(item));
    if (failed) return;
  }
}

}  // namespace trainctl::data
