// attention_bench: one image's vision attention (Qwen2-VL-2B's tower: 16 heads of 80) over
// --patches patches, eager, in query blocks under the default score budget (model/attention.h)
// against one [heads, N, N] score matrix (the budget lifted), same inputs, same run. Prints each
// path's seconds, the growth of the process's peak resident set while it ran, and the largest
// score tensor it built; then blocked/whole ratios and the largest difference of the outputs.
// The blocked path runs first: the peak resident set only grows, so each path's growth is read
// against the same baseline.
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "worker/trainer/model/attention.h"
#include "worker/trainer/model/host_runtime.h"

ABSL_FLAG(int64_t, patches, 4096, "patches of the image (a 64x64 grid is 4096)");
ABSL_FLAG(int64_t, heads, 16, "attention heads");
ABSL_FLAG(int64_t, head_dim, 80, "per-head width");
ABSL_FLAG(int, threads, 0, "LibTorch intra-op threads (0: LibTorch's default)");

namespace {

using trainctl::model::AttentionImpl;

int64_t PeakRssKib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

struct Run {
  double seconds = 0;
  int64_t peak_growth_mib = 0;
  int64_t largest_scores = 0;
  torch::Tensor out;
};

Run Measure(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
            int64_t budget) {
  trainctl::model::SetAttentionScoreBudget(budget);
  trainctl::model::ResetLargestAttentionScores();
  const int64_t before = PeakRssKib();
  const auto start = std::chrono::steady_clock::now();
  Run run;
  run.out = trainctl::model::DotProductAttention(AttentionImpl::kEager, q, k, v, {}, false);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.peak_growth_mib = (PeakRssKib() - before) / 1024;
  run.largest_scores = trainctl::model::LargestAttentionScores();
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_threads) > 0)
    trainctl::model::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  const int64_t n = absl::GetFlag(FLAGS_patches), h = absl::GetFlag(FLAGS_heads),
                d = absl::GetFlag(FLAGS_head_dim);
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const torch::Tensor q = torch::randn({1, h, n, d}), k = torch::randn({1, h, n, d}),
                      v = torch::randn({1, h, n, d});
  const int64_t budget = trainctl::model::kDefaultAttentionScoreBudget;
  const Run blocked = Measure(q, k, v, budget);
  const Run whole = Measure(q, k, v, int64_t{1} << 62);
  trainctl::model::SetAttentionScoreBudget(budget);
  absl::PrintF("one image: %d patches, %d heads x %d, eager, float32, %d threads\n", n, h, d,
               torch::get_num_threads());
  absl::PrintF("%-28s %9s %16s %18s\n", "path", "seconds", "peak RSS growth", "largest scores");
  absl::PrintF("%-28s %9.3f %12d MiB %18d\n",
               absl::StrFormat("blocks of %d rows", trainctl::model::AttentionQueryChunk(h, n, n)),
               blocked.seconds, blocked.peak_growth_mib, blocked.largest_scores);
  absl::PrintF("%-28s %9.3f %12d MiB %18d\n", "one [heads, N, N] matrix", whole.seconds,
               whole.peak_growth_mib, whole.largest_scores);
  absl::PrintF("peak growth whole / blocked: %.1fx; time blocked / whole: %.2fx; max |diff| %.2e\n",
               static_cast<double>(whole.peak_growth_mib) /
                   static_cast<double>(std::max<int64_t>(1, blocked.peak_growth_mib)),
               blocked.seconds / whole.seconds,
               (blocked.out - whole.out).abs().max().item<double>());
  return 0;
}
