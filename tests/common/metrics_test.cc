#include "common/metrics.h"

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsRender, ExactTextForASmallRegistry) {
  Registry registry;
  auto& requests =
      registry.AddCounter("trainctl_requests_total", "Requests served.", {"method", "code"});
  requests.WithLabels({"Get", "OK"}).Inc(3);
  requests.WithLabels({"Add", "OK"}).Inc();
  registry.AddGauge("trainctl_queue_depth", "Jobs waiting.").Get().Set(7);
  auto& pass =
      registry.AddHistogram("trainctl_pass_duration_seconds", "One pass.", {}, {0.125, 1, 2.5});
  for (double v : {0.0625, 0.125, 2.0, 10.0}) pass.Get().Observe(v);

  EXPECT_EQ(registry.Render(),
            "# HELP trainctl_requests_total Requests served.\n"
            "# TYPE trainctl_requests_total counter\n"
            "trainctl_requests_total{method=\"Add\",code=\"OK\"} 1\n"
            "trainctl_requests_total{method=\"Get\",code=\"OK\"} 3\n"
            "# HELP trainctl_queue_depth Jobs waiting.\n"
            "# TYPE trainctl_queue_depth gauge\n"
            "trainctl_queue_depth 7\n"
            "# HELP trainctl_pass_duration_seconds One pass.\n"
            "# TYPE trainctl_pass_duration_seconds histogram\n"
            "trainctl_pass_duration_seconds_bucket{le=\"0.125\"} 2\n"
            "trainctl_pass_duration_seconds_bucket{le=\"1\"} 2\n"
            "trainctl_pass_duration_seconds_bucket{le=\"2.5\"} 3\n"
            "trainctl_pass_duration_seconds_bucket{le=\"+Inf\"} 4\n"
            "trainctl_pass_duration_seconds_sum 12.1875\n"
            "trainctl_pass_duration_seconds_count 4\n");
}

TEST(MetricsRender, UnlabelledFamiliesShowZeroBeforeFirstUpdate) {
  Registry registry;
  registry.AddCounter("trainctl_cancellations_total", "Cancels.");
  registry.AddGauge("trainctl_jobs", "Jobs.", {"state"});  // no children yet: header only
  EXPECT_EQ(registry.Render(),
            "# HELP trainctl_cancellations_total Cancels.\n"
            "# TYPE trainctl_cancellations_total counter\n"
            "trainctl_cancellations_total 0\n"
            "# HELP trainctl_jobs Jobs.\n"
            "# TYPE trainctl_jobs gauge\n");
}

TEST(MetricsRender, EscapesLabelValuesAndHelp) {
  Registry registry;
  auto& info = registry.AddGauge("trainctl_info", "Line one\nback\\slash \"quoted\"", {"name"});
  info.WithLabels({"a\\b\"c\nd"}).Set(1);
  EXPECT_EQ(registry.Render(),
            "# HELP trainctl_info Line one\\nback\\\\slash \"quoted\"\n"
            "# TYPE trainctl_info gauge\n"
            "trainctl_info{name=\"a\\\\b\\\"c\\nd\"} 1\n");
}

TEST(MetricsRender, RepairsInvalidUtf8InLabelValues) {
  Registry registry;
  registry.AddGauge("trainctl_info", "Info.", {"name"}).WithLabels({"ok\xff"}).Set(1);
  const std::string text = registry.Render();
  EXPECT_THAT(text, Not(HasSubstr("\xff")));
  EXPECT_THAT(text, HasSubstr("trainctl_info{name=\"ok"));
}

TEST(MetricsRender, FormatsSpecialAndOrdinaryValues) {
  Registry registry;
  auto& value = registry.AddGauge("trainctl_value", "Values.", {"case"});
  value.WithLabels({"a_nan"}).Set(std::numeric_limits<double>::quiet_NaN());
  value.WithLabels({"b_pos_inf"}).Set(std::numeric_limits<double>::infinity());
  value.WithLabels({"c_neg_inf"}).Set(-std::numeric_limits<double>::infinity());
  value.WithLabels({"d_million"}).Set(1e6);
  value.WithLabels({"e_negative"}).Set(-2);
  value.WithLabels({"f_fraction"}).Set(0.1);
  value.WithLabels({"g_huge"}).Set(1e20);
  value.WithLabels({"h_tiny"}).Set(1.5e-7);
  value.WithLabels({"i_big_int"}).Set(9007199254740991.0);  // 2^53 - 1
  value.WithLabels({"j_neg_zero"}).Set(-0.0);
  EXPECT_EQ(registry.Render(),
            "# HELP trainctl_value Values.\n"
            "# TYPE trainctl_value gauge\n"
            "trainctl_value{case=\"a_nan\"} NaN\n"
            "trainctl_value{case=\"b_pos_inf\"} +Inf\n"
            "trainctl_value{case=\"c_neg_inf\"} -Inf\n"
            "trainctl_value{case=\"d_million\"} 1000000\n"
            "trainctl_value{case=\"e_negative\"} -2\n"
            "trainctl_value{case=\"f_fraction\"} 0.1\n"
            "trainctl_value{case=\"g_huge\"} 1e+20\n"
            "trainctl_value{case=\"h_tiny\"} 1.5e-07\n"
            "trainctl_value{case=\"i_big_int\"} 9007199254740991\n"
            "trainctl_value{case=\"j_neg_zero\"} 0\n");
}

