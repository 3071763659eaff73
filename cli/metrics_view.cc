#include "cli/metrics_view.h"

#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/table.h"

namespace trainctl::cli {
namespace {

using trainctl::v1::GetMetricsResponse;

// The response as a grid: names (columns), stages, and (stage index, step) -> name index -> value.
struct Grid {
  std::vector<std::string> names;
  std::vector<std::string> stages;
  bool pipeline = false;
  std::map<std::pair<size_t, int64_t>, std::map<size_t, double>> rows;
};

size_t IndexOf(std::vector<std::string>& list, const std::string& s) {
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] == s) return i;
  }
  list.push_back(s);
  return list.size() - 1;
}

Grid MakeGrid(const GetMetricsResponse& response) {
  Grid g;
  for (const auto& series : response.series()) {
    const size_t name = IndexOf(g.names, series.name());
    const size_t stage = IndexOf(g.stages, series.stage());
    if (!series.stage().empty()) g.pipeline = true;
    for (const auto& p : series.points()) g.rows[{stage, p.step()}][name] = p.value();
  }
  return g;
}

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string quoted = "\"";
  for (char c : s) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

}  // namespace

std::string MetricsTable(const GetMetricsResponse& response) {
  const Grid g = MakeGrid(response);
  std::vector<std::string> header;
  if (g.pipeline) header.push_back("STAGE");
  header.push_back("STEP");
  for (const std::string& n : g.names) header.push_back(n);
  Table table(header);
  for (const auto& [key, values] : g.rows) {
    std::vector<std::string> row;
    if (g.pipeline) row.push_back(g.stages[key.first].empty() ? "-" : g.stages[key.first]);
    row.push_back(absl::StrCat(key.second));
    for (size_t i = 0; i < g.names.size(); ++i) {
      auto it = values.find(i);
      row.push_back(it == values.end() ? "-" : absl::StrFormat("%.6g", it->second));
    }
    table.AddRow(std::move(row));
  }
  std::ostringstream out;
  table.Print(out);
  return out.str();
}

std::string MetricsCsv(const GetMetricsResponse& response) {
  const Grid g = MakeGrid(response);
  std::vector<std::string> header;
  if (g.pipeline) header.push_back("stage");
  header.push_back("step");
  for (const std::string& n : g.names) header.push_back(CsvField(n));
  std::string out = absl::StrJoin(header, ",") + "\n";
  for (const auto& [key, values] : g.rows) {
    std::vector<std::string> row;
    if (g.pipeline) row.push_back(CsvField(g.stages[key.first]));
    row.push_back(absl::StrCat(key.second));
    for (size_t i = 0; i < g.names.size(); ++i) {
      auto it = values.find(i);
      row.push_back(it == values.end() ? "" : absl::StrFormat("%.17g", it->second));
    }
    absl::StrAppend(&out, absl::StrJoin(row, ","), "\n");
  }
  return out;
}

std::string MetricCharts(const GetMetricsResponse& response, const std::vector<std::string>& names,
                         const ChartOptions& options) {
  std::string out;
  for (const std::string& name : names) {
    for (const auto& series : response.series()) {
      if (series.name() != name) continue;
      std::vector<std::pair<double, double>> points;
      for (const auto& p : series.points()) {
        points.emplace_back(static_cast<double>(p.step()), p.value());
      }
      const std::string chart = RenderChart(points, options);
      if (chart.empty()) continue;
      absl::StrAppend(&out, name, series.stage().empty() ? "" : "  (stage " + series.stage() + ")",
                      "\n", chart);
    }
  }
  return out;
}

}  // namespace trainctl::cli
