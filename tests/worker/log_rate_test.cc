#include "worker/daemon/log_rate.h"

#include "gtest/gtest.h"

namespace trainctl {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'800'000'000);

TEST(LogRateLimiterTest, ABurstGoesThenTheRateAndTheRestIsCounted) {
  LogRateLimiter limiter(/*bytes_per_second=*/100, /*burst=*/300, kStart);
  EXPECT_TRUE(limiter.Admit(200, kStart));
  EXPECT_TRUE(limiter.Admit(100, kStart));
  EXPECT_FALSE(limiter.Admit(1, kStart));
  EXPECT_FALSE(limiter.Admit(50, kStart));
  const LogRateLimiter::HeldBack held = limiter.TakeHeldBack();
  EXPECT_EQ(held.lines, 2);
  EXPECT_EQ(held.bytes, 51);
  EXPECT_EQ(limiter.TakeHeldBack().lines, 0) << "taken once";
  // Half a second refills 50 bytes, never more than the burst.
  EXPECT_FALSE(limiter.Admit(60, kStart + absl::Milliseconds(500)));
  EXPECT_TRUE(limiter.Admit(50, kStart + absl::Milliseconds(500)));
  EXPECT_TRUE(limiter.Admit(300, kStart + absl::Seconds(100)));
  EXPECT_FALSE(limiter.Admit(1, kStart + absl::Seconds(100)));
}

TEST(LogRateLimiterTest, NoRateMeansNoLimit) {
  LogRateLimiter limiter(0, 0, kStart);
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(limiter.Admit(1 << 20, kStart));
  EXPECT_EQ(limiter.TakeHeldBack().lines, 0);
}

TEST(LogRateLimiterTest, ALineLargerThanTheBurstNeverGoes) {
  LogRateLimiter limiter(1000, 10, kStart);
  EXPECT_FALSE(limiter.Admit(11, kStart + absl::Hours(1)));
  EXPECT_TRUE(limiter.Admit(10, kStart + absl::Hours(1)));
}

}  // namespace
}  // namespace trainctl
