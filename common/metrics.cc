#include "common/metrics.h"

#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/utf8.h"

namespace trainctl::metrics {
namespace {

// A bad name is a programming error caught the first time the binary starts, not an input error.
[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "trainctl metrics: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

// The text format escapes `\` and newlines in HELP; prometheus-cpp 1.0 writes HELP as given.
std::string EscapeHelp(const std::string& help) {
  return absl::StrReplaceAll(help, {{"\\", "\\\\"}, {"\n", "\\n"}});
}

// Label values must be UTF-8: one bad value fails the whole scrape in Prometheus.
void RepairLabels(prometheus::MetricFamily* family) {
  for (prometheus::ClientMetric& series : family->metric) {
    for (prometheus::ClientMetric::Label& label : series.label) {
      const bool ascii = std::none_of(label.value.begin(), label.value.end(),
                                      [](char c) { return static_cast<unsigned char>(c) >= 0x80; });
      if (!ascii && !IsValidUtf8(label.value)) label.value = ToValidUtf8(label.value);
    }
  }
}

template <typename T>
prometheus::detail::Builder<T> Builder();
template <>
prometheus::detail::Builder<prometheus::Counter> Builder<prometheus::Counter>() {
  return prometheus::BuildCounter();
}
template <>
prometheus::detail::Builder<prometheus::Gauge> Builder<prometheus::Gauge>() {
  return prometheus::BuildGauge();
}
template <>
prometheus::detail::Builder<prometheus::Histogram> Builder<prometheus::Histogram>() {
  return prometheus::BuildHistogram();
}

}  // namespace

Registry::Registry() : registry_(prometheus::Registry::InsertBehavior::Throw) {}
Registry::~Registry() = default;

template <typename T>
prometheus::Family<T>& Registry::Add(const std::string& name, const std::string& help) {
  Entry entry;
  entry.declared.name = name;
  entry.declared.help = EscapeHelp(help);
  entry.declared.type = T::metric_type;
  absl::MutexLock lock(&mu_);
  prometheus::Family<T>* family = nullptr;
  try {  // prometheus-cpp throws on a malformed name or one already registered
    family = &Builder<T>().Name(name).Help(entry.declared.help).Register(registry_);
  } catch (const std::exception& e) {
    Die(absl::StrCat("cannot add metric \"", name, "\": ", e.what()));
  }
  entry.family = family;
  entries_.push_back(std::move(entry));
  return *family;
}

prometheus::Family<prometheus::Counter>& Registry::AddCounter(const std::string& name,
                                                              const std::string& help) {
  return Add<prometheus::Counter>(name, help);
}

prometheus::Family<prometheus::Gauge>& Registry::AddGauge(const std::string& name,
                                                          const std::string& help) {
  return Add<prometheus::Gauge>(name, help);
}

prometheus::Family<prometheus::Histogram>& Registry::AddHistogram(const std::string& name,
                                                                  const std::string& help) {
  return Add<prometheus::Histogram>(name, help);
}

void Registry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::vector<prometheus::MetricFamily> Registry::Collect() const {
  absl::MutexLock collect_lock(&collect_mu_);
  std::vector<std::function<void()>> collectors;
  std::vector<const Entry*> entries;
  {
    absl::MutexLock lock(&mu_);
    collectors = collectors_;
  }
  // Collectors run without mu_ held: they may add families or series.
  for (const auto& collect : collectors) collect();
  {
    absl::MutexLock lock(&mu_);
    entries.reserve(entries_.size());
    for (const Entry& entry : entries_) entries.push_back(&entry);
  }
  std::vector<prometheus::MetricFamily> out;
  out.reserve(entries.size());
  for (const Entry* entry : entries) {
    std::vector<prometheus::MetricFamily> collected = entry->family->Collect();
    if (collected.empty()) {  // no series: declared all the same
      out.push_back(entry->declared);
      continue;
    }
    for (prometheus::MetricFamily& family : collected) {
      RepairLabels(&family);
      out.push_back(std::move(family));
    }
  }
  return out;
}

std::string Registry::Render() const { return prometheus::TextSerializer().Serialize(Collect()); }

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1) {
    Die(absl::StrCat("ExponentialBuckets(", start, ", ", factor, ", ", count,
                     "): want start > 0, factor > 1, count >= 1"));
  }
  std::vector<double> bounds;
  bounds.reserve(count);
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

const std::vector<double>& LatencyBuckets() {
  // 17 bounds, 0.5 ms doubling up to 0.5 ms * 2^16 = 32.8 s: an RPC deadline's worth.
  static const std::vector<double>* const kBounds =
      new std::vector<double>(ExponentialBuckets(0.0005, 2, 17));
  return *kBounds;
}

}  // namespace trainctl::metrics
