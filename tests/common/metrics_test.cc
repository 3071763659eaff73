// metrics::Registry: prometheus-cpp's families and text format, plus what common/metrics.h adds
// (families declared without series, in the order added; collect on scrape; HELP escaping and
// UTF-8 repair; removing series by labels).
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

using ::prometheus::Counter;
using ::prometheus::Gauge;
using ::prometheus::Histogram;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsRender, ExactTextInTheOrderAddedWithEmptyFamiliesDeclared) {
  Registry registry;
  registry.AddGauge("trainctl_queue_depth", "Jobs waiting.").Add({}).Set(7);
  registry.AddCounter("trainctl_requests_total", "Requests served.")
      .Add({{"method", "Get"}, {"code", "OK"}})
      .Increment(3);
  registry.AddGauge("trainctl_jobs", "Jobs.");  // no series yet: declared all the same
  auto& pass = registry.AddHistogram("trainctl_pass_duration_seconds", "One pass.")
                   .Add({}, std::vector<double>{0.125, 1, 2.5});
  for (double v : {0.0625, 0.125, 2.0, 10.0}) pass.Observe(v);

  // Labels sorted by name; a histogram's _count and _sum before its buckets (prometheus-cpp).
  EXPECT_EQ(registry.Render(),
            "# HELP trainctl_queue_depth Jobs waiting.\n"
            "# TYPE trainctl_queue_depth gauge\n"
            "trainctl_queue_depth 7\n"
            "# HELP trainctl_requests_total Requests served.\n"
            "# TYPE trainctl_requests_total counter\n"
            "trainctl_requests_total{code=\"OK\",method=\"Get\"} 3\n"
            "# HELP trainctl_jobs Jobs.\n"
            "# TYPE trainctl_jobs gauge\n"
            "# HELP trainctl_pass_duration_seconds One pass.\n"
            "# TYPE trainctl_pass_duration_seconds histogram\n"
            "trainctl_pass_duration_seconds_count 4\n"
            "trainctl_pass_duration_seconds_sum 12.1875\n"
            "trainctl_pass_duration_seconds_bucket{le=\"0.125\"} 2\n"
            "trainctl_pass_duration_seconds_bucket{le=\"1\"} 2\n"
            "trainctl_pass_duration_seconds_bucket{le=\"2.5\"} 3\n"
            "trainctl_pass_duration_seconds_bucket{le=\"+Inf\"} 4\n");
}

TEST(MetricsRender, EscapesLabelValuesAndHelp) {
  Registry registry;
  registry.AddGauge("trainctl_info", "Line one\nback\\slash \"quoted\"")
      .Add({{"name", "a\\b\"c\nd"}})
      .Set(1);
  EXPECT_EQ(registry.Render(),
            "# HELP trainctl_info Line one\\nback\\\\slash \"quoted\"\n"
            "# TYPE trainctl_info gauge\n"
            "trainctl_info{name=\"a\\\\b\\\"c\\nd\"} 1\n");
}

TEST(MetricsRender, InvalidUtf8InLabelValuesIsRepaired) {
  Registry registry;
  auto& info = registry.AddGauge("trainctl_info", "Info.");
  info.Add({{"name", "ok\xff"}}).Set(1);
  info.Add({{"name", "caf\xc3\xa9"}}).Set(2);  // well-formed: kept as is
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("trainctl_info{name=\"ok\xef\xbf\xbd\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("trainctl_info{name=\"caf\xc3\xa9\"} 2\n"));
  EXPECT_TRUE(info.Has({{"name", "ok\xff"}}));  // the series itself keeps its labels
}

TEST(MetricsRender, SpecialAndLargeValues) {
  Registry registry;
  auto& value = registry.AddGauge("trainctl_value", "Values.");
  const auto set = [&](const char* name, double v) { value.Add({{"case", name}}).Set(v); };
  set("nan", std::numeric_limits<double>::quiet_NaN());
  set("pos_inf", std::numeric_limits<double>::infinity());
  set("neg_inf", -std::numeric_limits<double>::infinity());
  set("million", 1e6);
  set("negative", -2);
  set("fraction", 0.1);
  set("huge", 1e20);
  set("tiny", 1.5e-7);
  set("big_int", 9007199254740991.0);  // 2^53 - 1
  const std::string text = registry.Render();
  // prometheus-cpp writes 16 significant digits; Prometheus reads "Nan" as NaN.
  for (const char* line :
       {"{case=\"nan\"} Nan\n", "{case=\"pos_inf\"} +Inf\n", "{case=\"neg_inf\"} -Inf\n",
        "{case=\"million\"} 1000000\n", "{case=\"negative\"} -2\n", "{case=\"fraction\"} 0.1\n",
        "{case=\"huge\"} 1e+20\n", "{case=\"tiny\"} 1.5e-07\n",
        "{case=\"big_int\"} 9007199254740991\n"}) {
    EXPECT_THAT(text, HasSubstr(std::string("trainctl_value") + line)) << text;
  }
}

