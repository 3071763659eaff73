// metrics_bench: what the registry (common/metrics.h on prometheus-cpp) costs on a hot path and on
// a scrape, each against a peer measured in the same run:
//   - prometheus::Counter::Increment against a plain std::atomic<uint64_t>::fetch_add and a
//   mutex-protected double;
//   - prometheus::Histogram::Observe (LatencyBuckets) against a mutex-protected histogram of the
//   same buckets;
//   both on one thread and contended by 2 threads updating the same series (ns per update per
//   thread: wall time / updates each thread made);
//   - Registry::Render (prometheus-cpp's TextSerializer) of --jobs running jobs' per-job series
//   (13 gauges x 4 labels, as the coordinator exports) against appending the same bytes,
//   pre-formatted, to a std::string.
// Prints the best of --reps runs of each. See bench/README.md.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/metrics.h"

ABSL_FLAG(int64_t, updates, 20000000, "updates per thread per timed run");
ABSL_FLAG(int, reps, 5, "timed runs of each case; the best is kept");
ABSL_FLAG(int, jobs, 1000, "running jobs whose per-job series /metrics renders");

namespace {

using Clock = std::chrono::steady_clock;
using prometheus::Counter;
using prometheus::Histogram;
using trainctl::metrics::LatencyBuckets;
using trainctl::metrics::Registry;

// Best wall time over reps of `threads` threads each running body(updates); ns per update.
double NsPerUpdate(int threads, int64_t updates, int reps,
                   const std::function<void(int64_t)>& body) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        ready.fetch_add(1);
        while (!go.load()) {
        }
        body(updates);
      });
    }
    while (ready.load() < threads) {
    }
    const auto start = Clock::now();
    go = true;
    for (auto& thread : pool) thread.join();
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
    best = std::min(best, ns / static_cast<double>(updates));
  }
  return best;
}

// The obvious alternative to lock-free buckets: one mutex around the counts and the sum.
class LockedHistogram {
 public:
  explicit LockedHistogram(const std::vector<double>& bounds)
      : bounds_(bounds), counts_(bounds.size() + 1) {}
  void Observe(double value) {
    const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_[bucket];
    sum_ += value;
  }

 private:
  const std::vector<double> bounds_;
  std::mutex mu_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
};

struct LockedDouble {
  std::mutex mu;
  double value = 0;
};

void Row(const char* what, int threads, double ours, double peer, const char* peer_name) {
  std::printf("%-26s %d thread%s  %8.2f ns   %-26s %8.2f ns   ratio %5.2fx\n", what, threads,
              threads == 1 ? " " : "s", ours, peer_name, peer, ours / peer);
}

void UpdateCosts(int64_t updates, int reps) {
  // Latencies spread over the buckets (0.1 ms .. 60 s), cycled so the branch predictor cannot
  // learn a single bucket.
  std::vector<double> samples;
  for (double v = 0.0001; v < 60; v *= 1.37) samples.push_back(v);
  const size_t n = samples.size();

  for (int threads : {1, 2}) {
    Registry registry;
    Counter& counter = registry.AddCounter("trainctl_bench_total", "Bench.").Add({});
    std::atomic<uint64_t> plain{0};
    LockedDouble locked;
    const double inc = NsPerUpdate(threads, updates, reps, [&](int64_t k) {
      for (int64_t i = 0; i < k; ++i) counter.Increment();
    });
    const double atomic_add = NsPerUpdate(threads, updates, reps, [&](int64_t k) {
      for (int64_t i = 0; i < k; ++i) plain.fetch_add(1, std::memory_order_relaxed);
    });
    const double mutex_add = NsPerUpdate(threads, updates / 4, reps, [&](int64_t k) {
      for (int64_t i = 0; i < k; ++i) {
        std::lock_guard<std::mutex> lock(locked.mu);
        locked.value += 1;
      }
    });
    Row("Counter::Increment", threads, inc, atomic_add, "atomic<uint64_t>::fetch_add");
    Row("Counter::Increment", threads, inc, mutex_add, "mutex + double +=");

    Histogram& histogram =
        registry.AddHistogram("trainctl_bench_seconds", "Bench.").Add({}, LatencyBuckets());
    LockedHistogram locked_histogram(LatencyBuckets());
    const int64_t observes = updates / 4;
    const double observe = NsPerUpdate(threads, observes, reps, [&](int64_t k) {
      for (int64_t i = 0; i < k; ++i) histogram.Observe(samples[i % n]);
    });
    const double locked_observe = NsPerUpdate(threads, observes, reps, [&](int64_t k) {
      for (int64_t i = 0; i < k; ++i) locked_histogram.Observe(samples[i % n]);
    });
    Row("Histogram::Observe", threads, observe, locked_observe, "mutex histogram");
  }
}

// The coordinator's per-running-job gauges (deploy/prometheus/METRICS.md).
const char* const kJobGauges[] = {"trainctl_job_attempt",
                                  "trainctl_job_step",
                                  "trainctl_job_total_steps",
                                  "trainctl_job_progress_ratio",
                                  "trainctl_job_eta_seconds",
                                  "trainctl_job_loss",
                                  "trainctl_job_learning_rate",
                                  "trainctl_job_grad_norm",
                                  "trainctl_job_tokens_per_second",
                                  "trainctl_job_samples_per_second",
                                  "trainctl_job_mfu_ratio",
                                  "trainctl_job_reward",
                                  "trainctl_job_kl"};

void RenderCost(int jobs, int reps) {
  Registry registry;
  for (const char* name : kJobGauges) {
    auto& family = registry.AddGauge(name, "Latest logged step's value.");
    for (int j = 0; j < jobs; ++j) {
      family
          .Add({{"job", absl::StrFormat("%08x-%04x", 0x5eed0000 + j, j)},
                {"name", absl::StrCat("run-", j)},
                {"kind", j % 3 == 0 ? "grpo" : "sft"},
                {"nodes", absl::StrCat(1 + j % 8)}})
          .Set(0.001 * j + 1.0 / 3);
    }
  }
  std::string text;
  double best_render = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    text = registry.Render();
    best_render = std::min(best_render,
                           std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  // The peer: the same bytes, already formatted line by line, appended to a fresh string.
  std::vector<std::string> lines;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = text.find('\n', begin) + 1;
    lines.push_back(text.substr(begin, end - begin));
    begin = end;
  }
  double best_append = 1e300;
  size_t appended = 0;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    std::string out;
    for (const std::string& line : lines) out.append(line);
    appended = out.size();
    best_append = std::min(best_append,
                           std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  if (appended != text.size()) {
    std::fprintf(stderr, "peer appended %zu bytes, render made %zu\n", appended, text.size());
    std::exit(1);
  }
  std::printf(
      "Render: %d jobs x %zu gauges x 4 labels = %zu series, %zu bytes: %.2f ms "
      "(%.0f ns/series); string append of the same lines %.3f ms; ratio %.1fx\n",
      jobs, std::size(kJobGauges), jobs * std::size(kJobGauges), text.size(), best_render,
      best_render * 1e6 / static_cast<double>(jobs * std::size(kJobGauges)), best_append,
      best_render / best_append);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int reps = absl::GetFlag(FLAGS_reps);
  std::printf("metrics_bench: best of %d runs; %u hardware threads\n", reps,
              std::thread::hardware_concurrency());
  UpdateCosts(absl::GetFlag(FLAGS_updates), reps);
  RenderCost(absl::GetFlag(FLAGS_jobs), reps);
  return 0;
}
