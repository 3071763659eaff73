// A small Prometheus metrics registry: counters, gauges and histograms with labels, rendered in
// the text exposition format 0.0.4 (https://prometheus.io/docs/instrumenting/exposition_formats/).
// prometheus-cpp is not packaged for Debian 12, hence this; metrics_http.h serves it.
//
// Hot paths update a metric through a reference obtained once: `Family::WithLabels` takes the
// family's lock and may allocate; `Counter::Inc`, `Gauge::Set` and `Histogram::Observe` are
// lock-free (atomics). A child's address is stable until `Remove`/`Clear` drops it.
//
// Names follow Prometheus conventions: a `trainctl_` prefix, base units (seconds, bytes, ratios),
// `_total` for counters only. Names and label names are checked when a family is added (a bad one
// is a programming error: the process aborts with a message naming it).
//
// Thread-safe.
#ifndef TRAINCTL_COMMON_METRICS_H_
#define TRAINCTL_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace trainctl::metrics {

// The exact Content-Type of the text format 0.0.4.
inline constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// A monotonically increasing value. Inc with a negative amount is ignored.
class Counter {
 public:
  void Inc(double amount = 1);
  double Value() const;

 private:
  std::atomic<uint64_t> bits_{0};  // a double's bits
};

class Gauge {
 public:
  void Set(double value);
  void Add(double amount);
  double Value() const;

 private:
  std::atomic<uint64_t> bits_{0};
};

// Cumulative buckets with the given upper bounds (ascending; +Inf is implicit), a sum and a count.
class Histogram {
 public:
  explicit Histogram(const std::vector<double>* bounds);
  void Observe(double value);
  // Per-bucket counts (not cumulative), one more than bounds (the last is +Inf), the sum and count.
  struct Snapshot {
    std::vector<uint64_t> counts;
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Take() const;

 private:
  const std::vector<double>* const bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<uint64_t> sum_bits_{0};  // the count is the buckets' total (Take)
};

// `count` bounds start, start*factor, ...
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// Request latencies in seconds: 0.5 ms .. ~30 s.
const std::vector<double>& LatencyBuckets();

// One metric name with its label names, and one child per distinct label-value list.
template <typename T>
class Family {
 public:
  // The child for these label values (one per label name, in order), made on first use.
  T& WithLabels(const std::vector<std::string>& values);
  // The child without labels (a family with no label names).
  T& Get() { return WithLabels({}); }
  // Drops one child (e.g. a finished job's series), or every child.
  void Remove(const std::vector<std::string>& values);
  void Clear();

  const std::string& name() const { return name_; }

 private:
  friend class Registry;
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> bounds);

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // histograms only
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Adds a family; the same name twice is a programming error (abort). The reference lives as long
  // as the registry.
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          std::vector<std::string> label_names = {});
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names,
                                  std::vector<double> bounds);

  // Runs before every Render, in the order added, e.g. to refresh gauges from a snapshot of state
  // kept elsewhere (collect on scrape). Must not call Render.
  void AddCollector(std::function<void()> collect);

  // Every family, in the order added, in the text format 0.0.4 (HELP, TYPE, then one line per
  // child sorted by label values; histograms as _bucket{le=...}, _sum and _count).
  std::string Render();

 private:
  struct Entry;
  void AddEntry(std::unique_ptr<Entry> entry);  // aborts when its series names clash

  absl::Mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mu_);
  absl::Mutex render_mu_;  // one Render (and its collectors) at a time
};

}  // namespace trainctl::metrics

#endif  // TRAINCTL_COMMON_METRICS_H_
