// The diagnosis rules (coordinator/diagnosis.h): each rule fires on the facts it names and stays
// quiet on a healthy job.
#include "coordinator/diagnosis.h"

#include <string>

#include "absl/strings/str_join.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

template <typename T>
T Parse(const std::string& text) {
  T message;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &message)) << text;
  return message;
}

// An 8-GPU NVSwitch node (NV18 everywhere) with two GPUs sharing a PCIe switch with mlx5 NICs.
v1::NodeTopology H100Node(const std::string& name) {
  std::string text = "node: '" + name + "' ";
  for (int g = 0; g < 4; ++g) {
    text += "devices { name: 'GPU" + std::to_string(g) + "' is_gpu: true numa_affinity: '0' } ";
  }
  text +=
      "devices { name: 'NIC0' nic_device: 'mlx5_0' } devices { name: 'NIC1' nic_device: 'mlx5_1' "
      "} ";
  for (int a = 0; a < 4; ++a) {
    for (int b = a + 1; b < 4; ++b) {
      text += "links { a: " + std::to_string(a) + " b: " + std::to_string(b) +
              " type: LINK_TYPE_NVLINK nvlinks: 18 } ";
    }
  }
  text += "links { a: 0 b: 4 type: LINK_TYPE_PXB } links { a: 1 b: 4 type: LINK_TYPE_SYS } ";
  text += "links { a: 2 b: 5 type: LINK_TYPE_PIX } ";
  text +=
      "rdma_ports { device: 'mlx5_0' port: 1 state: 'ACTIVE' rate: '400 Gb/sec (4X NDR)' "
      "rate_gbps: 400 link_layer: 'InfiniBand' } ";
  text +=
      "rdma_ports { device: 'mlx5_1' port: 1 state: 'ACTIVE' rate: '400 Gb/sec (4X NDR)' "
      "rate_gbps: 400 link_layer: 'InfiniBand' } ";
  text += "gpudirect_rdma: true peer_memory_module: 'nvidia_peermem' ";
  text +=
      "interfaces { key: 'lo' value: 'up loopback' } interfaces { key: 'ens1' value: 'up ether' } ";
  text += "interfaces { key: 'docker0' value: 'up bridge' } ";
  return Parse<v1::NodeTopology>(text);
}

v1::NcclReport Report(int rank, const std::string& host, const std::string& extra) {
  return Parse<v1::NcclReport>("rank: " + std::to_string(rank) + " host: '" + host +
                               "' nranks: 8 nnodes: 2 " + extra);
}

std::string Rules(const std::vector<v1::Finding>& findings) {
  std::vector<std::string> rules;
  for (const auto& f : findings) rules.push_back(f.rule() + "@" + f.node());
  return absl::StrJoin(rules, " ");
}

DiagnosisInputs TwoNodes() {
  DiagnosisInputs in;
  in.nodes = {H100Node("node-a"), H100Node("node-b")};
  in.rank_nodes = {{0, "node-a"}, {1, "node-a"}, {2, "node-b"}, {3, "node-b"}};
  return in;
}

TEST(DiagnosisTest, HealthyJobHasNoFindings) {
  DiagnosisInputs in = TwoNodes();
  in.nccl.push_back(Report(0, "node-a",
                           "connections { channel: 0 from_rank: 0 to_rank: 1 transport: "
                           "NCCL_TRANSPORT_P2P via: 'P2P/CUMEM/read' } "
                           "connections { channel: 0 from_rank: 1 to_rank: 2 transport: "
                           "NCCL_TRANSPORT_NET_IB via: 'NET/IB/0/GDRDMA' gdrdma: true "
                           "inter_node: true } nics: 'mlx5_0:1/IB' bootstrap_interface: 'ens1'"));
  EXPECT_EQ(Rules(Diagnose(in)), "");
}

