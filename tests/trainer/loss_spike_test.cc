// The loss-spike detector (worker/trainer/stages/loss_spike.h) and the trainer's failure causes
// (worker/trainer/trainer_failure.h): what the loop and trainer_main decide exit codes with.
#include "worker/trainer/stages/loss_spike.h"

#include <cmath>
#include <limits>

#include "absl/strings/match.h"
#include "common/trainer_exit_codes.h"
#include "gtest/gtest.h"
#include "worker/trainer/trainer_failure.h"

namespace trainctl::trainer {
namespace {

TEST(LossSpikeDetectorTest, ASpikeIsAboveFactorTimesTheRunningMedian) {
  LossSpikeDetector d(3.0, 5);
  for (int step = 1; step <= 5; ++step) EXPECT_FALSE(d.Observe(step, 2.0 + 0.1 * step));
  EXPECT_DOUBLE_EQ(d.Median(), 2.3);
  EXPECT_FALSE(d.Observe(6, 6.8));    // 6.8 < 3 x 2.3 = 6.9
  EXPECT_DOUBLE_EQ(d.Median(), 2.4);  // the window slid: 2.2 2.3 2.4 2.5 6.8
  auto spike = d.Observe(7, 41.2);
  ASSERT_TRUE(spike.has_value());
  EXPECT_TRUE(absl::StrContains(*spike, "loss 41.2 > 3")) << *spike;
  EXPECT_TRUE(absl::StrContains(*spike, "median 2.4")) << *spike;
  EXPECT_TRUE(absl::StrContains(*spike, "at step 7")) << *spike;
  // A spike is not history: the median stays.
  EXPECT_DOUBLE_EQ(d.Median(), 2.4);
}

TEST(LossSpikeDetectorTest, NanAndInfAreSpikesFromTheFirstStep) {
  LossSpikeDetector d(3.0, 20);
  auto nan = d.Observe(1, std::numeric_limits<double>::quiet_NaN());
  ASSERT_TRUE(nan.has_value());
  EXPECT_TRUE(absl::StrContains(*nan, "nan at step 1")) << *nan;
  EXPECT_TRUE(d.Observe(2, std::numeric_limits<double>::infinity()).has_value());
}

TEST(LossSpikeDetectorTest, RatioTestFromTheSecondStepOnlyWithAPositiveMedian) {
  LossSpikeDetector d(3.0, 20);
  EXPECT_FALSE(d.Observe(1, 11.8));             // nothing to compare with
  EXPECT_TRUE(d.Observe(2, 59.6).has_value());  // > 3 x the first loss: diverging
  EXPECT_FALSE(d.Observe(3, 30.0));
  EXPECT_DOUBLE_EQ(d.Median(), 20.9);

  LossSpikeDetector grpo(3.0, 20);  // losses around zero
  for (int step = 1; step <= 5; ++step) EXPECT_FALSE(grpo.Observe(step, -0.01 * step));
  EXPECT_FALSE(grpo.Observe(6, 0.5));
}

TEST(TrainerFailureTest, RecognisesOutOfMemoryFromEachAllocator) {
  auto cuda = ParseOutOfMemory(
      "step 3: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)");
  ASSERT_TRUE(cuda.has_value());
  EXPECT_EQ(cuda->device, "cuda");
  EXPECT_EQ(cuda->bytes, int64_t{2} << 30);
  auto cpu = ParseOutOfMemory(
      "step 1: [enforce fail at alloc_cpu.cpp:75] data. DefaultCPUAllocator: can't allocate "
      "memory: you tried to allocate 268435456 bytes. Error code 12 (Cannot allocate memory)");
  ASSERT_TRUE(cpu.has_value());
  EXPECT_EQ(cpu->device, "cpu");
  EXPECT_EQ(cpu->bytes, 268435456);
  auto heap = ParseOutOfMemory(
      "step 1: HeapCpuAllocator: can't allocate memory: you tried to allocate 1048576 bytes");
  ASSERT_TRUE(heap.has_value());
  EXPECT_EQ(heap->device, "cpu");
  EXPECT_EQ(heap->bytes, 1048576);
  auto bad_alloc = ParseOutOfMemory("std::bad_alloc: std::bad_alloc");
  ASSERT_TRUE(bad_alloc.has_value());
  EXPECT_EQ(bad_alloc->bytes, -1);
  EXPECT_FALSE(ParseOutOfMemory("step 2: connection reset by peer").has_value());
}

TEST(TrainerFailureTest, ExitCodesSayWhy) {
  EXPECT_EQ(TrainerExitCode(absl::OkStatus()), 0);
  EXPECT_EQ(TrainerExitCode(absl::InternalError("CUDA out of memory. Tried to allocate 1 MiB")),
            kTrainerExitOutOfMemory);
  EXPECT_EQ(TrainerExitCode(absl::InternalError("shape mismatch")), 1);
  const absl::Status spike = LossSpikeError("loss nan at step 5");
  EXPECT_TRUE(IsLossSpike(spike));
  EXPECT_EQ(TrainerExitCode(spike), kTrainerExitLossSpike);
  EXPECT_FALSE(IsLossSpike(absl::AbortedError("loss spike: but not ours")));
}

}  // namespace
}  // namespace trainctl::trainer
