#include "worker/trainer/model/generation.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/trainer/model/internal/sampling.h"
#include "worker/trainer/model/status_guard.h"

#ifdef TRAINCTL_CUDA_BUILD
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/cuda.h>
#endif

namespace trainctl::model {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

absl::Status CheckOptions(const GenerationOptions& options) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("generation options: ", what));
  };
  if (options.max_new_tokens <= 0) {
    return bad(absl::StrCat("max_new_tokens must be positive, got ", options.max_new_tokens));
  }
  if (!std::isfinite(options.temperature) || options.temperature < 0) {
    return bad(absl::StrCat("temperature must be >= 0, got ", options.temperature));
  }
  if (!(options.top_p > 0 && options.top_p <= 1)) {
    return bad(absl::StrCat("top_p must be in (0, 1], got ", options.top_p));
  }
  if (options.top_k < 0) return bad(absl::StrCat("top_k must be >= 0, got ", options.top_k));
  if (options.pad_token_id < 0) {
    return bad(absl::StrCat("pad_token_id must be >= 0, got ", options.pad_token_id));
  }
  return absl::OkStatus();
}

// Left padding: every row's tokens form one run that ends in the last column.
absl::Status CheckLeftPadded(const ModelInputs& prompts) {
  const torch::Tensor& ids = prompts.input_ids;
  if (!ids.defined() || ids.dim() != 2 || ids.size(0) == 0 || ids.size(1) == 0) {
    return absl::InvalidArgumentError("prompts: input_ids must be a non-empty [batch, seq]");
  }
  if (!prompts.attention_mask.defined()) return absl::OkStatus();
  if (prompts.attention_mask.sizes() != ids.sizes()) {
    return absl::InvalidArgumentError("prompts: attention_mask and input_ids differ in shape");
  }
  const torch::Tensor mask = prompts.attention_mask.to(torch::kCPU, torch::kInt64).ne(0);
  // Left padded iff the mask never falls from 1 to 0 and the last column is all 1.
  const int64_t seq = mask.size(1);
  const bool falls =
      seq > 1 && (mask.narrow(1, 0, seq - 1).logical_and(mask.narrow(1, 1, seq - 1).logical_not()))
                     .any()
                     .item<bool>();
  if (falls || !mask.select(1, seq - 1).all().item<bool>()) {
    return absl::InvalidArgumentError(
        "prompts: attention_mask must be left padding (each row's tokens end in the last column)");
  }
  return absl::OkStatus();
}

// The next token of every row of `logits` [B, vocab], [B] int64 on the CPU: argmax when
// temperature is 0, else one draw per row (internal/sampling.h) with a uniform number from the
// generator of its prompt row `rows[b]`. A single generator draws one number for each of the
// `prompts` rows every step, whether or not that row is still in the batch, so the numbers a row
// gets do not depend on which rows have left it.
torch::Tensor NextTokens(const torch::Tensor& logits, const GenerationOptions& options,
                         std::vector<at::Generator>& gens, const std::vector<int64_t>& rows,
                         int64_t prompts, internal::CpuSamplingBuffers& buffers) {
  if (options.temperature == 0) return logits.argmax(-1).to(torch::kCPU, torch::kInt64);
  const auto batch = static_cast<int64_t>(rows.size());
  torch::Tensor u = torch::empty({batch}, torch::kFloat64);
  if (gens.size() == 1) {
    torch::Tensor all = torch::empty({prompts}, torch::kFloat64);
    all.uniform_(0, 1, gens[0]);
    u = batch == prompts ? all : all.index_select(0, torch::tensor(rows, torch::kInt64));
  } else {
    for (int64_t b = 0; b < batch; ++b) {
      u[b].uniform_(0, 1, gens[static_cast<size_t>(rows[static_cast<size_t>(b)])]);
    }
  }
  return internal::SampleTokens(logits, {options.temperature, options.top_k, options.top_p}, u,
                                &buffers);
}

// The decoding loop's step after the prefill: DecodeStepAt and the head over the cache's fixed
// shapes, the ids fed through one device buffer. On CUDA, when no unit runner is set or the
// caller holds every unit's weights (a ZeRO-3 runner would otherwise gather them, which a graph
// must not capture), the first step is captured as a CUDA graph and every later step replays it:
// one launch per token instead of ~50 kernel launches per layer from the host, which bound
// decoding at small batches (vLLM and SGLang do the same).
class DecodeStepper {
 public:
  DecodeStepper(Qwen2VLForConditionalGeneration& model, KvCache& cache, int64_t batch,
                const GenerationOptions& options)
      : model_(model), cache_(cache) {
    const torch::Device device = cache.rope_deltas.device();
    ids_ = torch::zeros({batch, 1}, torch::TensorOptions().dtype(torch::kInt64).device(device));
    cache_.step_position =
        torch::zeros({1}, torch::TensorOptions().dtype(torch::kInt64).device(device));
    use_graph_ = options.cuda_graph && device.is_cuda() &&
                 (!model.HasUnitRunner() || options.units_resident);
  }

