#include "worker/daemon/outbox.h"

#include <filesystem>
#include <thread>

#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace trainctl::worker {
namespace {

namespace v1 = trainctl::v1;

v1::WorkerMessage Line(const std::string& text) {
  v1::WorkerMessage m;
  v1::LogLine* line = m.mutable_logs()->add_lines();
  line->set_job_id("job-1");
  line->set_text(text);
  return m;
}

std::vector<std::string> Texts(const std::vector<v1::WorkerMessage>& ms) {
  std::vector<std::string> out;
  for (const auto& m : ms) out.push_back(m.logs().lines(0).text());
  return out;
}

TEST(OutboxTest, KeepsMessagesUntilAcknowledgedAndResendsThemInOrder) {
  testing::TempDir dir;
  Outbox outbox(dir.path() + "/spill", 1 << 20);
  EXPECT_EQ(outbox.Push(Line("a")), 1);
  EXPECT_EQ(outbox.Push(Line("b")), 2);
  EXPECT_EQ(outbox.Push(Line("c")), 3);
  EXPECT_EQ(Texts(outbox.WaitNext(0, 10, absl::Now())), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(Texts(outbox.WaitNext(2, 10, absl::Now())), (std::vector<std::string>{"c"}));
  EXPECT_EQ(Texts(outbox.WaitNext(0, 2, absl::Now())), (std::vector<std::string>{"a", "b"}));
  outbox.Ack(2);
  EXPECT_EQ(outbox.held(), 1u);
  // A reconnect resends from the last acknowledged seq.
  EXPECT_EQ(Texts(outbox.WaitNext(outbox.acked_through(), 10, absl::Now())),
            (std::vector<std::string>{"c"}));
  outbox.Ack(1);  // stale acks change nothing
  EXPECT_EQ(outbox.held(), 1u);
}

TEST(OutboxTest, WaitNextWakesOnPushAndTimesOut) {
  testing::TempDir dir;
  Outbox outbox(dir.path() + "/spill", 1 << 20);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(outbox.WaitNext(0, 10, start + absl::Milliseconds(50)).empty());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
  std::thread pusher([&] {
    absl::SleepFor(absl::Milliseconds(20));
    outbox.Push(Line("x"));
  });
  EXPECT_EQ(Texts(outbox.WaitNext(0, 10, absl::Now() + absl::Seconds(10))),
            (std::vector<std::string>{"x"}));
  pusher.join();
}

TEST(OutboxTest, SpillsToDiskBeyondItsMemoryLimitAndLosesNothing) {
  testing::TempDir dir;
  const std::string spill = dir.path() + "/spill";
  Outbox outbox(spill, 4096);
  const int n = 2000;
  for (int i = 0; i < n; ++i) outbox.Push(Line("line " + std::to_string(i)));
  EXPECT_GT(outbox.spilled(), 1000u);
  EXPECT_TRUE(std::filesystem::exists(spill));
  EXPECT_EQ(outbox.held(), static_cast<size_t>(n));
  // /metrics' spilled bytes: the whole file while nothing was read back from it.
  EXPECT_EQ(outbox.spilled_bytes(), static_cast<int64_t>(std::filesystem::file_size(spill)));
  std::vector<std::string> got;
  int64_t acked = 0;
  int64_t spilled_bytes = outbox.spilled_bytes();
  while (static_cast<int>(got.size()) < n) {
    auto batch = outbox.WaitNext(acked, 64, absl::Now() + absl::Seconds(1));
    ASSERT_FALSE(batch.empty()) << "stalled after " << got.size();
    for (const auto& m : batch) {
      EXPECT_EQ(m.seq(), acked + 1);
      got.push_back(m.logs().lines(0).text());
      acked = m.seq();
    }
    outbox.Ack(acked);
    EXPECT_LE(outbox.spilled_bytes(), spilled_bytes) << "read back, so fewer bytes on disk";
    EXPECT_EQ(outbox.spilled_bytes() == 0, outbox.spilled() == 0);
    spilled_bytes = outbox.spilled_bytes();
  }
  for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], "line " + std::to_string(i));
  EXPECT_EQ(outbox.held(), 0u);
  EXPECT_FALSE(std::filesystem::exists(spill)) << "the spill file is removed once drained";
  EXPECT_TRUE(outbox.spill_status().ok());
}

TEST(OutboxTest, AMessageSetAsideIsNeverSentAgainAndTheRestFlows) {
  testing::TempDir dir;
  Outbox outbox(dir.path() + "/spill", 1 << 20);
  outbox.Push(Line("a"));
  outbox.Push(Line("poison"));
  outbox.Push(Line("c"));
  EXPECT_EQ(outbox.first_held(), 1);
  outbox.Ack(1);
  EXPECT_EQ(outbox.first_held(), 2);
  auto aside = outbox.SetAside(2);
  ASSERT_TRUE(aside.ok()) << aside.status();
  EXPECT_EQ(aside->seq(), 2);
  EXPECT_EQ(aside->logs().lines(0).text(), "poison");
  EXPECT_EQ(outbox.first_held(), 3);
  EXPECT_EQ(Texts(outbox.WaitNext(outbox.acked_through(), 10, absl::Now())),
            (std::vector<std::string>{"c"}));
  EXPECT_EQ(outbox.SetAside(2).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(outbox.SetAside(1).status().code(), absl::StatusCode::kNotFound);  // acknowledged
  outbox.Ack(3);
  EXPECT_EQ(outbox.held(), 0u);
  EXPECT_EQ(outbox.first_held(), 0);
}

TEST(OutboxTest, CloseWakesWaiters) {
  testing::TempDir dir;
  Outbox outbox(dir.path() + "/spill", 1 << 20);
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(20));
    outbox.Close();
  });
  EXPECT_TRUE(outbox.WaitNext(0, 10, absl::Now() + absl::Seconds(30)).empty());
  closer.join();
}

}  // namespace
}  // namespace trainctl::worker
