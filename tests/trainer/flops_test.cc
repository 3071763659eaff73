// The FLOPs arithmetic behind the `flops_per_second` and `mfu` metrics.
#include "worker/trainer/stages/internal/flops.h"

#include "gtest/gtest.h"

namespace trainctl::trainer {
namespace {

TEST(FlopsTest, TrainingFlopsPerTokenIsSixNPlusAttention) {
  // N = 1,000,000 parameters of which 100 x 64 = 6,400 are the input embedding table;
  // 6 x 993,600 = 5,961,600 for the matmuls, and 12 x 2 layers x 64 wide x 128 tokens = 196,608
  // for attention: 6,158,208 per token.
  const ModelShape shape{1000000, 100, 64, 2};
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(shape, 128), 6158208.0);
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(shape, 0), 5961600.0);
}

TEST(FlopsTest, PeaksComeFromTheDeviceNameAndPrecision) {
  using P = ComputePrecision;
  EXPECT_DOUBLE_EQ(*PeakFlopsForDevice("NVIDIA H100 80GB HBM3", P::kHalf), 989.4e12);
  EXPECT_DOUBLE_EQ(*PeakFlopsForDevice("NVIDIA H100 PCIe", P::kHalf), 756.5e12);
  EXPECT_DOUBLE_EQ(*PeakFlopsForDevice("NVIDIA H100 NVL", P::kTf32), 417.5e12);
  EXPECT_DOUBLE_EQ(*PeakFlopsForDevice("NVIDIA H200", P::kHalf), 989.4e12);
  EXPECT_DOUBLE_EQ(*PeakFlopsForDevice("NVIDIA A100-SXM4-80GB", P::kTf32), 156e12);
  EXPECT_DOUBLE_EQ(*PeakFlopsForDevice("NVIDIA A100-SXM4-80GB", P::kFp32), 19.5e12);
  EXPECT_FALSE(PeakFlopsForDevice("", P::kHalf).has_value());
  EXPECT_FALSE(PeakFlopsForDevice("Tesla V100-SXM2-32GB", P::kHalf).has_value());
}

TEST(FlopsTest, AnOverrideWinsAndABadOneIsReported) {
  std::string error;
  EXPECT_DOUBLE_EQ(*PeakFlops("2.5e14", "NVIDIA H100 80GB HBM3", ComputePrecision::kHalf, &error),
                   2.5e14);
  EXPECT_TRUE(error.empty());
  EXPECT_DOUBLE_EQ(*PeakFlops("-1", "NVIDIA H100 80GB HBM3", ComputePrecision::kHalf, &error),
                   989.4e12);
  EXPECT_NE(error.find("TRAINCTL_PEAK_FLOPS='-1'"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(PeakFlops(nullptr, "", ComputePrecision::kFp32, &error).has_value());
  EXPECT_FALSE(PeakFlops("", "", ComputePrecision::kFp32, &error).has_value());
  EXPECT_TRUE(error.empty());
}

}  // namespace
}  // namespace trainctl::trainer
