#include "worker/daemon/gpu_discovery.h"

#include <sys/stat.h>

#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace trainctl::worker {
namespace {

TEST(GpuDiscoveryTest, ParsesNvidiaSmiCsv) {
  auto gpus = ParseNvidiaSmiCsv(
      "index, uuid, name, memory.total [MiB]\n"
      "0, GPU-1c9a, NVIDIA H100 80GB HBM3, 81559 MiB\n"
      "1, GPU-77f0, NVIDIA H100 80GB HBM3, 81559 MiB\n");
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[1].index(), 1);
  EXPECT_EQ((*gpus)[1].uuid(), "GPU-77f0");
  EXPECT_EQ((*gpus)[0].name(), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ((*gpus)[0].memory_total_bytes(), int64_t{81559} * 1024 * 1024);
}

TEST(GpuDiscoveryTest, NamesTheMalformedLine) {
  auto gpus = ParseNvidiaSmiCsv("index, uuid, name, memory.total [MiB]\n0, GPU-1, H100\n");
  ASSERT_FALSE(gpus.ok());
  EXPECT_NE(gpus.status().message().find("line 2"), std::string::npos) << gpus.status();
  EXPECT_FALSE(ParseNvidiaSmiCsv("x, GPU-1, H100, 10 MiB\n").ok());
  EXPECT_FALSE(ParseNvidiaSmiCsv("0, GPU-1, H100, 10 GB\n").ok());
}

TEST(GpuDiscoveryTest, RunsTheProgramAndTreatsAMissingOneAsACpuNode) {
  testing::TempDir dir;
  const std::string fake = dir.Write("nvidia-smi",
                                     "#!/bin/sh\n"
                                     "echo 'index, uuid, name, memory.total [MiB]'\n"
                                     "echo '0, GPU-a, NVIDIA H200, 143771 MiB'\n");
  ASSERT_EQ(chmod(fake.c_str(), 0755), 0);
  auto gpus = DiscoverGpus(fake);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  ASSERT_EQ(gpus->size(), 1u);
  EXPECT_EQ((*gpus)[0].name(), "NVIDIA H200");

  auto none = DiscoverGpus(dir.path() + "/absent-nvidia-smi");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  const std::string broken =
      dir.Write("broken-smi", "#!/bin/sh\necho 'NVIDIA-SMI has failed'\nexit 9\n");
  ASSERT_EQ(chmod(broken.c_str(), 0755), 0);
  auto failed = DiscoverGpus(broken);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("NVIDIA-SMI has failed"), std::string::npos);
}

}  // namespace
}  // namespace trainctl::worker
