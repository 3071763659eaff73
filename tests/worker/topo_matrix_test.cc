// The `nvidia-smi topo -m` parser on real outputs (tests/worker/fixtures/topo/, each naming its
// source), on the layout variants of other driver versions, and on malformed input.
#include "worker/daemon/topo_matrix.h"

#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace trainctl::worker {
namespace {

namespace v1 = trainctl::v1;

std::string Fixture(const std::string& name) {
  std::ifstream in(std::string(TRAINCTL_SOURCE_DIR) + "/tests/worker/fixtures/topo/" + name);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_FALSE(text.str().empty()) << name;
  return text.str();
}

int Index(const v1::NodeTopology& t, const std::string& name) {
  for (int i = 0; i < t.devices_size(); ++i) {
    if (t.devices(i).name() == name) return i;
  }
  ADD_FAILURE() << "no device " << name;
  return -1;
}

// The link between two devices by name, or nullptr.
const v1::TopologyLink* Link(const v1::NodeTopology& t, const std::string& x,
                             const std::string& y) {
  int a = Index(t, x), b = Index(t, y);
  if (a > b) std::swap(a, b);
  for (const v1::TopologyLink& l : t.links()) {
    if (l.a() == a && l.b() == b) return &l;
  }
  return nullptr;
}

v1::LinkType TypeOf(const v1::NodeTopology& t, const std::string& x, const std::string& y) {
  const v1::TopologyLink* l = Link(t, x, y);
  return l == nullptr ? v1::LINK_TYPE_UNSPECIFIED : l->type();
}

int Gpus(const v1::NodeTopology& t) {
  int n = 0;
  for (const auto& d : t.devices()) n += d.is_gpu() ? 1 : 0;
  return n;
}

TEST(TopoMatrixTest, H100SxmWithNineNics) {
  auto t = ParseTopoMatrix(Fixture("h100_sxm_9nic.txt"));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->devices_size(), 17);
  EXPECT_EQ(Gpus(*t), 8);
  EXPECT_EQ(t->devices(0).name(), "GPU0");
  EXPECT_EQ(t->devices(16).name(), "NIC8");
  EXPECT_FALSE(t->devices(16).is_gpu());
  // NVSwitch: every GPU pair is NV18.
  for (int a = 0; a < 8; ++a) {
    for (int b = a + 1; b < 8; ++b) {
      const v1::TopologyLink* l = Link(*t, "GPU" + std::to_string(a), "GPU" + std::to_string(b));
      ASSERT_NE(l, nullptr);
      EXPECT_EQ(l->type(), v1::LINK_TYPE_NVLINK);
      EXPECT_EQ(l->nvlinks(), 18);
    }
  }
  // Each GPU has one NIC behind its own PCIe switch.
  EXPECT_EQ(TypeOf(*t, "GPU0", "NIC8"), v1::LINK_TYPE_PIX);
  EXPECT_EQ(TypeOf(*t, "GPU3", "NIC5"), v1::LINK_TYPE_PIX);
  EXPECT_EQ(TypeOf(*t, "GPU7", "NIC1"), v1::LINK_TYPE_PIX);
  EXPECT_EQ(TypeOf(*t, "GPU0", "NIC5"), v1::LINK_TYPE_NODE);
  EXPECT_EQ(TypeOf(*t, "GPU0", "NIC0"), v1::LINK_TYPE_SYS);
  EXPECT_EQ(TypeOf(*t, "NIC1", "NIC2"), v1::LINK_TYPE_NODE);
  EXPECT_EQ(TypeOf(*t, "NIC5", "NIC8"), v1::LINK_TYPE_NODE);  // from row NIC5
  // The stored output ends after row NIC5: pairs among NIC6..NIC8 are unknown, the rest known.
  EXPECT_EQ(Link(*t, "NIC6", "NIC7"), nullptr);
  EXPECT_EQ(t->links_size(), 28 + 8 * 9 + (36 - 3));
  // Affinity, with the GPU NUMA ID column (empty, N/A) after it.
  EXPECT_EQ(t->devices(0).cpu_affinity(), "0-79");
  EXPECT_EQ(t->devices(0).numa_affinity(), "0");
  EXPECT_EQ(t->devices(4).cpu_affinity(), "80-159");
  EXPECT_EQ(t->devices(4).numa_affinity(), "1");
  EXPECT_EQ(t->devices(9).cpu_affinity(), "");  // NIC1
  EXPECT_EQ(t->devices(9).nic_device(), "");    // no legend in the stored copy
}