TEST(MetricsRegistry, RemoveSeriesAndRemoveAllSeries) {
  Registry registry;
  auto& step = registry.AddGauge("trainctl_job_step", "Step.");
  step.Add({{"job", "j1"}}).Set(1);
  step.Add({{"job", "j2"}}).Set(2);
  EXPECT_EQ(&step.Add({{"job", "j1"}}), &step.Add({{"job", "j1"}}));  // one child per label set
  RemoveSeries(step, {{"job", "j1"}});
  RemoveSeries(step, {{"job", "never-there"}});  // harmless
  EXPECT_FALSE(step.Has({{"job", "never-there"}}));
  EXPECT_THAT(registry.Render(), Not(HasSubstr("j1")));
  EXPECT_THAT(registry.Render(), HasSubstr("trainctl_job_step{job=\"j2\"} 2\n"));
  EXPECT_EQ(step.Add({{"job", "j1"}}).Value(), 0);  // made again, fresh
  RemoveAllSeries(step);
  EXPECT_EQ(registry.Render(), "# HELP trainctl_job_step Step.\n# TYPE trainctl_job_step gauge\n");
}

TEST(MetricsRegistry, CollectorsRunBeforeEveryRender) {
  Registry registry;
  Gauge& depth = registry.AddGauge("trainctl_queue_depth", "Depth.").Add({});
  int calls = 0;
  registry.AddCollector([&] { depth.Set(++calls); });
  EXPECT_THAT(registry.Render(), HasSubstr("trainctl_queue_depth 1\n"));
  EXPECT_THAT(registry.Render(), HasSubstr("trainctl_queue_depth 2\n"));
  EXPECT_EQ(registry.Collect().size(), 1u);  // Collect (prometheus::Collectable) runs them too
  EXPECT_EQ(depth.Value(), 3);
}

TEST(MetricsBuckets, ExponentialAndLatency) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  const std::vector<double>& latency = LatencyBuckets();
  ASSERT_EQ(latency.size(), 17u);
  EXPECT_DOUBLE_EQ(latency.front(), 0.0005);
  EXPECT_DOUBLE_EQ(latency.back(), 0.0005 * 65536);
}

TEST(MetricsConcurrency, TwoThreadsCountExactlyWhileRendering) {
  Registry registry;
  Counter& counter = registry.AddCounter("trainctl_hits_total", "Hits.").Add({});
  Gauge& gauge = registry.AddGauge("trainctl_balance", "Balance.").Add({});
  Histogram& histogram =
      registry.AddHistogram("trainctl_work_seconds", "Work.").Add({}, std::vector<double>{0.5, 2});
  auto& calls = registry.AddCounter("trainctl_calls_total", "Calls.");
  constexpr int kPerThread = 100000;
  auto work = [&] {
    for (int i = 0; i < kPerThread; ++i) {
      counter.Increment();
      gauge.Increment(2);
      histogram.Observe(1);
      if (i % 10 == 0) calls.Add({{"method", i % 20 ? "A" : "B"}}).Increment();
    }
  };
  std::thread a(work);
  std::thread b(work);
  for (int i = 0; i < 20; ++i) registry.Render();
  a.join();
  b.join();
  EXPECT_EQ(counter.Value(), 2.0 * kPerThread);
  EXPECT_EQ(gauge.Value(), 4.0 * kPerThread);
  EXPECT_EQ(calls.Add({{"method", "A"}}).Value() + calls.Add({{"method", "B"}}).Value(),
            2.0 * kPerThread / 10);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("trainctl_work_seconds_count 200000\n"));
  EXPECT_THAT(text, HasSubstr("trainctl_work_seconds_bucket{le=\"0.5\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("trainctl_work_seconds_bucket{le=\"2\"} 200000\n"));
  EXPECT_THAT(text, HasSubstr("trainctl_work_seconds_sum 200000\n"));
}

class MetricsDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(MetricsDeathTest, BadOrRepeatedNamesAbortNamingThem) {
  Registry registry;
  EXPECT_DEATH(registry.AddGauge("trainctl-bad", "x"), "cannot add metric \"trainctl-bad\"");
  EXPECT_DEATH(registry.AddGauge("9lives", "x"), "cannot add metric \"9lives\"");
  EXPECT_DEATH(registry.AddGauge("", "x"), "cannot add metric \"\"");
  registry.AddGauge("trainctl_depth", "x");
  EXPECT_DEATH(registry.AddGauge("trainctl_depth", "again"),
               "cannot add metric \"trainctl_depth\"");
  EXPECT_DEATH(registry.AddCounter("trainctl_depth", "other type"),
               "cannot add metric \"trainctl_depth\"");
  EXPECT_DEATH(ExponentialBuckets(0, 2, 3), "ExponentialBuckets");
}

}  // namespace
}  // namespace trainctl::metrics