TEST(DiagnosisTest, IbDisabledWithActivePortsIsCriticalOnManyNodes) {
  DiagnosisInputs in = TwoNodes();
  in.job_env["NCCL_IB_DISABLE"] = "1";
  const auto findings = Diagnose(in);
  ASSERT_EQ(Rules(findings),
            "ib_disabled_with_active_ports@node-a ib_disabled_with_active_ports@node-b");
  EXPECT_EQ(findings[0].severity(), v1::SEVERITY_CRITICAL);
  EXPECT_EQ(findings[0].evidence(0), "NCCL_IB_DISABLE=1 from the job's env");
  EXPECT_NE(findings[0].remedy().find("NCCL_IB_DISABLE=0"), std::string::npos);

  // Set in the worker's environment of one node and seen by NCCL there; no active port elsewhere.
  DiagnosisInputs one = TwoNodes();
  (*one.nodes[0].mutable_nccl_env())["NCCL_IB_DISABLE"] = "1";
  for (auto& p : *one.nodes[1].mutable_rdma_ports()) p.set_state("DOWN");
  (*one.nodes[1].mutable_nccl_env())["NCCL_IB_DISABLE"] = "1";
  EXPECT_EQ(Rules(Diagnose(one)), "ib_disabled_with_active_ports@node-a");
}

TEST(DiagnosisTest, NetWithoutGdrWhereNicAndGpuShareASwitch) {
  DiagnosisInputs in = TwoNodes();
  in.nodes[0].set_peer_memory_module("");
  in.nccl.push_back(Report(1, "node-a",
                           "connections { channel: 0 from_rank: 1 to_rank: 2 transport: "
                           "NCCL_TRANSPORT_NET_IB via: 'NET/IB/0' inter_node: true }"));
  const auto findings = Diagnose(in);
  ASSERT_EQ(Rules(findings), "net_without_gdrdma@node-a");
  const v1::Finding& f = findings[0];
  EXPECT_NE(f.remedy().find("NCCL_NET_GDR_LEVEL=2"), std::string::npos);
  EXPECT_NE(f.remedy().find("modprobe nvidia_peermem"), std::string::npos);
  const std::string evidence = absl::StrJoin(f.evidence(), "\n");
  EXPECT_NE(evidence.find("1 of 1 NET/IB connections without GDRDMA"), std::string::npos);
  EXPECT_NE(evidence.find("GPU0 <-> NIC0 (mlx5_0): PXB"), std::string::npos);
  EXPECT_NE(evidence.find("GPU2 <-> NIC1 (mlx5_1): PIX"), std::string::npos);

  // Without a shared switch (only SYS between GPUs and NICs) there is nothing to suggest.
  DiagnosisInputs far = in;
  far.nodes[0].clear_links();
  EXPECT_EQ(Rules(Diagnose(far)), "");
}

TEST(DiagnosisTest, SocketIfnameOnLoopbackOrBridge) {
  DiagnosisInputs in = TwoNodes();
  in.job_env["NCCL_SOCKET_IFNAME"] = "lo";
  auto findings = Diagnose(in);
  ASSERT_EQ(Rules(findings),
            "socket_ifname_bad_interface@node-a socket_ifname_bad_interface@node-b");
  EXPECT_EQ(findings[0].severity(), v1::SEVERITY_CRITICAL);
  EXPECT_NE(findings[0].remedy().find("NCCL_SOCKET_IFNAME=ens1"), std::string::npos);

  // An exclusion list is fine; what NCCL actually used still counts.
  in.job_env["NCCL_SOCKET_IFNAME"] = "^lo,docker0";
  EXPECT_EQ(Rules(Diagnose(in)), "");
  in.nccl.push_back(Report(2, "node-b", "nics: 'docker0:172.17.0.1<0>'"));
  findings = Diagnose(in);
  ASSERT_EQ(Rules(findings), "socket_ifname_bad_interface@node-b");
  EXPECT_EQ(findings[0].evidence(0), "rank 2: NCCL uses docker0:172.17.0.1<0> (bridge)");
}

TEST(DiagnosisTest, IntraNodeShmOnNvlinkNode) {
  DiagnosisInputs in;
  in.nodes = {H100Node("gpu-1")};
  in.job_env["NCCL_P2P_DISABLE"] = "1";
  in.nccl.push_back(Parse<v1::NcclReport>(
      "rank: 0 host: 'gpu-1.example' nranks: 4 nnodes: 1 "
      "connections { channel: 0 from_rank: 0 to_rank: 1 transport: NCCL_TRANSPORT_SHM "
      "via: 'SHM/direct/direct' } connections { channel: 1 from_rank: 0 to_rank: 1 transport: "
      "NCCL_TRANSPORT_SHM via: 'SHM/direct/direct' }"));
  const auto findings = Diagnose(in);
  ASSERT_EQ(Rules(findings), "intra_node_not_p2p@gpu-1");
  const std::string evidence = absl::StrJoin(findings[0].evidence(), "\n");
  EXPECT_NE(evidence.find("GPU0 <-> GPU1: NV18"), std::string::npos);
  EXPECT_NE(evidence.find("0 -> 1 via SHM/direct/direct"), std::string::npos);
  EXPECT_NE(evidence.find("NCCL_P2P_DISABLE=1 from the job's env"), std::string::npos);
}

