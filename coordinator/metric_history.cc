#include "coordinator/metric_history.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainctl {

std::vector<size_t> EvenlySpacedIndices(size_t n, size_t max) {
  max = std::max<size_t>(max, 2);
  std::vector<size_t> out;
  if (n <= max) {
    for (size_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  for (size_t k = 0; k < max; ++k) {
    // Rounded positions of k * (n-1) / (max-1): strictly increasing since n > max.
    out.push_back(static_cast<size_t>(
        std::llround(static_cast<double>(k) * static_cast<double>(n - 1) / (max - 1))));
  }
  return out;
}

absl::StatusOr<trainctl::v1::GetMetricsResponse> BuildMetricHistory(
    const std::vector<trainctl::v1::JobEvent>& events, const std::vector<std::string>& names,
    int max_points) {
  if (max_points < 0 || max_points > kMaxMetricPoints) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_points must be in [0, ", kMaxMetricPoints, "], got ", max_points));
  }
  const size_t max = max_points == 0 ? kDefaultMetricPoints : static_cast<size_t>(max_points);
  const std::set<std::string> wanted(names.begin(), names.end());
  if (wanted.count("")) return absl::InvalidArgumentError("names: an empty metric name");

  std::vector<std::string> stages;  // in order of first appearance
  // (stage index, name) -> step -> point
  std::map<std::pair<size_t, std::string>, std::map<int64_t, trainctl::v1::MetricPoint>> series;
  for (const trainctl::v1::JobEvent& e : events) {
    if (!e.has_metric()) continue;
    auto stage = std::find(stages.begin(), stages.end(), e.stage());
    if (stage == stages.end()) stage = stages.insert(stages.end(), e.stage());
    const size_t stage_index = static_cast<size_t>(stage - stages.begin());
    for (const auto& [name, value] : e.metric().values()) {
      if (!wanted.empty() && !wanted.count(name)) continue;
      trainctl::v1::MetricPoint& point = series[{stage_index, name}][e.metric().step()];
      point.set_step(e.metric().step());
      point.set_value(value);
      *point.mutable_time() = e.time();
    }
  }
  trainctl::v1::GetMetricsResponse response;
  for (const auto& [key, by_step] : series) {
    trainctl::v1::MetricSeries* out = response.add_series();
    out->set_stage(stages[key.first]);
    out->set_name(key.second);
    const std::vector<trainctl::v1::MetricPoint> points = [&] {
      std::vector<trainctl::v1::MetricPoint> v;
      v.reserve(by_step.size());
      for (const auto& [step, point] : by_step) v.push_back(point);
      return v;
    }();
    for (size_t i : EvenlySpacedIndices(points.size(), max)) *out->add_points() = points[i];
  }
  return response;
}

}  // namespace trainctl
