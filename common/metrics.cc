#include "common/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/utf8.h"

namespace trainctl::metrics {
namespace {

uint64_t ToBits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

double FromBits(uint64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

void AtomicAdd(std::atomic<uint64_t>& bits, double amount) {
  uint64_t old_bits = bits.load(std::memory_order_relaxed);
  while (!bits.compare_exchange_weak(old_bits, ToBits(FromBits(old_bits) + amount),
                                     std::memory_order_relaxed, std::memory_order_relaxed)) {
  }
}

// A bad name is a programming error caught the first time the binary starts, not an input error.
[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "trainctl metrics: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

bool IsMetricNameChar(char c, bool first) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':') return true;
  return !first && c >= '0' && c <= '9';
}

bool IsLabelNameChar(char c, bool first) { return c != ':' && IsMetricNameChar(c, first); }

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

enum class Kind { kCounter, kGauge, kHistogram };

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kCounter:
      return "counter";
    case Kind::kGauge:
      return "gauge";
    case Kind::kHistogram:
      return "histogram";
  }
  return "untyped";
}

void CheckNames(const std::string& name, Kind kind, const std::vector<std::string>& label_names,
                const std::vector<double>& bounds) {
  bool ok = !name.empty();
  for (size_t i = 0; i < name.size() && ok; ++i) ok = IsMetricNameChar(name[i], i == 0);
  if (!ok) Die(absl::StrCat("bad metric name \"", name, "\": want [a-zA-Z_:][a-zA-Z0-9_:]*"));
  // promtool flags a counter without `_total` and anything else with it.
  if (kind == Kind::kCounter && !EndsWith(name, "_total")) {
    Die(absl::StrCat("counter \"", name, "\" must end in _total"));
  }
  if (kind != Kind::kCounter && EndsWith(name, "_total")) {
    Die(absl::StrCat(KindName(kind), " \"", name, "\" must not end in _total (counters only)"));
  }
  std::set<std::string> seen;
  for (const std::string& label : label_names) {
    bool label_ok = !label.empty();
    for (size_t i = 0; i < label.size() && label_ok; ++i) {
      label_ok = IsLabelNameChar(label[i], i == 0);
    }
    if (!label_ok || label.rfind("__", 0) == 0) {
      Die(absl::StrCat("bad label name \"", label, "\" on metric \"", name,
                       "\": want [a-zA-Z_][a-zA-Z0-9_]*, not starting with __"));
    }
    if (kind == Kind::kHistogram && label == "le") {
      Die(absl::StrCat("label name \"le\" on histogram \"", name, "\" is reserved for buckets"));
    }
    if (!seen.insert(label).second) {
      Die(absl::StrCat("label name \"", label, "\" twice on metric \"", name, "\""));
    }
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (std::isnan(bounds[i]) || (i > 0 && !(bounds[i - 1] < bounds[i]))) {
      Die(absl::StrCat("bucket bounds of histogram \"", name, "\" must ascend strictly"));
    }
    if (std::isinf(bounds[i]) && bounds[i] > 0) {
      Die(absl::StrCat("bucket bounds of histogram \"", name, "\" must not list +Inf (implicit)"));
    }
  }
}

// Label values and HELP text: UTF-8 is required by the format, so anything else is repaired.
void AppendEscaped(std::string* out, absl::string_view s, bool quote) {
  // The common case, plain ASCII with nothing to escape, in one scan and one append.
  const bool plain = std::none_of(s.begin(), s.end(), [](char c) {
    return static_cast<unsigned char>(c) >= 0x80 || c == '\\' || c == '\n' || c == '"';
  });
  if (plain) {
    out->append(s.data(), s.size());
    return;
  }
  if (!IsValidUtf8(s)) {
    AppendEscaped(out, ToValidUtf8(s), quote);
    return;
  }
  size_t clean_from = 0;  // copies runs that need no escape in one append
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const char* escaped = c == '\\'           ? "\\\\"
                          : c == '\n'         ? "\\n"
                          : quote && c == '"' ? "\\\""
                                              : nullptr;
    if (escaped == nullptr) continue;
    out->append(s.data() + clean_from, i - clean_from);
    out->append(escaped);
    clean_from = i + 1;
  }
  out->append(s.data() + clean_from, s.size() - clean_from);
}

// `{a="x",b="y"` without the closing brace, so a histogram can add `le`; nothing for no labels.
void AppendLabels(std::string* out, const std::vector<std::string>& names,
                  const std::vector<std::string>& values) {
  for (size_t i = 0; i < names.size(); ++i) {
    out->push_back(i == 0 ? '{' : ',');
    out->append(names[i]);
    out->append("=\"");
    AppendEscaped(out, values[i], /*quote=*/true);
    out->push_back('"');
  }
}