v1::BandwidthReport Probe(const std::string& backend, double busbw,
                          const std::vector<double>& rank_times) {
  v1::BandwidthReport b;
  b.set_backend(backend);
  b.set_world_size(static_cast<int>(rank_times.size()));
  for (const char* collective : {"all_reduce", "all_gather"}) {
    for (int64_t bytes : {int64_t{1} << 20, int64_t{64} << 20}) {
      v1::BandwidthRow* row = b.add_rows();
      row->set_collective(collective);
      row->set_bytes(bytes);
      row->set_busbw_gbps(busbw);
      for (double t : rank_times) row->add_rank_time_us(t);
    }
  }
  return b;
}

TEST(DiagnosisTest, BusBandwidthFarBelowTheLinks) {
  DiagnosisInputs in;
  in.nodes = {H100Node("gpu-1")};
  in.bandwidth = Probe("nccl", 30.0, {100, 100, 100, 100});  // NV18 allows ~450 GB/s
  auto findings = Diagnose(in);
  ASSERT_EQ(Rules(findings), "busbw_below_links@");
  EXPECT_NE(absl::StrJoin(findings[0].evidence(), "\n").find("NV18, ~450 GB/s"), std::string::npos);
  in.bandwidth = Probe("nccl", 380.0, {100, 100, 100, 100});
  EXPECT_EQ(Rules(Diagnose(in)), "");
  // Between nodes the NICs bound it: 2 × 400 Gb/s = 100 GB/s.
  DiagnosisInputs two = TwoNodes();
  two.bandwidth = Probe("nccl", 20.0, {100, 100, 100, 100});
  findings = Diagnose(two);
  ASSERT_EQ(Rules(findings), "busbw_below_links@");
  EXPECT_NE(absl::StrJoin(findings[0].evidence(), "\n").find("800 Gb/s = 100 GB/s"),
            std::string::npos);
  two.bandwidth = Probe("nccl", 60.0, {100, 100, 100, 100});
  EXPECT_EQ(Rules(Diagnose(two)), "");
  // Gloo on CPUs: no link figures to hold it to.
  in.bandwidth = Probe("gloo", 0.5, {100, 100, 100, 100});
  EXPECT_EQ(Rules(Diagnose(in)), "");
}

TEST(DiagnosisTest, SlowRankAndSlowNode) {
  DiagnosisInputs in = TwoNodes();
  in.bandwidth = Probe("gloo", 1.0, {100, 110, 400, 95});
  auto findings = Diagnose(in);
  ASSERT_EQ(Rules(findings), "slow_rank@node-b");
  EXPECT_EQ(findings[0].rank(), 2);
  EXPECT_NE(findings[0].evidence(0).find("slow in 4 of 4 probe rows, up to 4.0x"),
            std::string::npos);

  in.bandwidth = Probe("gloo", 1.0, {100, 90, 400, 380});
  findings = Diagnose(in);
  ASSERT_EQ(Rules(findings), "slow_node@node-b");
  EXPECT_EQ(findings[0].evidence_size(), 2);

  in.bandwidth = Probe("gloo", 1.0, {100, 120, 130, 110});
  EXPECT_EQ(Rules(Diagnose(in)), "");

  // Two ranks: no verdict, however far apart (each rank's time includes waiting for the other).
  in.bandwidth = Probe("gloo", 1.0, {100, 1200});
  EXPECT_EQ(Rules(Diagnose(in)), "");
}

TEST(DiagnosisTest, MostSevereFirst) {
  DiagnosisInputs in = TwoNodes();
  in.job_env["NCCL_IB_DISABLE"] = "1";
  in.bandwidth = Probe("gloo", 1.0, {100, 100, 300, 100});
  const auto findings = Diagnose(in);
  ASSERT_EQ(findings.size(), 3u);
  EXPECT_EQ(findings[0].severity(), v1::SEVERITY_CRITICAL);
  EXPECT_EQ(findings[2].rule(), "slow_rank");
  EXPECT_STREQ(SeverityName(findings[2].severity()), "warning");
}

}  // namespace
}  // namespace trainctl
