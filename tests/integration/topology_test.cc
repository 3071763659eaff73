// Node topology end to end, with the real parts: trainctl-coordinator (SQLite) and trainctl-worker
// on loopback, the worker probing a fake node (tests/testing/fake_node.h: a fake nvidia-smi whose
// `topo -m` is a real 8x H100 output, a fake sysfs tree, a modules file). ListNodes returns the
// parsed topology, `trainctl nodes NODE --topology` prints it, a refresh after the fake sysfs
// changed returns the new state, and the last probe survives a coordinator restart.
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "cli/job_client.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_node.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
namespace v1 = trainctl::v1;
using testing::Subprocess;
using testing::WaitFor;

class TopologyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sysfs_ = dir_.path() + "/sys";
    testing::WriteFakeRdmaPort(dir_, sysfs_, "mlx5_0", 1, "4: ACTIVE", "400 Gb/sec (4X NDR)",
                               "InfiniBand", "ibp24s0");
    testing::WriteFakeInterface(dir_, sysfs_, "lo", "unknown", 772);
    testing::WriteFakeInterface(dir_, sysfs_, "ibp24s0", "up", 32);
    modules_ = dir_.Write("modules", "nvidia_peermem 16384 0 - Live 0x0\n");
    const std::string topo =
        dir_.Write("topo.txt", testing::ReadFileOrEmpty(testing::H100TopoFixture()));
    smi_ = dir_.Write("bin/nvidia-smi", testing::FakeNvidiaSmiScript(topo));
    ASSERT_EQ(chmod(smi_.c_str(), 0755), 0);
    // The worker reports its NCCL environment (it inherits this process's).
    setenv("NCCL_IB_HCA", "mlx5_0", 1);
    setenv("NCCL_NET_GDR_LEVEL", "2", 1);
  }

  ~TopologyTest() override {
    worker_.reset();
    coordinator_.reset();
    unsetenv("NCCL_IB_HCA");
    unsetenv("NCCL_NET_GDR_LEVEL");
  }

  void StartCoordinator() {
    const std::string ready = dir_.path() + "/ready";
    fs::remove(ready);
    coordinator_ = std::make_unique<Subprocess>(
        std::vector<std::string>{TRAINCTL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--db",
                                 dir_.path() + "/trainctl.db", "--ready_file", ready,
                                 "--lease_timeout", "5s", "--db_sync", "normal",
                                 "--topology_refresh_timeout", "10s"},
        dir_.path() + "/coordinator.log");
    ASSERT_TRUE(WaitFor([&] { return fs::exists(ready); }, absl::Seconds(30))) << Logs();
    address_ = std::string(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(ready)));
    client_ = std::make_unique<cli::JobClient>(address_, absl::Seconds(20));
  }

  void StartWorker() {
    worker_ = std::make_unique<Subprocess>(std::vector<std::string>{TRAINCTL_WORKER_BIN,
                                                                    "--coordinator",
                                                                    address_,
                                                                    "--node_name",
                                                                    "node-gpu",
                                                                    "--work_dir",
                                                                    dir_.path() + "/work",
                                                                    "--heartbeat_interval",
                                                                    "300ms",
                                                                    "--reconnect_max",
                                                                    "500ms",
                                                                    "--trainer",
                                                                    FAKE_RANK_BIN,
                                                                    "--nvidia_smi",
                                                                    smi_,
                                                                    "--sysfs_root",
                                                                    sysfs_,
                                                                    "--proc_modules",
                                                                    modules_,
                                                                    "--output_roots",
                                                                    dir_.path()},
                                           dir_.path() + "/worker.log");
  }

  absl::StatusOr<v1::ListNodesResponse> Topology(bool refresh) {
    v1::ListNodesRequest request;
    request.set_name("node-gpu");
    request.set_topology(true);
    request.set_refresh(refresh);
    return client_->ListNodes(request);
  }

  // The scenario's phases, in the order the test runs them.

  // The probe sent with the register, stored and returned by ListNodes with topology (in `first`).
  void ExpectProbeStoredAtRegister(v1::NodeTopology* first);
  // The CLI prints it.
  void ExpectCliPrintsTopology();
  // The port goes down and the peer-memory module is unloaded; a refresh sees it.
  void ExpectRefreshSeesTheChange(const v1::NodeTopology& first);
  // The worker goes away: a refresh cannot be had, the last probe is shown with a warning.
  void ExpectLastProbeWithoutTheWorker();
  // A restarted coordinator has it from SQLite, before the node is back.
  void ExpectProbeKeptAcrossRestart();

  std::string Logs() {
    return "coordinator:\n" + testing::ReadFileOrEmpty(dir_.path() + "/coordinator.log") +
           "\nworker:\n" + testing::ReadFileOrEmpty(dir_.path() + "/worker.log");
  }

  testing::TempDir dir_;
  std::string sysfs_, modules_, smi_, address_;
  std::unique_ptr<Subprocess> coordinator_, worker_;
  std::unique_ptr<cli::JobClient> client_;
};