  // Feeds `feed` [B] (int64, CPU) at the next position; returns the logits [B, vocab].
  torch::Tensor Step(const torch::Tensor& feed) {
    // Lock-step ranks may step past max_new_tokens (feeding pads) until all agree to stop: the
    // cache doubles, and a graph captured on the old buffers is captured again.
    if (cache_.length >= cache_.layers[0].key.size(2)) {
      Grow(2 * cache_.layers[0].key.size(2));
#ifdef TRAINCTL_CUDA_BUILD
      graph_.reset();
#endif
    }
    ids_.copy_(feed.view(ids_.sizes()));
    cache_.step_position.fill_(cache_.length);
    torch::Tensor logits;
#ifdef TRAINCTL_CUDA_BUILD
    if (use_graph_) {
      logits = graph_ ? Replay() : Capture();
      ++cache_.length;
      return logits;
    }
#endif
    logits = Run();
    ++cache_.length;
    return logits;
  }

  // Keeps the batch rows at `positions` (ascending) in the cache and drops the others: their
  // keys, values, attention mask and rotary offsets are copied into buffers of the new batch
  // size. Generate does this on the CPU only; a CUDA graph would be captured again.
  void KeepRows(const std::vector<int64_t>& positions) {
    const torch::Tensor index =
        torch::tensor(positions, torch::kInt64).to(cache_.rope_deltas.device());
    for (LayerKvCache& layer : cache_.layers) {
      layer.key = layer.key.index_select(0, index);
      layer.value = layer.value.index_select(0, index);
    }
    cache_.attention_mask = cache_.attention_mask.index_select(0, index);
    cache_.rope_deltas = cache_.rope_deltas.index_select(0, index);
    ids_ = torch::zeros({index.size(0), 1}, ids_.options());
#ifdef TRAINCTL_CUDA_BUILD
    graph_.reset();
#endif
  }

 private:
  torch::Tensor Run() { return model_.Head(model_.DecodeStepAt(ids_, cache_)).squeeze(1); }

  void Grow(int64_t capacity) {
    for (LayerKvCache& layer : cache_.layers) layer.Grow(capacity);
    torch::Tensor& mask = cache_.attention_mask;
    torch::Tensor bigger =
        torch::zeros({mask.size(0), std::max(capacity, mask.size(1))}, mask.options());
    bigger.narrow(1, 0, mask.size(1)).copy_(mask);
    mask = std::move(bigger);
  }

#ifdef TRAINCTL_CUDA_BUILD
  // This step runs eagerly on a side stream (its results are real), then is captured there.
  torch::Tensor Capture() {
    torch::cuda::synchronize();
    torch::Tensor logits;
    {
      c10::cuda::CUDAStreamGuard side(at::cuda::getStreamFromPool());
      logits = Run();
      graph_ = std::make_unique<at::cuda::CUDAGraph>();
#if TORCH_VERSION_MAJOR >= 2
      // Thread-local capture: other threads' CUDA calls (NCCL's watchdog) stay legal meanwhile.
      graph_->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
#else
      graph_->capture_begin();
#endif
      graph_logits_ = Run();
      graph_->capture_end();
    }
    torch::cuda::synchronize();
    return logits;
  }

  torch::Tensor Replay() {
    graph_->replay();
    return graph_logits_;
  }

  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  torch::Tensor graph_logits_;  // in the graph's memory pool, rewritten by every replay
#endif

  Qwen2VLForConditionalGeneration& model_;
  KvCache& cache_;
  torch::Tensor ids_;  // [B, 1] on the device
  bool use_graph_ = false;
};

// What each prompt row has generated, and which prompt row each row of the decoding batch is.
class RowBook {
 public:
  RowBook(int64_t prompts, const GenerationOptions& options, GenerationOutput& out)
      : options_(options), out_(out), done_(static_cast<size_t>(prompts), false) {
    out_.tokens.resize(static_cast<size_t>(prompts));
    out_.stopped.assign(static_cast<size_t>(prompts), false);
    for (int64_t r = 0; r < prompts; ++r) rows_.push_back(r);
  }

