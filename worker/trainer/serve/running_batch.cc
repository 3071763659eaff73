#include "worker/trainer/serve/running_batch.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/data/batch.h"
#include "worker/trainer/model/generation.h"

namespace trainctl::serve {
namespace {

absl::Status ModelError(const char* what, const std::exception& e) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
  return absl::InternalError(absl::StrCat(
      what, " failed: ", torch_error ? torch_error->what_without_backtrace() : e.what()));
}

// Copies the first `length` positions of rows [0, n) of `from` ([n, H, >= length, D] or
// [n, >= length]) into rows [row0, row0 + n) of `to` at positions [at, at + length).
void Place(const torch::Tensor& from, int64_t length, torch::Tensor& to, int64_t row0, int64_t at) {
  const int64_t dim = from.dim() == 4 ? 2 : 1;
  to.narrow(0, row0, from.size(0)).narrow(dim, at, length).copy_(from.narrow(dim, 0, length));
}

}  // namespace

RunningBatch::RunningBatch(std::shared_ptr<model::Qwen2VLForConditionalGeneration> model,
                           std::vector<int64_t> eos_token_ids, int64_t pad_token_id)
    : model_(std::move(model)),
      eos_token_ids_(std::move(eos_token_ids)),
      pad_token_id_(pad_token_id) {}

int64_t RunningBatch::capacity() const {
  return cache_.layers.empty() || !cache_.layers[0].key.defined() ? 0
                                                                  : cache_.layers[0].key.size(2);
}

void RunningBatch::Push(BatchRow& row, int64_t token) const {
  if (row.finished) return;
  row.tokens.push_back(token);
  if (std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) != eos_token_ids_.end()) {
    row.eos = true;
    row.finished = true;
  } else if (static_cast<int64_t>(row.tokens.size()) >= row.max_tokens) {
    row.finished = true;
  }
}

std::vector<int64_t> RunningBatch::Sample(const torch::Tensor& logits,
                                          std::vector<BatchRow>& rows) const {
  const auto batch = static_cast<int64_t>(rows.size());
  const torch::Tensor greedy = logits.argmax(-1).to(torch::kCPU, torch::kInt64);
  std::vector<int64_t> out(greedy.data_ptr<int64_t>(), greedy.data_ptr<int64_t>() + batch);
  bool sampled = false, nucleus = false;
  std::vector<float> temperature(rows.size(), 1.0f), top_p(rows.size(), 1.0f);
  for (size_t b = 0; b < rows.size(); ++b) {
    if (rows[b].temperature <= 0) continue;
    sampled = true;
    temperature[b] = static_cast<float>(rows[b].temperature);
    top_p[b] = static_cast<float>(rows[b].top_p);
    nucleus = nucleus || rows[b].top_p < 1;
  }
  if (!sampled) return out;
  const torch::Device device = logits.device();
  const int64_t vocab = logits.size(-1);
  torch::Tensor x =
      logits.to(torch::kFloat32) / torch::tensor(temperature).view({batch, 1}).to(device);
  if (nucleus) {
    const torch::Tensor p = torch::tensor(top_p).view({batch, 1}).to(device);
    auto [sorted, order] = x.sort(-1, /*descending=*/true);
    const torch::Tensor probs = sorted.softmax(-1);
    // Drop a token when the tokens ranked above it already hold top_p; the first always stays.
    const torch::Tensor drop_sorted = ((probs.cumsum(-1) - probs) >= p).logical_and(p < 1);
    const torch::Tensor drop = torch::zeros_like(drop_sorted).scatter(-1, order, drop_sorted);
    x = x.masked_fill(drop, -std::numeric_limits<double>::infinity());
  }
  const torch::Tensor cdf = x.softmax(-1).to(torch::kFloat64).cumsum(-1);
  torch::Tensor u = torch::zeros({batch}, torch::kFloat64);
  for (int64_t b = 0; b < batch; ++b) {
    BatchRow& row = rows[static_cast<size_t>(b)];
    if (row.temperature > 0) u[b].uniform_(0, 1, row.generator);
  }
  const torch::Tensor target = u.to(device).unsqueeze(1) * cdf.narrow(1, vocab - 1, 1);
  const torch::Tensor drawn = torch::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true)
                                  .clamp_max(vocab - 1)
                                  .view({-1})
                                  .to(torch::kCPU, torch::kInt64);
  for (size_t b = 0; b < rows.size(); ++b) {
    if (rows[b].temperature > 0) out[b] = drawn[static_cast<int64_t>(b)].item<int64_t>();
  }
  return out;
}