void TopologyTest::ExpectProbeStoredAtRegister(v1::NodeTopology* first) {
  absl::StatusOr<v1::ListNodesResponse> got;
  ASSERT_TRUE(WaitFor(
      [&] {
        got = Topology(false);
        return got.ok() && got->nodes_size() == 1 && got->nodes(0).has_topology();
      },
      absl::Seconds(20)))
      << got.status() << Logs();
  *first = got->nodes(0).topology();
  EXPECT_EQ(got->nodes(0).state(), "ready");
  EXPECT_EQ(first->node(), "node-gpu");
  EXPECT_EQ(first->probe_errors_size(), 0) << absl::StrJoin(first->probe_errors(), "; ");
  ASSERT_EQ(first->gpus_size(), 8);
  EXPECT_EQ(first->gpus(0).pci_bus_id(), "00000000:18:00.0");
  EXPECT_EQ(first->devices_size(), 17);
  EXPECT_EQ(first->links_size(), 133);
  ASSERT_EQ(first->rdma_ports_size(), 1);
  EXPECT_EQ(first->rdma_ports(0).state(), "ACTIVE");
  EXPECT_EQ(first->rdma_ports(0).rate_gbps(), 400);
  EXPECT_TRUE(first->gpudirect_rdma());
  EXPECT_EQ(first->nccl_env().at("NCCL_IB_HCA"), "mlx5_0");
  EXPECT_EQ(first->nccl_env().at("NCCL_NET_GDR_LEVEL"), "2");
  EXPECT_EQ(first->interfaces().at("ibp24s0"), "up ib");
  // Without topology, ListNodes stays as it was.
  auto plain = client_->ListNodes();
  ASSERT_TRUE(plain.ok());
  ASSERT_EQ(plain->nodes_size(), 1);
  EXPECT_FALSE(plain->nodes(0).has_topology());
}

void TopologyTest::ExpectCliPrintsTopology() {
  testing::RunResult cli = testing::Run(
      {TRAINCTL_CLI_BIN, "--coordinator", address_, "nodes", "node-gpu", "--topology"});
  ASSERT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_TRUE(absl::StrContains(cli.out, "NVIDIA H100 80GB HBM3")) << cli.out;
  EXPECT_TRUE(absl::StrContains(cli.out, "NV18")) << cli.out;
  EXPECT_TRUE(absl::StrContains(cli.out, "mlx5_0")) << cli.out;
  EXPECT_TRUE(absl::StrContains(cli.out, "GPUDirect RDMA: possible (nvidia_peermem loaded)"))
      << cli.out;
  EXPECT_TRUE(absl::StrContains(cli.out, "NCCL_IB_HCA=mlx5_0")) << cli.out;
}

void TopologyTest::ExpectRefreshSeesTheChange(const v1::NodeTopology& first) {
  testing::WriteFakeRdmaPort(dir_, sysfs_, "mlx5_0", 1, "1: DOWN", "400 Gb/sec (4X NDR)",
                             "InfiniBand", "ibp24s0");
  dir_.Write("modules", "nvidia 56598528 147 - Live 0x0\n");
  auto refreshed = Topology(true);
  ASSERT_TRUE(refreshed.ok()) << refreshed.status() << Logs();
  EXPECT_EQ(refreshed->warnings_size(), 0) << absl::StrJoin(refreshed->warnings(), "; ");
  ASSERT_EQ(refreshed->nodes_size(), 1);
  const v1::NodeTopology second = refreshed->nodes(0).topology();
  EXPECT_EQ(second.rdma_ports(0).state(), "DOWN");
  EXPECT_FALSE(second.gpudirect_rdma());
  EXPECT_EQ(second.peer_memory_module(), "");
  EXPECT_GE(second.probe_time().seconds() * 1000000000LL + second.probe_time().nanos(),
            first.probe_time().seconds() * 1000000000LL + first.probe_time().nanos());

  testing::RunResult cli = testing::Run({TRAINCTL_CLI_BIN, "--coordinator", address_, "-o", "json",
                                         "nodes", "node-gpu", "--topology", "--refresh"});
  ASSERT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_TRUE(absl::StrContains(cli.out, "\"state\": \"DOWN\"")) << cli.out;
}

void TopologyTest::ExpectLastProbeWithoutTheWorker() {
  worker_->Kill(SIGKILL);
  ASSERT_TRUE(worker_->Wait(absl::Seconds(10)).ok());
  worker_.reset();
  ASSERT_TRUE(WaitFor(
      [&] {
        auto nodes = client_->ListNodes();
        return nodes.ok() && nodes->nodes_size() == 1 && nodes->nodes(0).state() != "ready";
      },
      absl::Seconds(20)))
      << Logs();
  auto stale = Topology(true);
  ASSERT_TRUE(stale.ok()) << stale.status();
  ASSERT_EQ(stale->warnings_size(), 1);
  EXPECT_TRUE(absl::StrContains(stale->warnings(0), "not connected")) << stale->warnings(0);
  EXPECT_EQ(stale->nodes(0).topology().rdma_ports(0).state(), "DOWN");
}

