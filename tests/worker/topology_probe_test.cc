// The worker's topology probe against a fake nvidia-smi (tests/testing/fake_node.h, its `topo -m`
// a real H100 output), a fake sysfs tree and a modules file in a temporary directory.
#include "worker/daemon/topology_probe.h"

#include <sys/stat.h>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/worker_limits.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_node.h"
#include "tests/testing/temp_dir.h"
#include "worker/daemon/gpu_discovery.h"

namespace trainctl::worker {
namespace {

namespace v1 = trainctl::v1;
using testing::TempDir;

TEST(TopologyProbeTest, ParsesBusIdsRatesAndModules) {
  auto ids = ParsePciBusIds("0, 00000000:18:00.0\n1, 00000000:2A:00.0\n");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->at(1), "00000000:2A:00.0");
  auto bad = ParsePciBusIds("0, 00000000:18:00.0\nGPU 1\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "line 2")) << bad.status();

  EXPECT_EQ(ParseRateGbps("400 Gb/sec (4X NDR)"), 400);
  EXPECT_EQ(ParseRateGbps("25 Gb/sec (1X EDR)"), 25);
  EXPECT_EQ(ParseRateGbps("2.5 Gb/sec (1X SDR)"), 2.5);
  EXPECT_EQ(ParseRateGbps("unknown"), 0);

  EXPECT_EQ(FindPeerMemoryModule("nvidia_uvm 1523712 0 - Live 0x0\n"
                                 "nvidia_peermem 16384 0 - Live 0x0\n"),
            "nvidia_peermem");
  EXPECT_EQ(FindPeerMemoryModule("nv_peer_mem 16384 0 - Live 0x0\n"), "nv_peer_mem");
  EXPECT_EQ(FindPeerMemoryModule("nvidia 56598528 147 - Live 0x0\nib_core 442368 9\n"), "");
  EXPECT_TRUE(IsNcclRelevant("NCCL_IB_HCA"));
  EXPECT_TRUE(IsNcclRelevant("CUDA_VISIBLE_DEVICES"));
  EXPECT_FALSE(IsNcclRelevant("PATH"));
}

TEST(TopologyProbeTest, ReadsRdmaPortsFromSysfs) {
  TempDir dir;
  const std::string root = dir.path() + "/sys";
  testing::WriteFakeRdmaPort(dir, root, "mlx5_0", 1, "4: ACTIVE", "400 Gb/sec (4X NDR)",
                             "InfiniBand", "ibp24s0");
  testing::WriteFakeRdmaPort(dir, root, "mlx5_10", 1, "1: DOWN", "10 Gb/sec (4X SDR)", "InfiniBand",
                             "ibp220s0");
  testing::WriteFakeRdmaPort(dir, root, "mlx5_2", 1, "4: ACTIVE", "100 Gb/sec (4X EDR)", "Ethernet",
                             "ens3f0");
  std::vector<std::string> errors;
  std::vector<v1::RdmaPort> ports = ReadRdmaPorts(root, &errors);
  EXPECT_TRUE(errors.empty()) << absl::StrJoin(errors, "; ");
  ASSERT_EQ(ports.size(), 3u);
  EXPECT_EQ(ports[0].device(), "mlx5_0");  // mlx5_2 before mlx5_10
  EXPECT_EQ(ports[1].device(), "mlx5_2");
  EXPECT_EQ(ports[2].device(), "mlx5_10");
  EXPECT_EQ(ports[0].port(), 1);
  EXPECT_EQ(ports[0].state(), "ACTIVE");
  EXPECT_EQ(ports[0].phys_state(), "LinkUp");
  EXPECT_EQ(ports[0].rate(), "400 Gb/sec (4X NDR)");
  EXPECT_EQ(ports[0].rate_gbps(), 400);
  EXPECT_EQ(ports[0].link_layer(), "InfiniBand");
  ASSERT_EQ(ports[0].netdevs_size(), 1);
  EXPECT_EQ(ports[0].netdevs(0), "ibp24s0");
  EXPECT_EQ(ports[1].link_layer(), "Ethernet");
  EXPECT_EQ(ports[2].state(), "DOWN");
  EXPECT_EQ(ports[2].phys_state(), "Disabled");

  // An attribute that cannot be read is named; the port is still reported.
  ASSERT_EQ(::remove((root + "/class/infiniband/mlx5_2/ports/1/rate").c_str()), 0);
  ports = ReadRdmaPorts(root, &errors);
  ASSERT_EQ(ports.size(), 3u);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_TRUE(absl::StrContains(errors[0], "RDMA mlx5_2 port 1: cannot read")) << errors[0];
  // No /sys/class/infiniband at all: no ports, no error.
  errors.clear();
  EXPECT_TRUE(ReadRdmaPorts(dir.path() + "/nothing", &errors).empty());
  EXPECT_TRUE(errors.empty());
}

class ProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string smi =
        dir_.Write("bin/nvidia-smi", testing::FakeNvidiaSmiScript(testing::H100TopoFixture()));
    ASSERT_EQ(chmod(smi.c_str(), 0755), 0);
    auto gpus = DiscoverGpus(smi);  // the worker's discovery, against the same fake
    ASSERT_TRUE(gpus.ok()) << gpus.status();
    options_.gpus = *gpus;
    options_.nvidia_smi = smi;
    options_.sysfs_root = dir_.path() + "/sys";
    testing::WriteFakeRdmaPort(dir_, options_.sysfs_root, "mlx5_0", 1, "4: ACTIVE",
                               "400 Gb/sec (4X NDR)", "InfiniBand", "ibp24s0");
    testing::WriteFakeInterface(dir_, options_.sysfs_root, "lo", "unknown", 772);
    testing::WriteFakeInterface(dir_, options_.sysfs_root, "eth0", "up", 1);
    testing::WriteFakeInterface(dir_, options_.sysfs_root, "docker0", "down", 1, /*bridge=*/true);
    options_.proc_modules = dir_.Write("modules",
                                       "nvidia_peermem 16384 0 - Live 0x0\n"
                                       "nvidia 56598528 147 - Live 0x0\n");
    options_.environment = {{"NCCL_IB_HCA", "mlx5_0"},
                            {"NCCL_DEBUG", "INFO"},
                            {"CUDA_VISIBLE_DEVICES", "0,1"},
                            {"HOME", "/root"}};
  }

