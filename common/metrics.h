// The daemons' Prometheus metrics on prometheus-cpp (Debian's prometheus-cpp-dev 1.0): families,
// their series (prometheus::Counter, Gauge, Histogram) and the text format 0.0.4
// (prometheus::TextSerializer) are prometheus-cpp's; metrics_http.h serves a Registry. What this
// file adds is what prometheus-cpp 1.0 leaves out:
//
// - Collect on scrape: collectors that refresh series from state kept elsewhere, run before each
//   Collect (prometheus-cpp has no hook for it).
// - Every family added is declared (HELP and TYPE) even while it has no series, in the order
//   added; prometheus-cpp leaves such families out, and deploy/'s queries are checked against
//   what a daemon with no job or GPU declares (tests/deploy/prometheus_test.cc).
// - An exposition that parses whatever the inputs: HELP text escaped (prometheus-cpp writes it
//   as is) and label values that are not UTF-8 repaired (Prometheus drops a whole scrape for one
//   such value).
//
// Series: `family.Add({{"kind", "sft"}})` is the child for those labels, made on first use; it
// takes the family's lock and allocates, so hot paths keep the reference. A histogram's Add needs
// its bounds each time: `family.Add(labels, LatencyBuckets())`. Counter::Increment and Gauge::Set
// are atomics; Histogram::Observe takes the histogram's own mutex. A child's address is stable
// until RemoveSeries/RemoveAllSeries drops it. The exposition writes labels sorted by name.
//
// Names follow Prometheus conventions: a `trainctl_` prefix, base units (seconds, bytes, ratios),
// `_total` for counters only (promtool checks them in the tests). A bad name or one added twice is
// a programming error: the process aborts with a message naming it.
//
// Thread-safe.
#ifndef TRAINCTL_COMMON_METRICS_H_
#define TRAINCTL_COMMON_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/labels.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace trainctl::metrics {

// The exact Content-Type of the text format 0.0.4.
inline constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

class Registry : public prometheus::Collectable {
 public:
  Registry();
  ~Registry() override;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Adds a family (owned by the registry: the reference lives as long as it does).
  prometheus::Family<prometheus::Counter>& AddCounter(const std::string& name,
                                                      const std::string& help);
  prometheus::Family<prometheus::Gauge>& AddGauge(const std::string& name, const std::string& help);
  prometheus::Family<prometheus::Histogram>& AddHistogram(const std::string& name,
                                                          const std::string& help);

  // Runs before every Collect, in the order added, e.g. to refresh gauges from a snapshot of state
  // kept elsewhere. Must not call Collect or Render.
  void AddCollector(std::function<void()> collect);

  // Runs the collectors, then gathers every family in the order added (one at a time).
  std::vector<prometheus::MetricFamily> Collect() const override;
  // Collect() in the text format 0.0.4.
  std::string Render() const;

 private:
  template <typename T>
  prometheus::Family<T>& Add(const std::string& name, const std::string& help);

  struct Entry {
    const prometheus::Collectable* family;
    prometheus::MetricFamily declared;  // name, help (escaped) and type; no series
  };

  prometheus::Registry registry_;  // owns the families; refuses a name twice
  mutable absl::Mutex mu_;
  std::deque<Entry> entries_ ABSL_GUARDED_BY(mu_);  // a deque: Collect keeps pointers
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex collect_mu_;  // one Collect (and its collectors) at a time
};

// Drops the series with exactly these labels, if there is one (prometheus::Family::Remove takes
// the child itself). Counters and gauges.
template <typename T>
void RemoveSeries(prometheus::Family<T>& family, const prometheus::Labels& labels) {
  if (family.Has(labels)) family.Remove(&family.Add(labels));
}

// Drops every series of a counter or gauge family.
template <typename T>
void RemoveAllSeries(prometheus::Family<T>& family) {
  for (const prometheus::MetricFamily& collected : family.Collect()) {
    for (const prometheus::ClientMetric& series : collected.metric) {
      prometheus::Labels labels;
      for (const prometheus::ClientMetric::Label& label : series.label) {
        labels.emplace(label.name, label.value);
      }
      RemoveSeries(family, labels);
    }
  }
}

// `count` bounds start, start*factor, ...
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// Request latencies in seconds: 0.5 ms .. ~30 s.
const std::vector<double>& LatencyBuckets();

}  // namespace trainctl::metrics

#endif  // TRAINCTL_COMMON_METRICS_H_