  // `next` [batch] int64 on the CPU: appends each open row's token; a row finishes at an eos id
  // or max_new_tokens.
  void Record(const torch::Tensor& next) {
    const auto token = next.accessor<int64_t, 1>();
    for (size_t b = 0; b < rows_.size(); ++b) {
      const auto r = static_cast<size_t>(rows_[b]);
      if (done_[r]) continue;
      const int64_t t = token[static_cast<int64_t>(b)];
      out_.tokens[r].push_back(t);
      ++out_.new_tokens;
      const auto& eos = options_.eos_token_ids;
      if (std::find(eos.begin(), eos.end(), t) != eos.end()) {
        done_[r] = true;
        out_.stopped[r] = true;
      } else if (static_cast<int64_t>(out_.tokens[r].size()) >= options_.max_new_tokens) {
        done_[r] = true;
      }
    }
  }

  bool AllDone() const {
    return std::all_of(rows_.begin(), rows_.end(),
                       [this](int64_t r) { return done_[static_cast<size_t>(r)]; });
  }

  // The batch positions of the rows not finished, ascending.
  std::vector<int64_t> OpenPositions() const {
    std::vector<int64_t> open;
    for (size_t b = 0; b < rows_.size(); ++b) {
      if (!done_[static_cast<size_t>(rows_[b])]) open.push_back(static_cast<int64_t>(b));
    }
    return open;
  }

  // The batch keeps the rows at `positions` only (DecodeStepper::KeepRows).
  void Keep(const std::vector<int64_t>& positions) {
    std::vector<int64_t> kept;
    for (int64_t b : positions) kept.push_back(rows_[static_cast<size_t>(b)]);
    rows_ = std::move(kept);
  }

  // What the next step feeds, [batch] int64 on the CPU: each row's last token, pad once finished.
  torch::Tensor Feed() const {
    torch::Tensor feed = torch::empty({static_cast<int64_t>(rows_.size())}, torch::kInt64);
    auto fed = feed.accessor<int64_t, 1>();
    for (size_t b = 0; b < rows_.size(); ++b) {
      const auto r = static_cast<size_t>(rows_[b]);
      fed[static_cast<int64_t>(b)] = done_[r] ? options_.pad_token_id : out_.tokens[r].back();
    }
    return feed;
  }

  const std::vector<int64_t>& rows() const { return rows_; }

 private:
  const GenerationOptions& options_;
  GenerationOutput& out_;
  std::vector<bool> done_;     // per prompt row
  std::vector<int64_t> rows_;  // batch position -> prompt row
};

}  // namespace

absl::StatusOr<ModelInputs> LeftPadPrompts(const std::vector<std::vector<int64_t>>& prompts,
                                           int64_t pad_token_id) {
  if (prompts.empty()) return absl::InvalidArgumentError("prompts: no rows");
  size_t longest = 0;
  for (size_t r = 0; r < prompts.size(); ++r) {
    if (prompts[r].empty())
      return absl::InvalidArgumentError(absl::StrCat("prompts: row ", r, " is empty"));
    longest = std::max(longest, prompts[r].size());
  }
  const auto batch = static_cast<int64_t>(prompts.size());
  const auto seq = static_cast<int64_t>(longest);
  torch::Tensor ids = torch::full({batch, seq}, pad_token_id, torch::kInt64);
  torch::Tensor mask = torch::zeros({batch, seq}, torch::kInt64);
  auto id = ids.accessor<int64_t, 2>();
  auto m = mask.accessor<int64_t, 2>();
  for (int64_t r = 0; r < batch; ++r) {
    const auto& row = prompts[static_cast<size_t>(r)];
    const int64_t offset = seq - static_cast<int64_t>(row.size());
    for (size_t j = 0; j < row.size(); ++j) {
      id[r][offset + static_cast<int64_t>(j)] = row[j];
      m[r][offset + static_cast<int64_t>(j)] = 1;
    }
  }
  ModelInputs inputs;
  inputs.input_ids = ids;
  inputs.attention_mask = mask;
  return inputs;
}