  TempDir dir_;
  TopologyProbeOptions options_;
};

TEST_F(ProbeTest, ProbesTheWholeNode) {
  const absl::Time now = absl::FromUnixSeconds(1764700000);
  v1::NodeTopology t = ProbeTopology(options_, now);
  EXPECT_EQ(t.probe_errors_size(), 0) << absl::StrJoin(t.probe_errors(), "; ");
  EXPECT_EQ(google::protobuf::util::TimeUtil::TimestampToSeconds(t.probe_time()), 1764700000);
  EXPECT_EQ(t.node(), "");
  ASSERT_EQ(t.gpus_size(), 8);
  EXPECT_EQ(t.gpus(0).name(), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(t.gpus(0).memory_total_bytes(), int64_t{81559} << 20);
  EXPECT_EQ(t.gpus(0).pci_bus_id(), "00000000:18:00.0");
  EXPECT_EQ(t.gpus(7).pci_bus_id(), "00000000:DB:00.0");
  EXPECT_TRUE(absl::StartsWith(t.gpus(3).uuid(), "GPU-"));
  ASSERT_EQ(t.devices_size(), 17);  // the fixture's 8 GPUs and 9 NICs
  EXPECT_EQ(t.links_size(), 133);
  EXPECT_TRUE(absl::StrContains(t.topo_matrix(), "NV18"));
  ASSERT_EQ(t.rdma_ports_size(), 1);
  EXPECT_EQ(t.rdma_ports(0).state(), "ACTIVE");
  EXPECT_EQ(t.peer_memory_module(), "nvidia_peermem");
  EXPECT_TRUE(t.gpudirect_rdma());
  EXPECT_EQ(t.nccl_env().size(), 3u);
  EXPECT_EQ(t.nccl_env().at("NCCL_IB_HCA"), "mlx5_0");
  EXPECT_EQ(t.nccl_env().count("HOME"), 0u);
  EXPECT_EQ(t.interfaces().at("lo"), "unknown loopback");
  EXPECT_EQ(t.interfaces().at("eth0"), "up ether");
  EXPECT_EQ(t.interfaces().at("docker0"), "down bridge");
}

// What the worker sends passes the coordinator's checks; what a broken or hostile peer could send
// does not, with the field named.
TEST_F(ProbeTest, TheProbePassesTheCoordinatorsChecksAndBadOnesAreNamed) {
  v1::NodeTopology t = ProbeTopology(options_, absl::Now());
  v1::WorkerMessage message;
  message.set_seq(7);
  *message.mutable_topology() = t;
  EXPECT_TRUE(CheckWorkerMessage(message).ok()) << CheckWorkerMessage(message);

  auto expect_bad = [&](v1::NodeTopology bad, const std::string& field) {
    absl::Status s = CheckNodeTopology("topology", bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_TRUE(absl::StartsWith(s.message(), field)) << s << " want " << field;
  };
  v1::NodeTopology bad = t;
  bad.mutable_links(3)->set_b(99);
  expect_bad(bad, "topology.links[3].b");
  bad = t;
  bad.mutable_links(0)->set_type(static_cast<v1::LinkType>(42));
  expect_bad(bad, "topology.links[0].type");
  bad = t;
  bad.mutable_devices(2)->set_name("");
  expect_bad(bad, "topology.devices[2].name");
  bad = t;
  bad.mutable_rdma_ports(0)->set_rate_gbps(-1);
  expect_bad(bad, "topology.rdma_ports[0].rate_gbps");
  bad = t;
  for (int i = 0; i <= kMaxTopologyEnv; ++i) {
    (*bad.mutable_nccl_env())["NCCL_X" + std::to_string(i)] = "1";
  }
  expect_bad(bad, "topology.nccl_env");
  bad = t;
  bad.set_topo_matrix(std::string(kMaxTopoMatrixBytes + 1, 'x'));
  expect_bad(bad, "topology.topo_matrix");
}

TEST_F(ProbeTest, NoPeerMemoryModuleNoGpuDirect) {
  options_.proc_modules = dir_.Write("modules", "nvidia 56598528 147 - Live 0x0\n");
  v1::NodeTopology t = ProbeTopology(options_, absl::Now());
  EXPECT_FALSE(t.gpudirect_rdma());
  EXPECT_EQ(t.peer_memory_module(), "");
  options_.proc_modules = dir_.path() + "/no-such-modules";
  t = ProbeTopology(options_, absl::Now());
  ASSERT_EQ(t.probe_errors_size(), 1);
  EXPECT_TRUE(absl::StrContains(t.probe_errors(0), "no-such-modules")) << t.probe_errors(0);
}

TEST_F(ProbeTest, FailuresBecomeProbeErrorsNotFailures) {
  // A matrix that does not parse, and nvidia-smi failing the bus-id query.
  const std::string bad_topo = dir_.Write("bad-topo.txt", "\tGPU0\tGPU1\nGPU0\t X \tXYZ\n");
  const std::string smi = dir_.Write(
      "bin/broken-smi", "#!/bin/sh\ncase \"$1\" in\n  topo) cat '" + bad_topo +
                            "' ;;\n  *) echo 'NVIDIA-SMI has failed'; exit 9 ;;\nesac\n");
  ASSERT_EQ(chmod(smi.c_str(), 0755), 0);
  options_.nvidia_smi = smi;
  v1::NodeTopology t = ProbeTopology(options_, absl::Now());
  ASSERT_EQ(t.probe_errors_size(), 2) << absl::StrJoin(t.probe_errors(), "; ");
  EXPECT_TRUE(absl::StrContains(t.probe_errors(0), "GPU PCI bus ids"));
  EXPECT_TRUE(absl::StrContains(t.probe_errors(0), "NVIDIA-SMI has failed"));
  EXPECT_TRUE(absl::StrContains(t.probe_errors(1), "line 2: column 3 (GPU0->GPU1)"))
      << t.probe_errors(1);
  EXPECT_EQ(t.gpus_size(), 8);  // from discovery
  EXPECT_EQ(t.devices_size(), 0);
  EXPECT_FALSE(t.topo_matrix().empty());  // kept as printed, for humans
  EXPECT_EQ(t.rdma_ports_size(), 1);
}

TEST_F(ProbeTest, ACpuNodeRunsNoNvidiaSmi) {
  options_.gpus.clear();
  options_.nvidia_smi = dir_.path() + "/no-such-nvidia-smi";
  v1::NodeTopology t = ProbeTopology(options_, absl::Now());
  EXPECT_EQ(t.probe_errors_size(), 0) << absl::StrJoin(t.probe_errors(), "; ");
  EXPECT_EQ(t.gpus_size(), 0);
  EXPECT_EQ(t.devices_size(), 0);
  EXPECT_EQ(t.rdma_ports_size(), 1);
}

}  // namespace
}  // namespace trainctl::worker
