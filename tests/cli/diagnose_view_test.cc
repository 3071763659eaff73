// `trainctl diagnose`'s text (cli/diagnose_view.h) and the verb's argument checks.
#include "cli/diagnose_view.h"

#include <sstream>

#include "cli/commands.h"
#include "cli/event_line.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace trainctl::cli {
namespace {

TEST(DiagnoseViewTest, PrintsEverySection) {
  trainctl::v1::DiagnoseJobResponse d;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(
        job_id: "7"
        nodes {
          node: "node-a"
          gpus { index: 0 name: "NVIDIA H100 80GB HBM3" }
          gpus { index: 1 name: "NVIDIA H100 80GB HBM3" }
          devices { name: "GPU0" is_gpu: true }
          devices { name: "GPU1" is_gpu: true }
          devices { name: "NIC0" nic_device: "mlx5_0" }
          links { a: 0 b: 1 type: LINK_TYPE_NVLINK nvlinks: 18 }
          links { a: 0 b: 2 type: LINK_TYPE_PIX }
          rdma_ports {
            device: "mlx5_0"
            port: 1
            state: "ACTIVE"
            rate_gbps: 400
            link_layer: "InfiniBand"
          }
          gpudirect_rdma: true
          peer_memory_module: "nvidia_peermem"
        }
        nccl {
          rank: 0
          host: "node-a"
          nccl_version: "2.18.3+cuda12.2"
          nchannels: 2
          connections { transport: NCCL_TRANSPORT_P2P via: "P2P/CUMEM" }
          connections { transport: NCCL_TRANSPORT_NET_IB via: "NET/IB/0/GDRDMA" gdrdma: true }
          nics: "mlx5_0:1/IB"
        }
        bandwidth {
          backend: "nccl"
          world_size: 2
          nodes: 1
          dtype: "float32"
          iterations: 5
          rows {
            collective: "all_reduce"
            bytes: 67108864
            time_us: 500
            algbw_gbps: 134.2
            busbw_gbps: 134.2
            rank_time_us: 490
            rank_time_us: 500
          }
        }
        findings {
          rule: "slow_rank"
          severity: SEVERITY_WARNING
          node: "node-a"
          rank: 1
          summary: "rank 1 is slow"
          evidence: "slow in 4 of 4"
          remedy: "check it"
        }
      )pb",
      &d));
  const std::string text = DiagnosisText(d);
  for (const char* want : {"Diagnosis of job 7", "node-a", "2x NVIDIA H100 80GB HBM3", "NV18",
                           "mlx5_0:1 ACTIVE 400G IB", "yes (nvidia_peermem)", "2.18.3+cuda12.2",
                           "mlx5_0:1/IB", "nccl, 2 ranks on 1 node(s)", "64 MiB", "134.200",
                           "1 (500 us)", "WARNING  slow_rank (node-a rank 1): rank 1 is slow",
                           "      - slow in 4 of 4", "      remedy: check it"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
}

TEST(DiagnoseViewTest, SaysWhatIsMissing) {
  trainctl::v1::DiagnoseJobResponse d;
  d.set_job_id("3");
  const std::string text = DiagnosisText(d);
  EXPECT_NE(text.find("has not been placed"), std::string::npos) << text;
  EXPECT_NE(text.find("no rank reported NCCL's topology"), std::string::npos) << text;
  EXPECT_NE(text.find("none ran"), std::string::npos) << text;
  EXPECT_NE(text.find("FINDINGS\n  none"), std::string::npos) << text;
  EXPECT_EQ(ByteSize(1024), "1 KiB");
  EXPECT_EQ(ByteSize(3000), "3000 B");
}

TEST(DiagnoseViewTest, VerbChecksItsArguments) {
  std::ostringstream out, err;
  EXPECT_EQ(RunTrainctl({"diagnose"}, "127.0.0.1:1", out, err), kExitUsage);
  EXPECT_NE(err.str().find("needs one job ID (or --probe)"), std::string::npos) << err.str();
  err.str("");
  EXPECT_EQ(RunTrainctl({"diagnose", "4", "--probe"}, "127.0.0.1:1", out, err), kExitUsage);
  EXPECT_NE(err.str().find("give no job ID"), std::string::npos) << err.str();
  err.str("");
  EXPECT_EQ(RunTrainctl({"diagnose", "4", "--nodes", "2"}, "127.0.0.1:1", out, err), kExitUsage);
  EXPECT_NE(err.str().find("--nodes needs --probe"), std::string::npos) << err.str();
  err.str("");
  EXPECT_EQ(RunTrainctl({"diagnose", "--probe", "--sizes", "1,x"}, "127.0.0.1:1", out, err),
            kExitUsage);
  EXPECT_NE(err.str().find("--sizes: 'x' is not a positive byte count"), std::string::npos)
      << err.str();
}

TEST(DiagnoseViewTest, NcclAndBandwidthEventsHaveTheirOwnLines) {
  trainctl::v1::JobEvent nccl;
  ASSERT_TRUE(
      google::protobuf::TextFormat::ParseFromString(R"pb(
                                                      nccl {
                                                        rank: 1
                                                        host: "node-a"
                                                        nccl_version: "2.18.3"
                                                        nranks: 16
                                                        nnodes: 2
                                                        nchannels: 8
                                                        connections { via: "P2P/CUMEM/read" }
                                                        connections { via: "P2P/CUMEM/read" }
                                                        connections { via: "NET/IB/0/GDRDMA" }
                                                        gdr_state: "enabled"
                                                      }
                                                    )pb",
                                                    &nccl));
  EXPECT_EQ(EventLine(nccl),
            "nccl       rank 1 on node-a: NCCL 2.18.3, 16 ranks on 2 node(s), 8 channels, "
            "1x NET/IB, 2x P2P/CUMEM, GDR enabled");
  trainctl::v1::JobEvent bandwidth;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(
        bandwidth {
          backend: "gloo"
          world_size: 2
          rows { collective: "all_reduce" bytes: 1024 busbw_gbps: 0.1 }
          rows { collective: "all_reduce" bytes: 4096 busbw_gbps: 0.5 }
        }
      )pb",
      &bandwidth));
  EXPECT_EQ(EventLine(bandwidth),
            "bandwidth  gloo, 2 ranks: busbw at the largest size all_reduce 0.5 GB/s "
            "(trainctl diagnose)");
}

}  // namespace
}  // namespace trainctl::cli
