#include "worker/trainer/model/generation.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

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

// The next token of every row [B] int64 on the CPU from its logits [B, vocab]: argmax when
// temperature is 0, else temperature, top-k, top-p (HF's order), softmax in float32, and one draw
// per row by inverse transform on the logits' device: the cumulative distribution (float64) is
// searched for u * total, u uniform in [0, 1) from `gens` (one generator for all rows, or one per
// row). The host draws B numbers and reads B ids per step; every vocabulary-wide pass stays on the
// device (a multinomial per row on the CPU drew 151,936 exponentials per row and step).
torch::Tensor NextTokens(const torch::Tensor& logits, const GenerationOptions& options,
                         std::vector<at::Generator>& gens) {
  if (options.temperature == 0) return logits.argmax(-1).to(torch::kCPU, torch::kInt64);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  torch::Tensor x = logits.to(torch::kFloat32);
  if (options.temperature != 1) x = x / options.temperature;
  const int64_t vocab = x.size(-1);
  const int64_t batch = x.size(0);
  if (options.top_k > 0 && options.top_k < vocab) {
    const torch::Tensor kth =
        std::get<0>(x.topk(options.top_k, -1)).narrow(-1, options.top_k - 1, 1);
    x = x.masked_fill(x < kth, neg_inf);
  }
  if (options.top_p < 1) {
    auto [sorted, order] = x.sort(-1, /*descending=*/true);
    const torch::Tensor probs = sorted.softmax(-1);
    // Drop a token when the tokens ranked above it already hold top_p; the first always stays.
    const torch::Tensor drop_sorted = (probs.cumsum(-1) - probs) >= options.top_p;
    const torch::Tensor drop = torch::zeros_like(drop_sorted).scatter(-1, order, drop_sorted);
    x = x.masked_fill(drop, neg_inf);
  }
  const torch::Tensor cdf = x.softmax(-1).to(torch::kFloat64).cumsum(-1);
  torch::Tensor u = torch::empty({batch}, torch::kFloat64);
  if (gens.size() == 1) {
    u.uniform_(0, 1, gens[0]);
  } else {
    for (int64_t b = 0; b < batch; ++b) u[b].uniform_(0, 1, gens[static_cast<size_t>(b)]);
  }
  // right=true: the first token whose cumulative mass exceeds the target, never one of mass 0.
  const torch::Tensor target = u.to(cdf.device()).unsqueeze(1) * cdf.narrow(1, vocab - 1, 1);
  return torch::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true)
      .clamp_max(vocab - 1)
      .view({-1})
      .to(torch::kCPU, torch::kInt64);
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
  const auto is_eos = [&options](int64_t token) {
    return std::find(options.eos_token_ids.begin(), options.eos_token_ids.end(), token) !=
           options.eos_token_ids.end();
  };

  GenerationOutput out;
  out.tokens.resize(static_cast<size_t>(batch));
  out.stopped.assign(static_cast<size_t>(batch), false);
  std::vector<bool> done(static_cast<size_t>(batch), false);
  std::vector<at::Generator> gens;
  if (options.row_seeds.empty()) {
    gens.push_back(at::make_generator<at::CPUGeneratorImpl>(options.seed));
  } else {
    for (uint64_t seed : options.row_seeds) {
      gens.push_back(at::make_generator<at::CPUGeneratorImpl>(seed));
    }
  }
  try {
    KvCache cache;
    Clock::time_point start = Clock::now();
    torch::Tensor hidden = model.Prefill(prompts, seq + options.max_new_tokens, cache);
    torch::Tensor logits = model.Head(hidden.narrow(1, seq - 1, 1)).squeeze(1);
    DecodeStepper stepper(model, cache, batch, options);
    bool prefill_done = false;
    while (true) {
      const torch::Tensor next = NextTokens(logits, options, gens);
      if (!prefill_done) {
        out.prefill_seconds = SecondsSince(start);
        start = Clock::now();
        prefill_done = true;
      }
      const auto token = next.accessor<int64_t, 1>();
      torch::Tensor feed = next.clone();
      auto fed = feed.accessor<int64_t, 1>();
      bool local_done = true;
      for (int64_t b = 0; b < batch; ++b) {
        const auto r = static_cast<size_t>(b);
        if (!done[r]) {
          out.tokens[r].push_back(token[b]);
          ++out.new_tokens;
          if (is_eos(token[b])) {
            done[r] = true;
            out.stopped[r] = true;
          } else if (static_cast<int64_t>(out.tokens[r].size()) >= options.max_new_tokens) {
            done[r] = true;
          }
        }
        if (done[r]) fed[b] = options.pad_token_id;
        local_done = local_done && done[r];
      }
      if (options.all_done ? options.all_done(local_done) : local_done) break;
      logits = stepper.Step(feed);
      ++out.decode_steps;
    }
    out.decode_seconds = SecondsSince(start);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(e.what_without_backtrace());
  }
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

}  // namespace trainctl::model