void TopologyTest::ExpectProbeKeptAcrossRestart() {
  coordinator_->Kill(SIGKILL);
  ASSERT_TRUE(coordinator_->Wait(absl::Seconds(20)).ok());
  StartCoordinator();
  auto after = Topology(false);
  ASSERT_TRUE(after.ok()) << after.status() << Logs();
  ASSERT_EQ(after->nodes_size(), 1);
  EXPECT_EQ(after->nodes(0).state(), "unknown");
  EXPECT_EQ(after->nodes(0).topology().rdma_ports(0).state(), "DOWN");
  EXPECT_EQ(after->nodes(0).topology().devices_size(), 17);
  EXPECT_EQ(after->warnings_size(), 1);
}

TEST_F(TopologyTest, ProbedAtRegisterRefreshedOnDemandAndKeptAcrossRestart) {
  StartCoordinator();
  StartWorker();
  v1::NodeTopology first;
  ASSERT_NO_FATAL_FAILURE(ExpectProbeStoredAtRegister(&first));
  ASSERT_NO_FATAL_FAILURE(ExpectCliPrintsTopology());
  ASSERT_NO_FATAL_FAILURE(ExpectRefreshSeesTheChange(first));
  ASSERT_NO_FATAL_FAILURE(ExpectLastProbeWithoutTheWorker());
  ASSERT_NO_FATAL_FAILURE(ExpectProbeKeptAcrossRestart());
  // An unknown node is NOT_FOUND.
  v1::ListNodesRequest unknown;
  unknown.set_name("no-such-node");
  unknown.set_topology(true);
  EXPECT_EQ(client_->ListNodes(unknown).status().code(), absl::StatusCode::kNotFound);
}

// The memory plan at submit (issue 29): the node's GPUs as its worker reports them (8 x 81,559
// MiB) refuse a job whose plan cannot fit, naming what it needs and changes that would fit; --force
// queues it; a job that fits is accepted with its plan stored and printed.
TEST_F(TopologyTest, SubmitRefusesAJobTheNodesGpusCannotHoldUnlessForced) {
  StartCoordinator();
  StartWorker();
  ASSERT_TRUE(WaitFor(
      [&] {
        auto nodes = client_->ListNodes(v1::ListNodesRequest());
        return nodes.ok() && nodes->nodes_size() == 1 && nodes->nodes(0).state() == "ready";
      },
      absl::Seconds(30)))
      << Logs();
  EXPECT_EQ(client_->ListNodes(v1::ListNodesRequest())->nodes(0).gpu_memory_bytes(),
            int64_t{81559} << 20);
  auto spec = [&](const std::string& name, const std::string& model, int stage) {
    return dir_.Write(name + ".yaml",
                      absl::StrCat("name: ", name, "\nkind: sft\nmodel_name_or_path: ", model,
                                   "\ndata_path: ", dir_.path(), "/data\noutput_dir: ", dir_.path(),
                                   "/", name, "\nresources: {nodes: 1, slots_per_node: 8}\n",
                                   "training: {bf16: true, per_device_train_batch_size: 4}\n",
                                   "deepspeed: {zero_optimization: {stage: ", stage,
                                   "}, bf16: {enabled: true}}\n"));
  };
  auto trainctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {TRAINCTL_CLI_BIN, "--coordinator", address_});
    return testing::Run(args);
  };
  const std::string big = spec("big", "Qwen/Qwen2-VL-72B-Instruct", 0);
  testing::RunResult refused = trainctl({"submit", big});
  EXPECT_EQ(refused.exit_code, 1) << refused.out << refused.err;
  EXPECT_TRUE(absl::StrContains(refused.err,
                                "per GPU; the GPUs of the nodes it could run on hold 79.65 GiB"))
      << refused.err;
  EXPECT_TRUE(absl::StrContains(refused.err, "changes that would fit:")) << refused.err;
  EXPECT_TRUE(absl::StrContains(refused.err, "--force")) << refused.err;
  EXPECT_EQ(client_->List(v1::ListJobsRequest())->jobs_size(), 0);

  testing::RunResult forced = trainctl({"-o", "json", "submit", big, "--force"});
  ASSERT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_TRUE(absl::StrContains(forced.out, "\"memory_plan\"")) << forced.out;
  const std::string forced_id = client_->List(v1::ListJobsRequest())->jobs(0).id();
  EXPECT_GT(client_->Get(forced_id)->memory_plan().gpu_bytes(), int64_t{80} << 30);

  testing::RunResult fits = trainctl({"submit", spec("small", "Qwen/Qwen2-VL-2B-Instruct", 3)});
  ASSERT_EQ(fits.exit_code, 0) << fits.err;
  EXPECT_TRUE(absl::StrContains(fits.out, "memory plan: per GPU")) << fits.out;
}

}  // namespace
}  // namespace trainctl