absl::Status RunningBatch::Join(const std::vector<NewRow>& rows) {
  if (rows.empty()) return absl::OkStatus();
  std::vector<std::vector<int64_t>> prompts;
  std::vector<torch::Tensor> pixels;
  std::vector<int64_t> grids;
  std::vector<BatchRow> added;
  for (const NewRow& r : rows) {
    const ChatPrompt& p = *r.prompt;
    prompts.push_back(p.ids);
    if (!p.grid_thw.empty()) {
      const int64_t patches = static_cast<int64_t>(p.pixel_values.size()) / data::kPatchDim;
      pixels.push_back(torch::from_blob(const_cast<float*>(p.pixel_values.data()),
                                        {patches, data::kPatchDim}, torch::kFloat32));
      grids.insert(grids.end(), p.grid_thw.begin(), p.grid_thw.end());
    }
    BatchRow row;
    row.temperature = r.temperature;
    row.top_p = r.top_p;
    row.max_tokens = std::max<int64_t>(1, r.max_tokens);
    row.generator = at::make_generator<at::CPUGeneratorImpl>(r.seed);
    added.push_back(std::move(row));
  }
  try {
    torch::NoGradGuard no_grad;
    absl::StatusOr<model::ModelInputs> inputs = model::LeftPadPrompts(prompts, pad_token_id_);
    if (!inputs.ok()) return inputs.status();
    const int64_t seq = inputs->input_ids.size(1);
    for (size_t b = 0; b < rows.size(); ++b) {
      added[b].first = seq - static_cast<int64_t>(prompts[b].size());
    }
    const torch::Device device = model_->parameters().front().device();
    inputs->input_ids = inputs->input_ids.to(device);
    inputs->attention_mask = inputs->attention_mask.to(device);
    if (!pixels.empty()) {
      inputs->pixel_values = torch::cat(pixels, 0).to(device);
      inputs->image_grid_thw = torch::tensor(grids, torch::kInt64)
                                   .view({static_cast<int64_t>(grids.size()) / 3, 3})
                                   .to(device);
    }
    model::KvCache fresh;
    const torch::Tensor hidden = model_->Prefill(*inputs, seq + 1, fresh);
    const torch::Tensor logits = model_->Head(hidden.narrow(1, seq - 1, 1)).squeeze(1);
    const std::vector<int64_t> first = Sample(logits, added);
    for (size_t b = 0; b < added.size(); ++b) Push(added[b], first[b]);
    Merge(fresh, seq, added);
  } catch (const std::exception& e) {
    return ModelError("prefill", e);
  }
  return absl::OkStatus();
}

void RunningBatch::Merge(model::KvCache& fresh, int64_t seq, std::vector<BatchRow>& added) {
  if (rows_.empty()) {
    cache_ = std::move(fresh);
    rows_ = std::move(added);
    return;
  }
  const int64_t old_length = cache_.length;
  const int64_t length = std::max(old_length, seq);
  const int64_t old_shift = length - old_length, new_shift = length - seq;
  const int64_t old_rows = size(), rows = old_rows + static_cast<int64_t>(added.size());
  const int64_t room = std::max(capacity(), length + 1);
  for (size_t i = 0; i < cache_.layers.size(); ++i) {
    model::LayerKvCache& layer = cache_.layers[i];
    const model::LayerKvCache& extra = fresh.layers[i];
    for (auto member : {&model::LayerKvCache::key, &model::LayerKvCache::value}) {
      torch::Tensor& buffer = layer.*member;
      std::vector<int64_t> shape = buffer.sizes().vec();
      shape[0] = rows;
      shape[2] = room;
      torch::Tensor merged = torch::zeros(shape, buffer.options());
      Place(buffer, old_length, merged, 0, old_shift);
      Place(extra.*member, seq, merged, old_rows, new_shift);
      buffer = std::move(merged);
    }
    layer.length = length;
    layer.capacity = room;
  }
  torch::Tensor mask = torch::zeros({rows, room}, cache_.attention_mask.options());
  Place(cache_.attention_mask, old_length, mask, 0, old_shift);
  Place(fresh.attention_mask, seq, mask, old_rows, new_shift);
  cache_.attention_mask = std::move(mask);
  cache_.rope_deltas = torch::cat({cache_.rope_deltas - old_shift,
                                   fresh.rope_deltas.to(cache_.rope_deltas.device()) - new_shift});
  cache_.length = length;
  for (BatchRow& row : rows_) row.first += old_shift;
  for (BatchRow& row : added) {
    row.first += new_shift;
    rows_.push_back(std::move(row));
  }
}