TEST(MetricsHistogram, BucketsAreCumulativeWithLabelsAndLe) {
  Registry registry;
  auto& rpc =
      registry.AddHistogram("trainctl_rpc_duration_seconds", "RPC latency.", {"method"}, {0.5, 1});
  Histogram& submit = rpc.WithLabels({"Submit"});
  submit.Observe(0.5);  // le is inclusive
  submit.Observe(0.75);
  submit.Observe(std::nan(""));  // NaN lands in +Inf, as client_golang does
  const Histogram::Snapshot snapshot = submit.Take();
  EXPECT_EQ(snapshot.counts, (std::vector<uint64_t>{1, 1, 1}));
  EXPECT_EQ(snapshot.count, 3u);
  EXPECT_TRUE(std::isnan(snapshot.sum));
  EXPECT_EQ(registry.Render(),
            "# HELP trainctl_rpc_duration_seconds RPC latency.\n"
            "# TYPE trainctl_rpc_duration_seconds histogram\n"
            "trainctl_rpc_duration_seconds_bucket{method=\"Submit\",le=\"0.5\"} 1\n"
            "trainctl_rpc_duration_seconds_bucket{method=\"Submit\",le=\"1\"} 2\n"
            "trainctl_rpc_duration_seconds_bucket{method=\"Submit\",le=\"+Inf\"} 3\n"
            "trainctl_rpc_duration_seconds_sum{method=\"Submit\"} NaN\n"
            "trainctl_rpc_duration_seconds_count{method=\"Submit\"} 3\n");
}

TEST(MetricsHistogram, BucketHelpers) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  const std::vector<double>& latency = LatencyBuckets();
  ASSERT_FALSE(latency.empty());
  EXPECT_DOUBLE_EQ(latency.front(), 0.0005);
  EXPECT_GT(latency.back(), 30);
  EXPECT_LT(latency.back(), 60);
  for (size_t i = 1; i < latency.size(); ++i) EXPECT_LT(latency[i - 1], latency[i]);
}

TEST(MetricsValues, CounterIgnoresNegativeAndGaugeAdds) {
  Registry registry;
  Counter& counter = registry.AddCounter("trainctl_things_total", "Things.").Get();
  counter.Inc(2.5);
  counter.Inc(-1);
  counter.Inc(std::nan(""));
  EXPECT_EQ(counter.Value(), 2.5);
  Gauge& gauge = registry.AddGauge("trainctl_level", "Level.").Get();
  gauge.Set(10);
  gauge.Add(-3.5);
  EXPECT_EQ(gauge.Value(), 6.5);
}

TEST(MetricsFamily, RemoveAndClearDropChildren) {
  Registry registry;
  auto& step = registry.AddGauge("trainctl_job_step", "Step.", {"job"});
  step.WithLabels({"j1"}).Set(1);
  step.WithLabels({"j2"}).Set(2);
  EXPECT_EQ(&step.WithLabels({"j1"}), &step.WithLabels({"j1"}));  // one child per value list
  step.Remove({"j1"});
  step.Remove({"never-there"});  // harmless
  EXPECT_THAT(registry.Render(), Not(HasSubstr("j1")));
  EXPECT_THAT(registry.Render(), HasSubstr("trainctl_job_step{job=\"j2\"} 2\n"));
  EXPECT_EQ(step.WithLabels({"j1"}).Value(), 0);  // made again, fresh
  step.Clear();
  EXPECT_EQ(registry.Render(), "# HELP trainctl_job_step Step.\n# TYPE trainctl_job_step gauge\n");
}

TEST(MetricsRegistry, CollectorsRunBeforeEveryRender) {
  Registry registry;
  Gauge& depth = registry.AddGauge("trainctl_queue_depth", "Depth.").Get();
  int calls = 0;
  registry.AddCollector([&] { depth.Set(++calls); });
  EXPECT_THAT(registry.Render(), HasSubstr("trainctl_queue_depth 1\n"));
  EXPECT_THAT(registry.Render(), HasSubstr("trainctl_queue_depth 2\n"));
}