// Prometheus's Go parser reads any of these; Render's tests pin the exact text.
void AppendValue(std::string* out, double value) {
  if (std::isnan(value)) {
    out->append("NaN");
    return;
  }
  if (std::isinf(value)) {
    out->append(value > 0 ? "+Inf" : "-Inf");
    return;
  }
  char buf[64];
  std::to_chars_result result;
  // Integers (counts, steps, bytes) print as such: 1000000, not 1e+06.
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
    result = std::to_chars(buf, buf + sizeof(buf), static_cast<int64_t>(value));
  } else {
    result = std::to_chars(buf, buf + sizeof(buf), value);  // the shortest that reads back exact
  }
  out->append(buf, result.ptr - buf);
}

}  // namespace

void Counter::Inc(double amount) {
  if (!(amount >= 0)) return;  // negative or NaN: a counter never goes down
  AtomicAdd(bits_, amount);
}

double Counter::Value() const { return FromBits(bits_.load(std::memory_order_relaxed)); }

void Gauge::Set(double value) { bits_.store(ToBits(value), std::memory_order_relaxed); }

void Gauge::Add(double amount) { AtomicAdd(bits_, amount); }

double Gauge::Value() const { return FromBits(bits_.load(std::memory_order_relaxed)); }

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds), counts_(new std::atomic<uint64_t>[bounds->size() + 1]) {
  for (size_t i = 0; i <= bounds_->size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  // The first bucket whose bound is >= value (`le`); NaN goes to +Inf, as client_golang does.
  size_t bucket = bounds_->size();
  if (!std::isnan(value)) {
    bucket = std::lower_bound(bounds_->begin(), bounds_->end(), value) - bounds_->begin();
  }
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_bits_, value);
}

Histogram::Snapshot Histogram::Take() const {
  Snapshot snapshot;
  snapshot.counts.resize(bounds_->size() + 1);
  for (size_t i = 0; i < snapshot.counts.size(); ++i) {
    snapshot.counts[i] = counts_[i].load(std::memory_order_relaxed);
    // The count is the buckets' total (no counter of its own: one atomic less per Observe), so
    // _count always equals the +Inf bucket even while an Observe runs.
    snapshot.count += snapshot.counts[i];
  }
  snapshot.sum = FromBits(sum_bits_.load(std::memory_order_relaxed));
  return snapshot;
}

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

namespace {
template <typename T>
std::unique_ptr<T> MakeChild(const std::vector<double>*) {
  return std::make_unique<T>();
}
template <>
std::unique_ptr<Histogram> MakeChild<Histogram>(const std::vector<double>* bounds) {
  return std::make_unique<Histogram>(bounds);
}
}  // namespace

template <typename T>
Family<T>::Family(std::string name, std::string help, std::vector<std::string> label_names,
                  std::vector<double> bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)),
      bounds_(std::move(bounds)) {
  // A family without labels always shows its one series, 0 until first updated.
  if (label_names_.empty()) WithLabels({});
}

template <typename T>
T& Family<T>::WithLabels(const std::vector<std::string>& values) {
  if (values.size() != label_names_.size()) {
    Die(absl::StrCat("metric \"", name_, "\" has labels [", absl::StrJoin(label_names_, ", "),
                     "] but got ", values.size(), " values [", absl::StrJoin(values, ", "), "]"));
  }
  absl::MutexLock lock(&mu_);
  std::unique_ptr<T>& child = children_[values];
  if (child == nullptr) child = MakeChild<T>(&bounds_);
  return *child;
}

template <typename T>
void Family<T>::Remove(const std::vector<std::string>& values) {
  absl::MutexLock lock(&mu_);
  children_.erase(values);
}

