// The metric history's pure parts: downsampling, series building and the retention rule.
#include "coordinator/metric_history.h"

#include <numeric>

#include "coordinator/metric_retention.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"

namespace trainctl {
namespace {

using google::protobuf::util::TimeUtil;
using trainctl::v1::JobEvent;

JobEvent Metric(int64_t step, std::map<std::string, double> values, const std::string& stage = "") {
  JobEvent e;
  e.set_stage(stage);
  *e.mutable_time() = TimeUtil::SecondsToTimestamp(1'800'000'000 + step);
  e.mutable_metric()->set_step(step);
  for (const auto& [k, v] : values) (*e.mutable_metric()->mutable_values())[k] = v;
  return e;
}

TEST(EvenlySpacedIndicesTest, KeepsFirstAndLastAndSpreadsTheRest) {
  EXPECT_EQ(EvenlySpacedIndices(10, 4), (std::vector<size_t>{0, 3, 6, 9}));
  EXPECT_EQ(EvenlySpacedIndices(3, 5), (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(EvenlySpacedIndices(0, 5), (std::vector<size_t>{}));
  EXPECT_EQ(EvenlySpacedIndices(5, 1), (std::vector<size_t>{0, 4}));  // at least both ends
  EXPECT_EQ(EvenlySpacedIndices(1001, 3), (std::vector<size_t>{0, 500, 1000}));
}

TEST(BuildMetricHistoryTest, SeriesPerStageAndNameByStepLaterValueWins) {
  std::vector<JobEvent> events = {
      Metric(1, {{"loss", 2.0}, {"learning_rate", 1e-5}}, "sft"),
      Metric(2, {{"loss", 1.5}}, "sft"),
      Metric(2, {{"loss", 1.4}}, "sft"),  // logged again by a resumed attempt
      Metric(1, {{"loss", 0.9}, {"reward", 0.25}}, "grpo"),
  };
  JobEvent other;
  other.mutable_checkpoint()->set_step(2);
  events.insert(events.begin() + 2, other);
  auto r = BuildMetricHistory(events, {}, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->series_size(), 4);
  EXPECT_EQ(r->series(0).stage(), "sft");
  EXPECT_EQ(r->series(0).name(), "learning_rate");
  EXPECT_EQ(r->series(1).name(), "loss");
  ASSERT_EQ(r->series(1).points_size(), 2);
  EXPECT_EQ(r->series(1).points(1).step(), 2);
  EXPECT_DOUBLE_EQ(r->series(1).points(1).value(), 1.4);
  EXPECT_EQ(r->series(1).points(1).time().seconds(), 1'800'000'002);
  EXPECT_EQ(r->series(2).stage(), "grpo");
  EXPECT_EQ(r->series(2).name(), "loss");
  EXPECT_EQ(r->series(3).name(), "reward");

  auto only = BuildMetricHistory(events, {"reward", "nonexistent"}, 0);
  ASSERT_TRUE(only.ok());
  ASSERT_EQ(only->series_size(), 1);
  EXPECT_EQ(only->series(0).name(), "reward");
}

TEST(BuildMetricHistoryTest, DownsamplesEachSeriesAndRejectsBadArguments) {
  std::vector<JobEvent> events;
  for (int step = 1; step <= 100; ++step) events.push_back(Metric(step, {{"loss", step * 1.0}}));
  auto r = BuildMetricHistory(events, {"loss"}, 4);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->series(0).points_size(), 4);
  EXPECT_EQ(r->series(0).points(0).step(), 1);
  EXPECT_EQ(r->series(0).points(1).step(), 34);
  EXPECT_EQ(r->series(0).points(3).step(), 100);
  EXPECT_EQ(BuildMetricHistory(events, {}, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildMetricHistory(events, {}, kMaxMetricPoints + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildMetricHistory(events, {""}, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MetricEventsToThinTest, KeepsFirstNewestQuarterAndOlderOnesEvenlyByTime) {
  std::vector<int64_t> times(20);
  std::iota(times.begin(), times.end(), 0);
  // max 8: the newest 2, and 2 picked evenly by time among the 18 older (the first, t=0, and t=17).
  std::vector<size_t> drop = MetricEventsToThin(times, 8);
  std::vector<size_t> expected(16);
  std::iota(expected.begin(), expected.end(), 1);
  EXPECT_EQ(drop, expected);
  EXPECT_TRUE(MetricEventsToThin(std::vector<int64_t>(8, 0), 8).empty());

  // Uneven times: the pick follows time, not position. Older events at t = 0..9 and 100..107.
  std::vector<int64_t> uneven;
  for (int t = 0; t < 10; ++t) uneven.push_back(t);
  for (int t = 100; t < 108; ++t) uneven.push_back(t);
  for (int t = 200; t < 203; ++t) uneven.push_back(t);
  // max 12: newest 3 kept; 3 targets over [0, 107]: t=0, t=54 (nearest: 9), t=107.
  drop = MetricEventsToThin(uneven, 12);
  std::vector<size_t> kept;
  for (size_t i = 0, d = 0; i < uneven.size(); ++i) {
    if (d < drop.size() && drop[d] == i) {
      ++d;
    } else {
      kept.push_back(i);
    }
  }
  EXPECT_EQ(kept, (std::vector<size_t>{0, 9, 17, 18, 19, 20}));

  // One burst (no spread in time): evenly by position.
  drop = MetricEventsToThin(std::vector<int64_t>(12, 5), 8);
  EXPECT_EQ(drop, (std::vector<size_t>{1, 2, 3, 4, 5, 6, 7, 8}));
}

}  // namespace
}  // namespace trainctl