TEST(TopoMatrixTest, EightGpuPcieBoxWithTwoNics) {
  auto t = ParseTopoMatrix(Fixture("rtx4090_8gpu_pcie_2nic.txt"));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->devices_size(), 10);
  EXPECT_EQ(Gpus(*t), 8);
  EXPECT_EQ(t->links_size(), 45);
  EXPECT_EQ(TypeOf(*t, "GPU0", "GPU7"), v1::LINK_TYPE_SYS);
  EXPECT_EQ(TypeOf(*t, "GPU6", "NIC0"), v1::LINK_TYPE_PHB);
  EXPECT_EQ(TypeOf(*t, "GPU6", "NIC1"), v1::LINK_TYPE_PHB);
  EXPECT_EQ(TypeOf(*t, "GPU5", "NIC1"), v1::LINK_TYPE_SYS);
  EXPECT_EQ(TypeOf(*t, "NIC0", "NIC1"), v1::LINK_TYPE_PIX);
  EXPECT_EQ(t->devices(3).cpu_affinity(), "0-55,112-167");
  EXPECT_EQ(t->devices(4).cpu_affinity(), "56-111,168-223");
  EXPECT_EQ(t->devices(4).numa_affinity(), "1");
}

TEST(TopoMatrixTest, TwoGpusOnAHostBridgeWithLegend) {
  auto t = ParseTopoMatrix(Fixture("rtx5090_2gpu_phb.txt"));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->devices_size(), 2);
  ASSERT_EQ(t->links_size(), 1);
  EXPECT_EQ(t->links(0).type(), v1::LINK_TYPE_PHB);
  EXPECT_EQ(t->devices(1).cpu_affinity(), "0-63");
  EXPECT_EQ(t->devices(1).numa_affinity(), "0");
}

TEST(TopoMatrixTest, FiveGpusOnTwoNumaNodesSpacePadded) {
  auto t = ParseTopoMatrix(Fixture("five_gpu_two_numa.txt"));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->devices_size(), 5);
  EXPECT_EQ(TypeOf(*t, "GPU0", "GPU4"), v1::LINK_TYPE_SYS);
  EXPECT_EQ(TypeOf(*t, "GPU1", "GPU2"), v1::LINK_TYPE_PHB);
  EXPECT_EQ(TypeOf(*t, "GPU1", "GPU3"), v1::LINK_TYPE_NODE);
  EXPECT_EQ(TypeOf(*t, "GPU3", "GPU4"), v1::LINK_TYPE_PHB);
  EXPECT_EQ(t->devices(0).cpu_affinity(), "8-15,24-31");
  EXPECT_EQ(t->devices(0).numa_affinity(), "1");
  EXPECT_EQ(t->devices(2).numa_affinity(), "0");
}

TEST(TopoMatrixTest, OlderDriverWithCpuAffinityOnly) {
  auto t = ParseTopoMatrix(Fixture("t4_4gpu_pcie_old.txt"));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->devices_size(), 4);
  EXPECT_EQ(TypeOf(*t, "GPU0", "GPU1"), v1::LINK_TYPE_SYS);
  EXPECT_EQ(TypeOf(*t, "GPU2", "GPU3"), v1::LINK_TYPE_NODE);
  EXPECT_EQ(t->devices(0).cpu_affinity(), "0-15,32-47");
  EXPECT_EQ(t->devices(3).cpu_affinity(), "16-31,48-63");
  EXPECT_EQ(t->devices(3).numa_affinity(), "");
}