template <typename T>
void Family<T>::Clear() {
  absl::MutexLock lock(&mu_);
  children_.clear();
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

namespace {

void AppendHeader(std::string* out, const std::string& name, const std::string& help, Kind kind) {
  out->append("# HELP ");
  out->append(name);
  out->push_back(' ');
  AppendEscaped(out, help, /*quote=*/false);
  out->append("\n# TYPE ");
  out->append(name);
  out->push_back(' ');
  out->append(KindName(kind));
  out->push_back('\n');
}

template <typename T>
void AppendChild(std::string* out, const std::string& name, const std::vector<double>&,
                 const std::vector<std::string>& label_names,
                 const std::vector<std::string>& values, const T& child) {
  out->append(name);
  if (!label_names.empty()) {
    AppendLabels(out, label_names, values);
    out->push_back('}');
  }
  out->push_back(' ');
  AppendValue(out, child.Value());
  out->push_back('\n');
}

void AppendChild(std::string* out, const std::string& name, const std::vector<double>& bounds,
                 const std::vector<std::string>& label_names,
                 const std::vector<std::string>& values, const Histogram& child) {
  const Histogram::Snapshot snapshot = child.Take();
  std::string labels;
  AppendLabels(&labels, label_names, values);
  const std::string bucket_prefix =
      absl::StrCat(name, "_bucket", labels, labels.empty() ? "{" : ",", "le=\"");
  uint64_t cumulative = 0;
  for (size_t i = 0; i < snapshot.counts.size(); ++i) {
    cumulative += snapshot.counts[i];
    out->append(bucket_prefix);
    AppendValue(out, i < bounds.size() ? bounds[i] : INFINITY);
    out->append("\"} ");
    AppendValue(out, static_cast<double>(cumulative));
    out->push_back('\n');
  }
  const std::string closed = labels.empty() ? labels : labels + "}";
  absl::StrAppend(out, name, "_sum", closed, " ");
  AppendValue(out, snapshot.sum);
  absl::StrAppend(out, "\n", name, "_count", closed, " ");
  AppendValue(out, static_cast<double>(snapshot.count));
  out->push_back('\n');
}

// Every series name a family produces, so that e.g. a histogram `x` and a gauge `x_count` clash.
std::vector<std::string> SeriesNames(const std::string& name, Kind kind) {
  if (kind != Kind::kHistogram) return {name};
  return {name, name + "_bucket", name + "_sum", name + "_count"};
}

}  // namespace

// One family of any type. A member of Registry, so it may read Family's internals (Registry is
// its friend).
struct Registry::Entry {
  Kind kind;
  std::unique_ptr<Family<Counter>> counter;
  std::unique_ptr<Family<Gauge>> gauge;
  std::unique_ptr<Family<Histogram>> histogram;

  const std::string& name() const {
    return counter ? counter->name_ : gauge ? gauge->name_ : histogram->name_;
  }

  void Append(std::string* out) const {
    if (counter) AppendFamily(out, *counter);
    if (gauge) AppendFamily(out, *gauge);
    if (histogram) AppendFamily(out, *histogram);
  }

  template <typename T>
  void AppendFamily(std::string* out, Family<T>& family) const {
    AppendHeader(out, family.name_, family.help_, kind);
    absl::MutexLock lock(&family.mu_);
    for (const auto& [values, child] : family.children_) {
      AppendChild(out, family.name_, family.bounds_, family.label_names_, values, *child);
    }
  }

  // Aborts when a series name of `other` is one of ours: Prometheus would see one name twice.
  void CheckNoClash(const Entry& other) const {
    for (const std::string& a : SeriesNames(name(), kind)) {
      for (const std::string& b : SeriesNames(other.name(), other.kind)) {
        if (a == b) {
          Die(absl::StrCat("metric \"", name(), "\" clashes with \"", other.name(), "\" (series ",
                           a, ")"));
        }
      }
    }
  }
};

Registry::Registry() = default;
Registry::~Registry() = default;

void Registry::AddEntry(std::unique_ptr<Entry> entry) {
  absl::MutexLock lock(&mu_);
  for (const auto& other : entries_) entry->CheckNoClash(*other);
  entries_.push_back(std::move(entry));
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help,
                                      std::vector<std::string> label_names) {
  CheckNames(name, Kind::kCounter, label_names, {});
  auto entry = std::make_unique<Entry>();
  entry->kind = Kind::kCounter;
  entry->counter.reset(new Family<Counter>(name, help, std::move(label_names), {}));
  Family<Counter>& family = *entry->counter;
  AddEntry(std::move(entry));
  return family;
}

Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names) {
  CheckNames(name, Kind::kGauge, label_names, {});
  auto entry = std::make_unique<Entry>();
  entry->kind = Kind::kGauge;
  entry->gauge.reset(new Family<Gauge>(name, help, std::move(label_names), {}));
  Family<Gauge>& family = *entry->gauge;
  AddEntry(std::move(entry));
  return family;
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          std::vector<std::string> label_names,
                                          std::vector<double> bounds) {
  CheckNames(name, Kind::kHistogram, label_names, bounds);
  auto entry = std::make_unique<Entry>();
  entry->kind = Kind::kHistogram;
  entry->histogram.reset(
      new Family<Histogram>(name, help, std::move(label_names), std::move(bounds)));
  Family<Histogram>& family = *entry->histogram;
  AddEntry(std::move(entry));
  return family;
}

void Registry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string Registry::Render() {
  absl::MutexLock render_lock(&render_mu_);
  std::vector<std::function<void()>> collectors;
  std::vector<const Entry*> entries;
  {
    absl::MutexLock lock(&mu_);
    collectors = collectors_;
  }
  // Collectors run without mu_ held: they may add families or children.
  for (const auto& collect : collectors) collect();
  {
    absl::MutexLock lock(&mu_);
    entries.reserve(entries_.size());
    for (const auto& entry : entries_) entries.push_back(entry.get());
  }
  std::string out;
  for (const Entry* entry : entries) entry->Append(&out);
  return out;
}

}  // namespace trainctl::metrics