absl::Status RunningBatch::Step() {
  if (rows_.empty()) return absl::OkStatus();
  try {
    torch::NoGradGuard no_grad;
    const torch::Device device = cache_.rope_deltas.device();
    if (cache_.length >= capacity()) {
      const int64_t room = std::max<int64_t>(2 * capacity(), cache_.length + 1);
      for (model::LayerKvCache& layer : cache_.layers) layer.Grow(room);
      torch::Tensor mask = torch::zeros({size(), room}, cache_.attention_mask.options());
      Place(cache_.attention_mask, cache_.length, mask, 0, 0);
      cache_.attention_mask = std::move(mask);
    }
    std::vector<int64_t> feed;
    for (const BatchRow& row : rows_)
      feed.push_back(row.finished ? pad_token_id_ : row.tokens.back());
    const torch::Tensor ids = torch::tensor(feed, torch::kInt64).view({size(), 1}).to(device);
    cache_.step_position =
        torch::full({1}, cache_.length, torch::TensorOptions().dtype(torch::kInt64).device(device));
    const torch::Tensor hidden = model_->DecodeStepAt(ids, cache_);
    ++cache_.length;
    for (model::LayerKvCache& layer : cache_.layers) {
      layer.write_at = torch::Tensor();
      layer.length = cache_.length;
    }
    const std::vector<int64_t> next = Sample(model_->Head(hidden).squeeze(1), rows_);
    for (size_t b = 0; b < rows_.size(); ++b) Push(rows_[b], next[b]);
  } catch (const std::exception& e) {
    return ModelError("decoding step", e);
  }
  return absl::OkStatus();
}

void RunningBatch::Retain(const std::vector<bool>& keep) {
  if (std::find(keep.begin(), keep.end(), false) == keep.end()) return;
  std::vector<int64_t> index;
  std::vector<BatchRow> kept;
  for (size_t b = 0; b < rows_.size(); ++b) {
    if (!keep[b]) continue;
    index.push_back(static_cast<int64_t>(b));
    kept.push_back(std::move(rows_[b]));
  }
  rows_ = std::move(kept);
  if (rows_.empty()) return Clear();
  const torch::Tensor at = torch::tensor(index, torch::kInt64).to(cache_.rope_deltas.device());
  for (model::LayerKvCache& layer : cache_.layers) {
    layer.key = layer.key.index_select(0, at);
    layer.value = layer.value.index_select(0, at);
  }
  cache_.attention_mask = cache_.attention_mask.index_select(0, at);
  cache_.rope_deltas = cache_.rope_deltas.index_select(0, at);
  Compact();
}

void RunningBatch::Compact() {
  int64_t cut = cache_.length;
  for (const BatchRow& row : rows_) cut = std::min(cut, row.first);
  if (cut <= 0 || 2 * cut < cache_.length) return;
  const int64_t length = cache_.length - cut;
  auto shift = [&](torch::Tensor& t, int64_t dim) {
    torch::Tensor moved = torch::zeros_like(t);
    moved.narrow(dim, 0, length).copy_(t.narrow(dim, cut, length));
    t = std::move(moved);
  };
  for (model::LayerKvCache& layer : cache_.layers) {
    shift(layer.key, 2);
    shift(layer.value, 2);
    layer.length = length;
  }
  shift(cache_.attention_mask, 1);
  cache_.rope_deltas = cache_.rope_deltas + cut;
  cache_.length = length;
  for (BatchRow& row : rows_) row.first -= cut;
}

void RunningBatch::Clear() {
  rows_.clear();
  cache_ = model::KvCache{};
}

}  // namespace trainctl::serve
