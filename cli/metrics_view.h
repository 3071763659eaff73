// How trainctl prints a job's metric history (GetMetrics): `trainctl metrics` as a table or CSV,
// and the loss / reward charts of `trainctl describe`. Pure: a response in, text out.
#ifndef TRAINCTL_CLI_METRICS_VIEW_H_
#define TRAINCTL_CLI_METRICS_VIEW_H_

#include <string>
#include <vector>

#include "cli/chart.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::cli {

// One row per (stage, step), one column per metric name (in the response's order of first
// appearance), "-" where a metric has no value at that step. A STAGE column comes first when the
// job is a pipeline (a series names its stage). Rows in stage order, then by step.
std::string MetricsTable(const trainctl::v1::GetMetricsResponse& response);

// The same rows as CSV (RFC 4180): header "step,<names>" ("stage,step,<names>" for a pipeline),
// values with full precision ("%.17g"), empty cells where there is no value.
std::string MetricsCsv(const trainctl::v1::GetMetricsResponse& response);

// A titled chart ("loss", or "loss  (stage sft)") of each series whose name is in `names`, in the
// order of `names`, then of the stages. Empty when there is none.
std::string MetricCharts(const trainctl::v1::GetMetricsResponse& response,
                         const std::vector<std::string>& names,
                         const ChartOptions& options = ChartOptions());

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_METRICS_VIEW_H_