TEST(MetricsConcurrency, TwoThreadsCountExactly) {
  Registry registry;
  Counter& counter = registry.AddCounter("trainctl_hits_total", "Hits.").Get();
  Gauge& gauge = registry.AddGauge("trainctl_balance", "Balance.").Get();
  Histogram& histogram =
      registry.AddHistogram("trainctl_work_seconds", "Work.", {}, {0.5, 2}).Get();
  constexpr int kPerThread = 200000;
  auto work = [&] {
    for (int i = 0; i < kPerThread; ++i) {
      counter.Inc();
      gauge.Add(2);
      histogram.Observe(1);
    }
  };
  std::thread a(work);
  std::thread b(work);
  // Rendering meanwhile takes only the family locks, never blocking the updates.
  for (int i = 0; i < 20; ++i) registry.Render();
  a.join();
  b.join();
  EXPECT_EQ(counter.Value(), 2.0 * kPerThread);
  EXPECT_EQ(gauge.Value(), 4.0 * kPerThread);
  const Histogram::Snapshot snapshot = histogram.Take();
  EXPECT_EQ(snapshot.count, 2u * kPerThread);
  EXPECT_EQ(snapshot.counts, (std::vector<uint64_t>{0, 2u * kPerThread, 0}));
  EXPECT_EQ(snapshot.sum, 2.0 * kPerThread);
}

TEST(MetricsConcurrency, ChildrenMadeFromManyThreadsAreOne) {
  Registry registry;
  auto& family = registry.AddCounter("trainctl_calls_total", "Calls.", {"method"});
  auto work = [&] {
    for (int i = 0; i < 10000; ++i) family.WithLabels({i % 2 ? "A" : "B"}).Inc();
  };
  std::thread a(work);
  std::thread b(work);
  a.join();
  b.join();
  EXPECT_EQ(family.WithLabels({"A"}).Value(), 10000);
  EXPECT_EQ(family.WithLabels({"B"}).Value(), 10000);
}

class MetricsDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(MetricsDeathTest, BadMetricNamesAbortNamingThem) {
  Registry registry;
  EXPECT_DEATH(registry.AddGauge("trainctl-bad", "x"), "bad metric name \"trainctl-bad\"");
  EXPECT_DEATH(registry.AddGauge("9lives", "x"), "bad metric name \"9lives\"");
  EXPECT_DEATH(registry.AddGauge("", "x"), "bad metric name \"\"");
  EXPECT_DEATH(registry.AddCounter("trainctl_hits", "x"),
               "counter \"trainctl_hits\" must end in _total");
  EXPECT_DEATH(registry.AddGauge("trainctl_hits_total", "x"), "must not end in _total");
}

TEST_F(MetricsDeathTest, BadLabelNamesAbortNamingThem) {
  Registry registry;
  EXPECT_DEATH(registry.AddGauge("trainctl_a", "x", {"has-dash"}), "bad label name \"has-dash\"");
  EXPECT_DEATH(registry.AddGauge("trainctl_a", "x", {"__reserved"}),
               "bad label name \"__reserved\"");
  EXPECT_DEATH(registry.AddGauge("trainctl_a", "x", {"a:b"}), "bad label name \"a:b\"");
  EXPECT_DEATH(registry.AddGauge("trainctl_a", "x", {"job", "job"}), "label name \"job\" twice");
  EXPECT_DEATH(registry.AddHistogram("trainctl_h_seconds", "x", {"le"}, {1}),
               "\"le\" on histogram \"trainctl_h_seconds\" is reserved");
  registry.AddGauge("trainctl_le_ok", "le is only reserved on histograms", {"le"});
}

TEST_F(MetricsDeathTest, ClashesBoundsAndLabelCountsAbort) {
  Registry registry;
  registry.AddGauge("trainctl_depth", "x");
  EXPECT_DEATH(registry.AddGauge("trainctl_depth", "again"), "\"trainctl_depth\" clashes");
  registry.AddHistogram("trainctl_wait_seconds", "x", {}, {1});
  EXPECT_DEATH(registry.AddGauge("trainctl_wait_seconds_count", "x"),
               "\"trainctl_wait_seconds_count\" clashes with \"trainctl_wait_seconds\"");
  EXPECT_DEATH(registry.AddHistogram("trainctl_b_seconds", "x", {}, {2, 1}), "must ascend");
  EXPECT_DEATH(registry.AddHistogram("trainctl_c_seconds", "x", {}, {1, INFINITY}),
               "must not list \\+Inf");
  auto& jobs = registry.AddGauge("trainctl_jobs", "x", {"state", "kind"});
  EXPECT_DEATH(jobs.WithLabels({"running"}), "\"trainctl_jobs\" has labels \\[state, kind\\]");
  EXPECT_DEATH(ExponentialBuckets(0, 2, 3), "ExponentialBuckets");
}

}  // namespace
}  // namespace trainctl::metrics