// Layout variants seen in other drivers' outputs, written here in their shape.
TEST(TopoMatrixTest, NicLegendNamesTheDevices) {
  auto t = ParseTopoMatrix(
      "\tGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
      "GPU0\t X \tNV12\tPXB\tSYS\t0-31\t0\t\tN/A\n"
      "GPU1\tNV12\t X \tSYS\tPXB\t32-63\t1\t\tN/A\n"
      "NIC0\tPXB\tSYS\t X \tSYS\n"
      "NIC1\tSYS\tPXB\tSYS\t X \n"
      "\n"
      "Legend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n\n"
      "NIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->devices(2).nic_device(), "mlx5_0");
  EXPECT_EQ(t->devices(3).nic_device(), "mlx5_1");
  EXPECT_EQ(TypeOf(*t, "GPU1", "NIC1"), v1::LINK_TYPE_PXB);
  EXPECT_EQ(Link(*t, "GPU0", "GPU1")->nvlinks(), 12);
}

TEST(TopoMatrixTest, OlderDriverNamesNicsInTheHeaderAndSaysSoc) {
  auto t = ParseTopoMatrix(
      "        GPU0    GPU1    mlx5_0  CPU Affinity\n"
      "GPU0     X      SOC     PIX     0-9,20-29\n"
      "GPU1    SOC      X      SOC     10-19,30-39\n"
      "mlx5_0  PIX     SOC      X      \n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->devices(2).nic_device(), "mlx5_0");
  EXPECT_FALSE(t->devices(2).is_gpu());
  EXPECT_EQ(TypeOf(*t, "GPU0", "GPU1"), v1::LINK_TYPE_SYS);
  EXPECT_EQ(TypeOf(*t, "GPU0", "mlx5_0"), v1::LINK_TYPE_PIX);
}

TEST(TopoMatrixTest, ParsesEachCell) {
  int n = -1;
  EXPECT_EQ(*ParseLinkCell("NV4", &n), v1::LINK_TYPE_NVLINK);
  EXPECT_EQ(n, 4);
  EXPECT_EQ(*ParseLinkCell("PXB", &n), v1::LINK_TYPE_PXB);
  EXPECT_EQ(n, 0);
  EXPECT_FALSE(ParseLinkCell("NV0", &n).ok());
  EXPECT_FALSE(ParseLinkCell("NV", &n).ok());
  EXPECT_FALSE(ParseLinkCell("NV-2", &n).ok());
  EXPECT_FALSE(ParseLinkCell("pix", &n).ok());
}

// The error names the line, and for a cell its column and devices.
void ExpectError(const std::string& text, const std::string& want) {
  auto t = ParseTopoMatrix(text);
  ASSERT_FALSE(t.ok()) << "parsed: " << text;
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find(want), std::string::npos)
      << "got: " << t.status().message() << "\nwant: " << want;
}

TEST(TopoMatrixTest, MalformedInputIsNamed) {
  ExpectError("", "empty output");
  ExpectError("No devices were found\n", "line 1: not a matrix header");
  ExpectError("\tGPU0\tGPU1\tCPU Affinity\tColour\n",
              "line 1: unknown header column starting at 'Colour'");
  ExpectError("\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tSYS\t X \n",
              "line 2: column 3 (GPU0->GPU1): unknown link type 'FOO'");
  ExpectError("\tGPU0\tGPU1\nGPU0\t X \tSYS\nGPU1\tSYS\tPIX\n",
              "line 3: column 3 (GPU1->GPU1): 'PIX' where X (self) belongs");
  ExpectError("\tGPU0\tGPU1\nGPU0\t X \t X \nGPU1\tSYS\t X \n", "off the diagonal");
  ExpectError("\tGPU0\tGPU1\nGPU0\t X \nGPU1\tSYS\t X \n",
              "line 2: row GPU0 has 1 cells, the header names 2 devices");
  ExpectError("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSYS\t0-7\t0\nGPU1\tSYS\t X \n",
              "line 2: row GPU0 has 2 values after its 2 cells, the header names 1 columns");
  ExpectError("\tGPU0\tGPU1\nGPU0\t X \tSYS\nGPU2\tSYS\t X \n",
              "line 3: row 'GPU2' is not a device of the header");
  ExpectError("\tGPU0\tGPU1\nGPU0\t X \tSYS\nGPU0\t X \tSYS\n", "line 3: row GPU0 again");
  ExpectError("\tGPU0\tGPU1\nGPU0\t X \tSYS\n", "line 1: GPU1 has no row");
  ExpectError("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV2\t X \n",
              "line 3: GPU1->GPU0 is NV2 but GPU0->GPU1 is NV4 (line 2)");
  ExpectError("\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\t X \n\nNIC Legend:\n\n  NIC3: mlx5_3\n",
              "line 7: the NIC legend names NIC3, which the matrix does not have");
}

TEST(TopoMatrixTest, SkipsCommentLinesBeforeTheHeader) {
  auto t = ParseTopoMatrix("# from a test\n\n\tGPU0\nGPU0\t X \n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->devices_size(), 1);
  EXPECT_EQ(t->links_size(), 0);
}

}  // namespace
}  // namespace trainctl::worker
