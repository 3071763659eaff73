// `trainctl nodes NODE --topology`'s text, from a topology as the worker's probe makes it.
#include "cli/topology_view.h"

#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/diagnostics_reports.h"
#include "gtest/gtest.h"

namespace trainctl::cli {
namespace {

namespace v1 = trainctl::v1;

v1::Node GpuNode() {
  v1::Node node;
  node.set_name("gpu-1");
  node.set_state("ready");
  v1::NodeTopology* t = node.mutable_topology();
  t->mutable_probe_time()->set_seconds(1764700000);
  for (int i = 0; i < 2; ++i) {
    v1::TopologyGpu* g = t->add_gpus();
    g->set_index(i);
    g->set_name("NVIDIA H100 80GB HBM3");
    g->set_memory_total_bytes(int64_t{81559} << 20);
    g->set_pci_bus_id(i == 0 ? "00000000:18:00.0" : "00000000:2A:00.0");
    g->set_uuid("GPU-" + std::to_string(i));
    v1::TopologyDevice* d = t->add_devices();
    d->set_name("GPU" + std::to_string(i));
    d->set_is_gpu(true);
    d->set_cpu_affinity("0-47,96-143");
    d->set_numa_affinity("0");
  }
  v1::TopologyDevice* nic = t->add_devices();
  nic->set_name("NIC0");
  nic->set_nic_device("mlx5_0");
  auto link = [t](int a, int b, v1::LinkType type, int n) {
    v1::TopologyLink* l = t->add_links();
    l->set_a(a);
    l->set_b(b);
    l->set_type(type);
    l->set_nvlinks(n);
  };
  link(0, 1, v1::LINK_TYPE_NVLINK, 18);
  link(0, 2, v1::LINK_TYPE_PIX, 0);  // GPU1-NIC0 unknown
  v1::RdmaPort* p = t->add_rdma_ports();
  p->set_device("mlx5_0");
  p->set_port(1);
  p->set_state("ACTIVE");
  p->set_phys_state("LinkUp");
  p->set_rate("400 Gb/sec (4X NDR)");
  p->set_link_layer("InfiniBand");
  p->add_netdevs("ibp24s0");
  (*t->mutable_nccl_env())["NCCL_IB_HCA"] = "mlx5_0";
  (*t->mutable_interfaces())["docker0"] = "down bridge";
  t->add_probe_errors("cannot read /proc/modules (peer-memory module unknown)");
  return node;
}

TEST(TopologyViewTest, RendersEverySection) {
  const std::string text = RenderNodeTopology(GpuNode(), absl::FromUnixSeconds(1764700180));
  std::cout << text;  // for the reader of the test log
  EXPECT_TRUE(absl::StrContains(text,
                                "Node gpu-1 (ready), topology probed 2025-12-02T18:26:40Z "
                                "(3m ago)"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "NVIDIA H100 80GB HBM3")) << text;
  EXPECT_TRUE(absl::StrContains(text, "79.6 GiB")) << text;
  EXPECT_TRUE(absl::StrContains(text, "00000000:2A:00.0")) << text;
  EXPECT_TRUE(absl::StrContains(text, "0-47,96-143")) << text;
  EXPECT_TRUE(absl::StrContains(text, "NV18")) << text;
  EXPECT_TRUE(absl::StrContains(text, "NIC0=mlx5_0")) << text;
  EXPECT_TRUE(absl::StrContains(text, "400 Gb/sec (4X NDR)")) << text;
  EXPECT_TRUE(absl::StrContains(text, "GPUDirect RDMA: not possible (no peer-memory module"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "NCCL_IB_HCA=mlx5_0")) << text;
  EXPECT_TRUE(absl::StrContains(text, "docker0 (down bridge)")) << text;
  EXPECT_TRUE(absl::StrContains(text, "Not probed\n  cannot read /proc/modules")) << text;
}

TEST(TopologyViewTest, MatrixRowsShowEachCellAndUnknownOnes) {
  const std::string text = RenderNodeTopology(GpuNode(), absl::FromUnixSeconds(1764700000));
  // Row GPU1: NV18 to GPU0, X to itself, ? to NIC0 (not in the matrix).
  bool found = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "  GPU1 ")) {
      found = true;
      const std::vector<absl::string_view> cells = absl::StrSplit(line, ' ', absl::SkipEmpty());
      ASSERT_EQ(cells.size(), 4u) << line;
      EXPECT_EQ(cells[1], "NV18");
      EXPECT_EQ(cells[2], "X");
      EXPECT_EQ(cells[3], "?");
    }
  }
  EXPECT_TRUE(found) << text;
  EXPECT_EQ(LinkTypeName(v1::LINK_TYPE_SYS, 0), "SYS");
  EXPECT_EQ(LinkTypeName(v1::LINK_TYPE_NVLINK, 12), "NV12");
}

TEST(TopologyViewTest, ANodeWithoutProbeAndACpuNode) {
  v1::Node bare;
  bare.set_name("old");
  EXPECT_TRUE(absl::StrContains(RenderNodeTopology(bare, absl::Now()), "no topology probe stored"));
  v1::Node cpu;
  cpu.set_name("cpu-1");
  cpu.mutable_topology()->set_gpudirect_rdma(false);
  const std::string text = RenderNodeTopology(cpu, absl::Now());
  EXPECT_TRUE(absl::StrContains(text, "none (a CPU node)")) << text;
  EXPECT_TRUE(absl::StrContains(text, "GPUDirect RDMA: not possible (no RDMA device)")) << text;
  EXPECT_TRUE(absl::StrContains(text, "none set")) << text;
}

}  // namespace
}  // namespace trainctl::cli
