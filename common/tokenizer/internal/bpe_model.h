// The BPE model of a byte-level tokenizer: a word (the bytes of one pre-token) starts as one
// symbol per byte and adjacent symbols are merged, lowest merge rank first (leftmost among equal
// ranks), until no listed merge applies.
#ifndef TRAINCTL_COMMON_TOKENIZER_INTERNAL_BPE_MODEL_H_
#define TRAINCTL_COMMON_TOKENIZER_INTERNAL_BPE_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace trainctl::tokenizer::internal {

struct BpeModelSpec {
  absl::flat_hash_map<std::string, int32_t> vocab;          // byte-level symbols -> id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  bool ignore_merges = false;  // a word found whole in the vocab is one token, merges or not
};

// Immutable after Create apart from its word cache; Encode is thread-safe.
class BpeModel {
 public:
  // INVALID_ARGUMENT naming the culprit when the vocab lacks the symbol of some byte, or a merge
  // names a token (or yields one) that the vocab lacks.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(BpeModelSpec spec);

  // Appends the ids of `word`, raw bytes (not yet byte-level symbols).
  void Encode(absl::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(absl::string_view token) const;

  // The id of the single-byte token for `byte`.
  int32_t ByteId(unsigned char byte) const { return byte_ids_[byte]; }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;  // of the merged token
  };
  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kMaxCachedWordBytes = 256;

  BpeModel() = default;
  const Merge* FindMerge(int32_t left, int32_t right) const;
  std::vector<int32_t> MergeWord(absl::string_view word) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  std::array<int32_t, 256> byte_ids_{};
  bool ignore_merges_ = false;

  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace trainctl::tokenizer::internal

#endif  // TRAINCTL_COMMON_TOKENIZER_INTERNAL_BPE_MODEL_H_
