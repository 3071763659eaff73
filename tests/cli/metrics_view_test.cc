// `trainctl metrics`' table and CSV, and describe's charts, from a GetMetrics response.
#include "cli/metrics_view.h"

#include "gtest/gtest.h"

namespace trainctl::cli {
namespace {

using trainctl::v1::GetMetricsResponse;

void AddSeries(GetMetricsResponse* r, const std::string& name, const std::string& stage,
               std::vector<std::pair<int64_t, double>> points) {
  auto* s = r->add_series();
  s->set_name(name);
  s->set_stage(stage);
  for (const auto& [step, value] : points) {
    auto* p = s->add_points();
    p->set_step(step);
    p->set_value(value);
  }
}

TEST(MetricsViewTest, TableAndCsvHaveARowPerStep) {
  GetMetricsResponse r;
  AddSeries(&r, "learning_rate", "", {{10, 2e-5}, {20, 1e-5}});
  AddSeries(&r, "loss", "", {{10, 2.5}, {20, 1.25}, {30, 0.1}});
  EXPECT_EQ(MetricsTable(r),
            "STEP   learning_rate   loss\n"
            "10     2e-05           2.5\n"
            "20     1e-05           1.25\n"
            "30     -               0.1\n");
  EXPECT_EQ(MetricsCsv(r),
            "step,learning_rate,loss\n"
            "10,2.0000000000000002e-05,2.5\n"
            "20,1.0000000000000001e-05,1.25\n"
            "30,,0.10000000000000001\n");
}

TEST(MetricsViewTest, APipelineHasAStageColumnInStageOrder) {
  GetMetricsResponse r;
  AddSeries(&r, "loss", "sft", {{1, 2}, {2, 1}});
  AddSeries(&r, "loss", "grpo", {{1, 0.5}});
  AddSeries(&r, "reward", "grpo", {{1, 0.75}});
  EXPECT_EQ(MetricsTable(r),
            "STAGE   STEP   loss   reward\n"
            "sft     1      2      -\n"
            "sft     2      1      -\n"
            "grpo    1      0.5    0.75\n");
  EXPECT_EQ(MetricsCsv(r),
            "stage,step,loss,reward\n"
            "sft,1,2,\n"
            "sft,2,1,\n"
            "grpo,1,0.5,0.75\n");
}

TEST(MetricsViewTest, CsvQuotesWhatNeedsIt) {
  GetMetricsResponse r;
  AddSeries(&r, "rewards/\"iou\",mean", "", {{1, 1}});
  EXPECT_EQ(MetricsCsv(r), "step,\"rewards/\"\"iou\"\",mean\"\n1,1\n");
}

TEST(MetricsViewTest, ChartsOfTheAskedSeriesInOrder) {
  GetMetricsResponse r;
  AddSeries(&r, "reward", "grpo", {{1, 0}, {2, 1}});
  AddSeries(&r, "loss", "", {{1, 1}, {2, 0}});
  AddSeries(&r, "grad_norm", "", {{1, 1}, {2, 0}});
  EXPECT_EQ(MetricCharts(r, {"loss", "reward"}, {2, 2}),
            "loss\n"
            "1 ┤⢣ \n"
            "0 ┤ ⢣\n"
            "  └──\n"
            "   1 2\n"
            "reward  (stage grpo)\n"
            "1 ┤ ⡜\n"
            "0 ┤⡜ \n"
            "  └──\n"
            "   1 2\n");
  EXPECT_EQ(MetricCharts(r, {"accuracy"}), "");
}

}  // namespace
}  // namespace trainctl::cli