absl::StatusOr<GenerationOutput> Generate(Qwen2VLForConditionalGeneration& model,
                                          const ModelInputs& prompts,
                                          const GenerationOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  if (absl::Status s = CheckLeftPadded(prompts); !s.ok()) return s;
  torch::NoGradGuard no_grad;
  const int64_t batch = prompts.input_ids.size(0);
  const int64_t seq = prompts.input_ids.size(1);
  if (!options.row_seeds.empty() && static_cast<int64_t>(options.row_seeds.size()) != batch) {
    return absl::InvalidArgumentError(absl::StrCat("generation options: row_seeds has ",
                                                   options.row_seeds.size(), " seeds for ", batch,
                                                   " rows"));
  }
  GenerationOutput out;
  std::vector<at::Generator> gens;
  if (options.row_seeds.empty()) {
    gens.push_back(at::make_generator<at::CPUGeneratorImpl>(options.seed));
  } else {
    for (uint64_t seed : options.row_seeds) {
      gens.push_back(at::make_generator<at::CPUGeneratorImpl>(seed));
    }
  }
  // A collective in options.all_done (ranks deciding together) fails as UNAVAILABLE.
  RETURN_IF_ERROR(Guarded(
      "",
      [&] {
        KvCache cache;
        Clock::time_point start = Clock::now();
        torch::Tensor hidden = model.Prefill(prompts, seq + options.max_new_tokens, cache);
        torch::Tensor logits = model.Head(hidden.narrow(1, seq - 1, 1)).squeeze(1);
        DecodeStepper stepper(model, cache, batch, options);
        RowBook book(batch, options, out);
        internal::CpuSamplingBuffers sampling_buffers;
        // On the CPU, rows that finished leave the batch (each step's cost grows with its rows); on
        // a CUDA device the batch keeps its size, finished rows fed pad, so the graph keeps
        // replaying.
        const bool compact = options.compact_finished_rows && cache.rope_deltas.device().is_cpu();
        bool prefill_done = false;
        while (true) {
          if (!book.AllDone()) {
            book.Record(NextTokens(logits, options, gens, book.rows(), batch, sampling_buffers));
          }
          if (!prefill_done) {
            out.prefill_seconds = SecondsSince(start);
            start = Clock::now();
            prefill_done = true;
          }
          const bool local_done = book.AllDone();
          if (options.all_done ? options.all_done(local_done) : local_done) break;
          if (compact) {
            const std::vector<int64_t> open = book.OpenPositions();
            if (!open.empty() && open.size() < book.rows().size()) {
              stepper.KeepRows(open);
              book.Keep(open);
            }
          }
          logits = stepper.Step(book.Feed());
          ++out.decode_steps;
        }
        out.decode_seconds = SecondsSince(start);
      },
      absl::StatusCode::kInvalidArgument));
  return out;
}

torch::Tensor CompletionLogProbs(Qwen2VLForConditionalGeneration& model,
                                 const ModelInputs& prompt_and_completion,
                                 int64_t completion_start) {
  const torch::Tensor& ids = prompt_and_completion.input_ids;
  TORCH_CHECK(ids.defined() && ids.dim() == 2, "input_ids must be [batch, seq]");
  const int64_t seq = ids.size(1);
  TORCH_CHECK(completion_start >= 1 && completion_start < seq, "completion_start must be in [1, ",
              seq, "), got ", completion_start);
  const int64_t width = seq - completion_start;
  const torch::Tensor hidden = model.ForwardHidden(prompt_and_completion);
  // Position t predicts token t + 1: the C positions before each completion token.
  const torch::Tensor logits =
      model.Head(hidden.narrow(1, completion_start - 1, width)).to(torch::kFloat32);
  const torch::Tensor targets =
      ids.narrow(1, completion_start, width).to(logits.device(), torch::kInt64).unsqueeze(-1);
  return logits.gather(-1, targets).squeeze(-1) - logits.logsumexp(-1);
}

torch::Tensor PackedCompletionLogProbs(Qwen2VLForConditionalGeneration& model,
                                       const ModelInputs& packed, const torch::Tensor& predictors,
                                       const torch::Tensor& targets) {
  TORCH_CHECK(packed.segment_ids.defined(), "PackedCompletionLogProbs needs segment_ids");
  TORCH_CHECK(predictors.dim() == 2 && targets.sizes() == predictors.sizes(),
              "predictors and targets must be [rows, completion], got ", predictors.sizes(),
              " and ", targets.sizes());
  const torch::Tensor hidden = model.ForwardHidden(packed);
  const int64_t positions = hidden.size(0) * hidden.size(1);
  const torch::Tensor flat = hidden.reshape({positions, hidden.size(2)});
  const torch::Tensor index = predictors.to(flat.device(), torch::kInt64).reshape({-1});
  // Only the predicting positions reach the head: [b, C, hidden], as the padded layout's.
  const torch::Tensor picked =
      flat.index_select(0, index).view({predictors.size(0), predictors.size(1), -1});
  const torch::Tensor logits = model.Head(picked).to(torch::kFloat32);
  const torch::Tensor ids = targets.to(logits.device(), torch::kInt64).unsqueeze(-1);
  return logits.gather(-1, ids).squeeze(-1) - logits.logsumexp(-1);
}

}  // namespace trainctl::model
