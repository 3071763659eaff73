// Batches for one rank from a prepared shard directory.
//
// Each epoch the dataset's N samples are put in a seeded order (a Fisher-Yates shuffle driven by
// SplitMix64 from (seed, epoch): the same on every machine and every rank; identity order when
// shuffle is off). That order is cut into units — one sample per unit, or in packed mode one row
// of samples packed greedily in order up to pack_length tokens — and the units are dealt to ranks
// like PyTorch's DistributedSampler: rank r takes units r, r + W, r + 2W, ... Every rank gets the
// same number of units per epoch: with Remainder::kDrop the last M mod W units are left out;
// with kPad the order wraps around to its start to fill the last round (so a few units are seen
// twice). A rank's units are grouped into batches of batch_size; the last batch of an epoch may
// be smaller (or is dropped with drop_last_batch). All ranks thus get the same batch count.
//
// Padded mode: each row is one sample, padded to the longest in the batch (rounded up to
// pad_to_multiple_of) with pad_token_id, labels -100, attention_mask 0, segment_ids 0.
// Packed mode: each row is pack_length tokens holding several samples back to back, then
// padding; segment_ids number the samples of a row 1, 2, ..., attention_mask is 1 on every
// sample token, and the label of each sample's first token is set to -100 so that no sample is
// trained to predict the next one's start. The model must keep attention within a segment and
// restart positions at each one.
//
// The position — State{epoch, index}, index counting this rank's units of that epoch already
// handed out — is what a checkpoint saves; SetState on a fresh loader with the same options and
// data continues with exactly the batches the old one would have produced.
//
// With prefetch_batches > 0 a background thread assembles batches ahead into a bounded queue.
// A Loader is used from one thread; the prefetch thread is internal.
#ifndef TRAINCTL_COMMON_DATA_LOADER_H_
#define TRAINCTL_COMMON_DATA_LOADER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/data/batch.h"
#include "common/data/shard_reader.h"

namespace trainctl::data {

struct LoaderOptions {
  int64_t batch_size = 1;  // rows per batch
  bool shuffle = true;
  uint64_t seed = 0;
  int32_t rank = 0;
  int32_t world_size = 1;
  enum class Remainder { kDrop, kPad };
  Remainder remainder = Remainder::kDrop;
  bool drop_last_batch = false;
  int64_t pack_length = 0;         // > 0: packed mode, rows of this many tokens
  int64_t pad_to_multiple_of = 1;  // padded mode: round seq_len up to a multiple of this
  int32_t pad_token_id = -1;       // < 0: the manifest's (the tokenizer's <|endoftext|>)
  int32_t prefetch_batches = 2;    // queue bound; 0 assembles batches in Next() itself
};

struct LoaderState {
  int64_t epoch = 0;
  int64_t index = 0;  // units of this rank's epoch already handed out

  bool operator==(const LoaderState& o) const { return epoch == o.epoch && index == o.index; }
};

class Loader {
 public:
  // INVALID_ARGUMENT for options out of range (batch_size < 1, rank not in [0, world_size), no
  // pad token in options or manifest, a sample longer than pack_length — naming it — in packed
  // mode); FAILED_PRECONDITION when the data is empty or, with kDrop, has fewer samples than ranks.
  static absl::StatusOr<std::unique_ptr<Loader>> Create(std::shared_ptr<const ShardReader> reader,
                                                        const LoaderOptions& options);
  // Stops and joins the prefetch thread.
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch, going on into the next epoch after the last batch of one. FAILED_PRECONDITION
  // when an epoch has no batch for this rank (every later call returns the same error).
  absl::StatusOr<Batch> Next();

  // The position after the last batch Next() returned (an epoch's end reads as {epoch + 1, 0}).
  LoaderState state() const { return state_; }

  // Continues from `state` (dropping prefetched batches). OUT_OF_RANGE when the epoch is negative
  // or index is beyond the epoch's units.
  absl::Status SetState(const LoaderState& state);

  // Units (samples, or packed rows) this rank gets in `epoch`, and the batches they make.
  int64_t UnitsInEpoch(int64_t epoch) const;
  int64_t BatchesInEpoch(int64_t epoch) const;

  // The dataset indices this rank reads in `epoch`, in order, and where each unit starts in that
  // list (units + 1 entries).
  struct EpochPlan {
    int64_t epoch = -1;
    std::vector<int64_t> samples;
    std::vector<int64_t> unit_begin;
    int64_t units() const { return static_cast<int64_t>(unit_begin.size()) - 1; }
  };
  EpochPlan Plan(int64_t epoch) const;

 private:
  struct Item {
    absl::StatusOr<Batch> batch;
    LoaderState next;
  };

  Loader(std::shared_ptr<const ShardReader> reader, const LoaderOptions& options);
  // Assembles the batch at `*pos` and advances it; the step both the thread and Next() take.
  absl::StatusOr<Batch> Produce(EpochPlan* plan, LoaderState* pos) const;
  Batch Assemble(const EpochPlan& plan, int64_t first_unit, int64_t units) const;
  bool HasBatch(const EpochPlan& plan, const LoaderState& pos) const;
  // Rolls `pos` over to the next epoch when `plan` has no batch left at it.
  void Normalize(const EpochPlan& plan, LoaderState* pos) const;
  void StartPrefetch(LoaderState from);
  void StopPrefetch();
  void PrefetchLoop(LoaderState pos);

  const std::shared_ptr<const ShardReader> reader_;
  const LoaderOptions options_;
  const int32_t pad_token_id_;

  // Consumer side.
  LoaderState state_;
  absl::Status error_;   // sticky once Next() has failed
  EpochPlan sync_plan_;  // prefetch_batches == 0

  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace trainctl::data

#endif  // TRAINCTL_COMMON_DATA_LOADER_H_
