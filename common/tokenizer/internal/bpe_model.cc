#include "common/tokenizer/internal/bpe_model.h"

#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/internal/byte_level.h"

namespace trainctl::tokenizer::internal {
namespace {

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// A candidate merge of the symbol at `pos` with its right neighbour, valid only while both
// symbols still have the ids it was made from.
struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t left;
  int32_t right;
  int32_t merged;
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

struct Symbol {
  int32_t id;  // -1 once merged into its left neighbour
  int32_t prev;
  int32_t next;  // -1 at either end
};

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(BpeModelSpec spec) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  model->vocab_ = std::move(spec.vocab);
  model->ignore_merges_ = spec.ignore_merges;
  const auto& symbols = ByteSymbols();
  for (int b = 0; b < 256; ++b) {
    auto it = model->vocab_.find(symbols[b]);
    if (it == model->vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "model.vocab lacks '%s', the byte-level symbol of byte 0x%02X", symbols[b], b));
    }
    model->byte_ids_[b] = it->second;
  }
  model->merges_.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [left, right] = spec.merges[rank];
    const auto l = model->vocab_.find(left), r = model->vocab_.find(right);
    const auto m = model->vocab_.find(absl::StrCat(left, right));
    const auto end = model->vocab_.end();
    if (l == end || r == end || m == end) {
      const std::string missing = l == end ? left : r == end ? right : absl::StrCat(left, right);
      return absl::InvalidArgumentError(absl::StrCat("model.merges[", rank, "] ('", left, " ",
                                                     right, "'): token '", missing,
                                                     "' is not in model.vocab"));
    }
    // A repeated pair keeps its last rank, as HF's tokenizers (Rust and JS) do.
    model->merges_[PairKey(l->second, r->second)] = {static_cast<int32_t>(rank), m->second};
  }
  return model;
}

std::optional<int32_t> BpeModel::TokenToId(absl::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const BpeModel::Merge* BpeModel::FindMerge(int32_t left, int32_t right) const {
  auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

std::vector<int32_t> BpeModel::MergeWord(absl::string_view word) const {
  const int n = static_cast<int>(word.size());
  std::vector<Symbol> symbols(n);
  for (int i = 0; i < n; ++i) {
    symbols[i] = {byte_ids_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int pos) {
    if (pos < 0 || symbols[pos].next < 0) return;
    const int32_t left = symbols[pos].id, right = symbols[symbols[pos].next].id;
    if (const Merge* m = FindMerge(left, right)) queue.push({m->rank, pos, left, right, m->id});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& s = symbols[c.pos];
    if (s.id != c.left || s.next < 0 || symbols[s.next].id != c.right) continue;  // stale
    Symbol& absorbed = symbols[s.next];
    s.id = c.merged;
    s.next = absorbed.next;
    if (s.next >= 0) symbols[s.next].prev = c.pos;
    absorbed.id = -1;
    consider(s.prev);
    consider(c.pos);
  }
  std::vector<int32_t> ids;
  for (int i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
  return ids;
}

void BpeModel::Encode(absl::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (word.size() == 1) {
    ids->push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (ignore_merges_) {
    std::string symbols;
    for (const char b : word) symbols += ByteSymbols()[static_cast<unsigned char>(b)];
    if (auto id = TokenToId(symbols)) {
      ids->push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    absl::ReaderMutexLock lock(&cache_mu_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> merged = MergeWord(word);
  ids->insert(ids->end(), merged.begin(), merged.end());
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(word, std::move(merged));
  }
}

}  // namespace trainctl::tokenizer::internal
