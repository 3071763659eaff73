// A fake GPU node for tests of the worker's topology probe: an nvidia-smi script that answers the
// worker's queries as the real one does on an 8-GPU H100 SXM node (its `topo -m` from a fixture
// file), and a sysfs tree with RDMA ports and network interfaces in a temporary directory.
#ifndef TRAINCTL_TESTS_TESTING_FAKE_NODE_H_
#define TRAINCTL_TESTS_TESTING_FAKE_NODE_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "tests/testing/temp_dir.h"

namespace trainctl::testing {

// The `nvidia-smi topo -m` fixture of an 8x H100 SXM node with 9 NICs (its source is named in it).
inline std::string H100TopoFixture() {
  return std::string(TRAINCTL_SOURCE_DIR) + "/tests/worker/fixtures/topo/h100_sxm_9nic.txt";
}

// The script's text: discovery (`--query-gpu=index,uuid,name,memory.total --format=csv`), the
// probe's PCI bus ids (`--query-gpu=index,pci.bus_id --format=csv,noheader`), and `topo -m` (the
// file `topo_file`, read when asked, so a test may change it). Anything else exits 2.
inline std::string FakeNvidiaSmiScript(const std::string& topo_file) {
  std::string discovery = "    echo 'index, uuid, name, memory.total [MiB]'\n";
  std::string bus_ids;
  for (int i = 0; i < 8; ++i) {
    absl::StrAppend(&discovery, "    echo '", i, ", GPU-4e1a0c", i,
                    "2-9f3b-4d7e-8a21-5c6d7e8f9a0b, NVIDIA H100 80GB HBM3, 81559 MiB'\n");
    // The bus ids of an HGX H100 board (00000000:18:00.0 ... 00000000:DB:00.0).
    static const char* const kBus[] = {"18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"};
    absl::StrAppend(&bus_ids, "    echo '", i, ", 00000000:", kBus[i], ":00.0'\n");
  }
  return absl::StrCat("#!/bin/sh\ncase \"$*\" in\n",
                      "  '--query-gpu=index,uuid,name,memory.total --format=csv')\n", discovery,
                      "    ;;\n", "  '--query-gpu=index,pci.bus_id --format=csv,noheader')\n",
                      bus_ids, "    ;;\n", "  'topo -m') cat '", topo_file, "' ;;\n",
                      "  *) echo \"unexpected arguments: $*\"; exit 2 ;;\nesac\n");
}

// One RDMA port under <root>/class/infiniband/<device>/ports/<port>/, with the device's network
// interface <netdev>, written as the kernel writes them ("4: ACTIVE", "400 Gb/sec (4X NDR)").
inline void WriteFakeRdmaPort(const TempDir& dir, const std::string& root,
                              const std::string& device, int port, const std::string& state,
                              const std::string& rate, const std::string& link_layer,
                              const std::string& netdev) {
  const std::string p = absl::StrCat(root, "/class/infiniband/", device, "/ports/", port, "/");
  dir.Write(p + "state", state + "\n");
  dir.Write(p + "phys_state", state == "4: ACTIVE" ? "5: LinkUp\n" : "3: Disabled\n");
  dir.Write(p + "rate", rate + "\n");
  dir.Write(p + "link_layer", link_layer + "\n");
  dir.Write(absl::StrCat(root, "/class/infiniband/", device, "/device/net/", netdev, "/ifindex"),
            "7\n");
}

// A network interface under <root>/class/net/<name>: operstate and ARP type (1 ether, 772
// loopback, 32 infiniband); `bridge` adds the bridge/ directory a Linux bridge has.
inline void WriteFakeInterface(const TempDir& dir, const std::string& root, const std::string& name,
                               const std::string& operstate, int type, bool bridge = false) {
  const std::string p = absl::StrCat(root, "/class/net/", name, "/");
  dir.Write(p + "operstate", operstate + "\n");
  dir.Write(p + "type", absl::StrCat(type, "\n"));
  if (bridge) dir.Write(p + "bridge/forward_delay", "1500\n");
}

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_TESTING_FAKE_NODE_H_
