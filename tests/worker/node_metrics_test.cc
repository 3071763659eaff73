// The worker's /metrics pieces: nvidia-smi and kernel-log parsers on real output, /proc readers,
// and NodeMetrics rendering through a real Registry (a fake nvidia-smi script, a kernel log file,
// real child processes as ranks), checked by the real promtool.
#include "worker/daemon/node_metrics.h"

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/process_stats.h"
#include "gtest/gtest.h"
#include "tests/testing/promtool.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "worker/daemon/gpu_metrics.h"

extern char** environ;

namespace trainctl::worker {
namespace {

// What `nvidia-smi --query-gpu=<kGpuMetricsQuery> --format=csv,noheader,nounits` prints on an
// 8-GPU H100 SXM node (trimmed to four): one GPU training, one idle, one whose power sensor
// reads [N/A], one without ECC reporting.
constexpr char kH100Csv[] =
    "0, GPU-8f6c3b1e-2a4d-4c1b-9e77-0d1c5a7e3f21, NVIDIA H100 80GB HBM3, 97, 71234, 81559, "
    "686.43, 62, 1980, 0\n"
    "1, GPU-1b2c9d3e-7f60-4a8b-b1c2-d3e4f5a6b7c8, NVIDIA H100 80GB HBM3, 0, 4, 81559, 71.12, 31, "
    "345, 0\n"
    "2, GPU-5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9, NVIDIA H100 80GB HBM3, 45, 40000, 81559, [N/A], "
    "48, 1755, 2\n"
    "3, GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d, NVIDIA H100 80GB HBM3, 12, 1024, 81559, 120.5, "
    "40, 1410, [Not Supported]\n";

// Real /proc/PID/stat of a trainer rank whose comm holds a space and parentheses.
constexpr char kProcStat[] =
    "48211 (train (rank) 0) S 48190 48211 48211 0 -1 4194560 812345 0 120 0 1500 250 0 0 20 0 "
    "9 0 88123 5368709120 262144 18446744073709551615 1 1 0 0 0 0 0 4096 17642 0 0 0 17 3 0 0 0 "
    "0 0\n";

std::string Executable(const testing::TempDir& dir, const std::string& name,
                       const std::string& script) {
  const std::string path = dir.Write(name, script);
  EXPECT_EQ(chmod(path.c_str(), 0755), 0);
  return path;
}

// /bin/sh -c `script` as a rank is started: the leader of a process group of its own (or not).
pid_t Spawn(const std::string& script, bool own_group) {
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  if (own_group) {
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  }
  const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, &attr, const_cast<char**>(argv), environ), 0);
  posix_spawnattr_destroy(&attr);
  return pid;
}

void KillAndReap(pid_t pid) {
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
}

// A GPU's labels as rendered (sorted by name) on node gpu-node-7, from kH100Csv.
std::string Gpu(int index) {
  static const char* const kUuids[] = {
      "GPU-8f6c3b1e-2a4d-4c1b-9e77-0d1c5a7e3f21", "GPU-1b2c9d3e-7f60-4a8b-b1c2-d3e4f5a6b7c8",
      "GPU-5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9", "GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"};
  return absl::StrCat(R"({Hostname="gpu-node-7",UUID=")", kUuids[index], R"(",gpu=")", index,
                      R"(",model_name="NVIDIA H100 80GB HBM3"})");
}

// The value of the sample whose line starts with `series` (name and labels), or -1.
double Sample(const std::string& body, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (!absl::StartsWith(line, series + " ")) continue;
    double v = 0;
    return absl::SimpleAtod(line.substr(series.size() + 1), &v) ? v : -1;
  }
  return -1;
}

TEST(GpuMetricsTest, ParsesNvidiaSmiRowsIntoBaseUnits) {
  std::vector<std::string> warnings;
  const std::vector<GpuReading> gpus = ParseGpuMetricsCsv(kH100Csv, &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings[0];
  ASSERT_EQ(gpus.size(), 4u);
  const GpuReading& busy = gpus[0];
  EXPECT_EQ(busy.index, 0);
  EXPECT_EQ(busy.uuid, "GPU-8f6c3b1e-2a4d-4c1b-9e77-0d1c5a7e3f21");
  EXPECT_EQ(busy.name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(busy.utilization_ratio, 0.97);
  EXPECT_EQ(busy.memory_used_bytes, 71234.0 * 1024 * 1024);
  EXPECT_EQ(busy.memory_total_bytes, 81559.0 * 1024 * 1024);
  EXPECT_EQ(busy.power_watts, 686.43);
  EXPECT_EQ(busy.temperature_celsius, 62);
  EXPECT_EQ(busy.sm_clock_hertz, 1980e6);
  EXPECT_EQ(busy.ecc_uncorrected_errors, 0);
  EXPECT_EQ(gpus[1].utilization_ratio, 0.0);
  // [N/A] and [Not Supported] give no reading, silently; the rest of the row stands.
  EXPECT_FALSE(gpus[2].power_watts.has_value());
  EXPECT_EQ(gpus[2].ecc_uncorrected_errors, 2);
  EXPECT_EQ(gpus[2].temperature_celsius, 48);
  EXPECT_FALSE(gpus[3].ecc_uncorrected_errors.has_value());
  EXPECT_EQ(gpus[3].power_watts, 120.5);
}

TEST(GpuMetricsTest, SkipsAMalformedRowOrFieldWithAWarningNamingIt) {
  std::vector<std::string> warnings;
  const std::vector<GpuReading> gpus = ParseGpuMetricsCsv(
      std::string(kH100Csv) +
          "4, GPU-9d8c7b6a-5f4e-4d3c-2b1a-0f9e8d7c6b5a, NVIDIA H100 80GB HBM3, 50\n"
          "x, GPU-aa, NVIDIA H100 80GB HBM3, 1, 2, 3, 4, 5, 6, 7\n"
          "6, GPU-bb, NVIDIA H100 80GB HBM3, 1, lots, 81559, 70.0, 30, 1980, 0\n",
      &warnings);
  ASSERT_EQ(gpus.size(), 5u);  // the four good rows, and row 6 without memory.used
  EXPECT_EQ(gpus[4].index, 6);
  EXPECT_FALSE(gpus[4].memory_used_bytes.has_value());
  EXPECT_EQ(gpus[4].memory_total_bytes, 81559.0 * 1024 * 1024);
  ASSERT_EQ(warnings.size(), 3u);
  EXPECT_TRUE(absl::StrContains(warnings[0], "line 5")) << warnings[0];
  EXPECT_TRUE(absl::StrContains(warnings[0], "expected 10 comma-separated columns, got 4"))
      << warnings[0];
  EXPECT_TRUE(absl::StrContains(warnings[1], "index is not a number")) << warnings[1];
  EXPECT_TRUE(absl::StrContains(warnings[2], "memory.used is 'lots'")) << warnings[2];
  // Null warnings are allowed.
  EXPECT_EQ(ParseGpuMetricsCsv("garbage\n", nullptr).size(), 0u);
}

TEST(GpuMetricsTest, RunsNvidiaSmiWithTheQueryAndReportsFailuresAndHangs) {
  testing::TempDir dir;
  // Answers only the exact query; anything else is an error, as the real one does.
  const std::string smi =
      Executable(dir, "nvidia-smi",
                 absl::StrCat("#!/bin/sh\n"
                              "[ \"$1\" = \"--query-gpu=",
                              kGpuMetricsQuery,
                              "\" ] && [ \"$2\" = \"--format=csv,noheader,nounits\" ] || "
                              "{ echo \"bad args: $*\"; exit 2; }\n"
                              "cat <<'CSV'\n",
                              kH100Csv, "CSV\n"));
  auto gpus = QueryGpuMetrics(smi, absl::Seconds(10), nullptr);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_EQ(gpus->size(), 4u);

  const std::string failing = Executable(
      dir, "failing-smi",
      "#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n");
  auto failed = QueryGpuMetrics(failing, absl::Seconds(10), nullptr);
  ASSERT_FALSE(failed.ok());
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "exit 18")) << failed.status();
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "Driver/library version mismatch"))
      << failed.status();

  // A hung nvidia-smi (a GPU fallen off the bus) is killed, its children with it.
  const std::string hung = Executable(dir, "hung-smi", "#!/bin/sh\nsleep 30 &\nsleep 30\n");
  const absl::Time start = absl::Now();
  auto timed_out = QueryGpuMetrics(hung, absl::Milliseconds(300), nullptr);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_FALSE(timed_out.ok());
  EXPECT_TRUE(absl::StrContains(timed_out.status().message(), "did not finish within"))
      << timed_out.status();

  EXPECT_FALSE(QueryGpuMetrics(dir.path() + "/absent", absl::Seconds(1), nullptr).ok());
}

TEST(GpuMetricsTest, FindsXidCodesInKernelLogLines) {
  // dmesg, /dev/kmsg records, syslog's kern.log, and the pre-R470 form without "PCI:".
  EXPECT_EQ(ParseXidLine("[ 4711.123456] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', "
                         "name=<unknown>, GPU has fallen off the bus."),
            79);
  EXPECT_EQ(
      ParseXidLine("3,1402,9386710123,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=88122, "
                   "name=trainctl-traine, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): "
                   "Out Of Range Address"),
      13);
  EXPECT_EQ(ParseXidLine("Dec  1 08:00:01 gpu-node-7 kernel: [ 4711.123456] NVRM: Xid "
                         "(PCI:0000:9a:00): 94, pid=88122, name=python3, Contained: SM (0x1). "
                         "RST: No, D-RST: No"),
            94);
  EXPECT_EQ(ParseXidLine("NVRM: Xid (0000:03:00): 31, Ch 00000002, engmask 00000101"), 31);
  EXPECT_EQ(ParseXidLine("NVRM: Xid (PCI:0000:18:00): 48"), 48);

  EXPECT_EQ(ParseXidLine("NVRM: GPU at PCI:0000:18:00: GPU-8f6c3b1e-2a4d-4c1b-9e77-0d1c5a7e3f21"),
            std::nullopt);
  EXPECT_EQ(ParseXidLine("NVRM: Xid (PCI:0000:18:00): , no code"), std::nullopt);
  EXPECT_EQ(ParseXidLine("NVRM: Xid (PCI:0000:18:00) 79"), std::nullopt);
  EXPECT_EQ(ParseXidLine("NVRM: Xid (PCI:0000:18:00): 79x, not a code"), std::nullopt);
  EXPECT_EQ(ParseXidLine(" SUBSYSTEM=pci"), std::nullopt);
  EXPECT_EQ(ParseXidLine("usb 1-1: new high-speed USB device number 2 using xhci_hcd"),
            std::nullopt);
}

TEST(GpuMetricsTest, KernelLogReaderFollowsAFileAndReportsAnUnreadableOne) {
  testing::TempDir dir;
  const std::string log = dir.Write(
      "kern.log",
      "[  1.000000] Linux version 6.1.0-13-amd64\n"
      "[ 12.5] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', GPU has fallen off the bus.\n");
  KernelLogReader reader(log);
  auto first = reader.ReadNewXids();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, std::vector<int>{79});
  auto none = reader.ReadNewXids();
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  {
    std::ofstream append(log, std::ios::app);
    append << "[ 13.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a\n"
           << "[ 13.1] NVRM: Xid (PCI:0000:3b:00): 4";  // the rest comes later
  }
  EXPECT_EQ(*reader.ReadNewXids(), std::vector<int>{13});
  {
    std::ofstream append(log, std::ios::app);
    append << "3, pid=2, name=b\n";
  }
  EXPECT_EQ(*reader.ReadNewXids(), std::vector<int>{43});

  KernelLogReader missing(dir.path() + "/no-such-log");
  auto error = missing.ReadNewXids();
  ASSERT_FALSE(error.ok());
  EXPECT_EQ(error.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(error.status().message(), "no-such-log")) << error.status();
  EXPECT_FALSE(missing.ReadNewXids().ok()) << "sticky";
}

TEST(ProcessStatsTest, ParsesProcStatAndReadsALiveProcess) {
  auto sample = ParseProcStat(kProcStat, 100, 4096);
  ASSERT_TRUE(sample.ok()) << sample.status();
  EXPECT_EQ(sample->state, 'S');
  EXPECT_EQ(sample->process_group, 48211);
  EXPECT_DOUBLE_EQ(sample->cpu_seconds, 17.5);  // (1500 + 250) ticks at 100 Hz
  EXPECT_EQ(sample->resident_bytes, int64_t{262144} * 4096);
  EXPECT_EQ(sample->start_ticks, 88123u);

  auto truncated = ParseProcStat("48211 (train) S 48190 48211", 100, 4096);
  ASSERT_FALSE(truncated.ok());
  EXPECT_TRUE(absl::StrContains(truncated.status().message(), "expected at least 24"));
  auto no_comm = ParseProcStat("48211 train S", 100, 4096);
  EXPECT_FALSE(no_comm.ok());
  std::string bad = kProcStat;
  bad.replace(bad.find(" 1500 "), 6, " lots ");
  auto bad_utime = ParseProcStat(bad, 100, 4096);
  ASSERT_FALSE(bad_utime.ok());
  EXPECT_TRUE(absl::StrContains(bad_utime.status().message(), "utime (field 14) is 'lots'"))
      << bad_utime.status();

  auto self = ReadProcessSample(getpid());
  ASSERT_TRUE(self.ok()) << self.status();
  EXPECT_EQ(self->process_group, getpgrp());
  EXPECT_GT(self->resident_bytes, 0);

  const pid_t gone = Spawn("exit 0", true);
  int status = 0;
  waitpid(gone, &status, 0);
  EXPECT_EQ(ReadProcessSample(gone).status().code(), absl::StatusCode::kNotFound);
}

class NodeMetricsTest : public ::testing::Test {
 protected:
  NodeMetricsTest() {
    csv_ = dir_.Write("smi.csv", kH100Csv);
    smi_ = Executable(dir_, "nvidia-smi", "#!/bin/sh\ncat '" + csv_ + "'\n");
    kernel_log_ = dir_.Write("kern.log", "");
  }

  NodeMetricsOptions Options() {
    NodeMetricsOptions options;
    options.node_name = "gpu-node-7";
    options.version = "0.1.0";
    options.nvidia_smi = smi_;
    options.kernel_log = kernel_log_;
    return options;
  }

  testing::TempDir dir_;
  std::string csv_, smi_, kernel_log_;
  metrics::Registry registry_;
};

TEST_F(NodeMetricsTest, RendersTheWorkerItsRanksAndItsGpusPromtoolClean) {
  const pid_t busy = Spawn("while :; do :; done", /*own_group=*/true);
  const pid_t not_leader = Spawn("exec sleep 30", /*own_group=*/false);
  WorkerStats stats;
  stats.connected = true;
  stats.reconnects = 2;
  stats.slots = 8;
  stats.tasks = 1;
  stats.outbox_messages = 17;
  stats.outbox_spilled_bytes = 4096;
  stats.ranks = {{"job-1", "job-1.0.0", 0, busy}, {"job-1", "job-1.0.0", 1, not_leader}};
  NodeMetrics node(Options(), &registry_, [&] { return stats; });
  {
    std::ofstream(kernel_log_)
        << "[ 12.5] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', GPU has fallen off the bus.\n"
        << "[ 13.0] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', GPU has fallen off the bus.\n"
        << "[ 14.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, Graphics Exception\n";
  }
  node.PollOnce();

  const std::string rank0 = R"({job="job-1",node="gpu-node-7",rank="0",task="job-1.0.0"})";
  std::string body;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        body = registry_.Render();
        return Sample(body, "trainctl_rank_cpu_seconds_total" + rank0) >= 0.05;
      },
      absl::Seconds(20)))
      << body;
  KillAndReap(busy);
  KillAndReap(not_leader);

  EXPECT_EQ(testing::PromtoolCheckMetrics(body), "") << body;
  const std::string node_label = R"({node="gpu-node-7"})";
  EXPECT_EQ(Sample(body, R"(trainctl_worker_info{node="gpu-node-7",version="0.1.0"})"), 1);
  EXPECT_EQ(Sample(body, "trainctl_worker_slots" + node_label), 8);
  EXPECT_EQ(Sample(body, "trainctl_worker_connected" + node_label), 1);
  EXPECT_EQ(Sample(body, "trainctl_worker_reconnects_total" + node_label), 2);
  EXPECT_EQ(Sample(body, "trainctl_worker_outbox_messages" + node_label), 17);
  EXPECT_EQ(Sample(body, "trainctl_worker_outbox_spilled_bytes" + node_label), 4096);
  EXPECT_EQ(Sample(body, "trainctl_worker_tasks" + node_label), 1);
  EXPECT_GT(Sample(body, "trainctl_rank_resident_memory_bytes" + rank0), 0);
  // Not the leader of its own group: not (or no longer) the rank that pid was given to.
  EXPECT_FALSE(absl::StrContains(body, R"(rank="1")")) << body;

  const std::string gpu0 = Gpu(0);
  EXPECT_EQ(Sample(body, "trainctl_gpu_utilization_ratio" + gpu0), 0.97);
  EXPECT_EQ(Sample(body, "trainctl_gpu_memory_used_bytes" + gpu0), 71234.0 * 1024 * 1024);
  EXPECT_EQ(Sample(body, "trainctl_gpu_memory_total_bytes" + gpu0), 81559.0 * 1024 * 1024);
  EXPECT_EQ(Sample(body, "trainctl_gpu_power_watts" + gpu0), 686.43);
  EXPECT_EQ(Sample(body, "trainctl_gpu_temperature_celsius" + gpu0), 62);
  EXPECT_EQ(Sample(body, "trainctl_gpu_sm_clock_hertz" + gpu0), 1980e6);
  EXPECT_EQ(Sample(body, "trainctl_gpu_ecc_uncorrected_errors_total" + gpu0), 0);
  const std::string gpu2 = Gpu(2);
  EXPECT_EQ(Sample(body, "trainctl_gpu_power_watts" + gpu2), -1) << "[N/A]: no sample";
  EXPECT_EQ(Sample(body, "trainctl_gpu_ecc_uncorrected_errors_total" + gpu2), 2);
  EXPECT_EQ(Sample(body, "trainctl_gpu_ecc_uncorrected_errors_total" + Gpu(3)), -1);
  EXPECT_EQ(Sample(body, "trainctl_gpu_power_watts" + Gpu(3)), 120.5);
  EXPECT_EQ(Sample(body, R"(trainctl_gpu_xid_errors_total{Hostname="gpu-node-7",xid="79"})"), 2);
  EXPECT_EQ(Sample(body, R"(trainctl_gpu_xid_errors_total{Hostname="gpu-node-7",xid="13"})"), 1);

  // The rank is gone, and the task with it: its series go too.
  stats.ranks.clear();
  stats.tasks = 0;
  body = registry_.Render();
  EXPECT_FALSE(absl::StrContains(body, "trainctl_rank_cpu_seconds_total{")) << body;
  EXPECT_FALSE(absl::StrContains(body, "trainctl_rank_resident_memory_bytes{")) << body;
  EXPECT_EQ(testing::PromtoolCheckMetrics(body), "") << body;
}

TEST_F(NodeMetricsTest, FollowsTheGpusAcrossPollsAndDropsThemWhenNvidiaSmiFails) {
  NodeMetrics node(Options(), &registry_, nullptr);
  node.PollOnce();
  const std::string gpu2 = Gpu(2);
  EXPECT_EQ(Sample(registry_.Render(), "trainctl_gpu_ecc_uncorrected_errors_total" + gpu2), 2);

  // GPU 2 gains ECC errors and its power reading comes back; GPU 0's temperature turns [N/A].
  std::string csv = kH100Csv;
  csv.replace(csv.find("[N/A], 48, 1755, 2"), 18, "300.25, 48, 1755, 5");
  csv.replace(csv.find("686.43, 62"), 10, "686.43, [N/A]");
  std::ofstream(csv_) << csv;
  node.PollOnce();
  std::string body = registry_.Render();
  EXPECT_EQ(Sample(body, "trainctl_gpu_ecc_uncorrected_errors_total" + gpu2), 5);
  EXPECT_EQ(Sample(body, "trainctl_gpu_power_watts" + gpu2), 300.25);
  EXPECT_EQ(Sample(body, "trainctl_gpu_temperature_celsius" + Gpu(0)), -1) << body;
  EXPECT_EQ(Sample(body, "trainctl_gpu_temperature_celsius" + Gpu(1)), 31) << body;

  // The driver reloaded (volatile ECC counts start again): a counter reset, not a negative step.
  csv.replace(csv.find("1755, 5"), 7, "1755, 1");
  std::ofstream(csv_) << csv;
  node.PollOnce();
  EXPECT_EQ(Sample(registry_.Render(), "trainctl_gpu_ecc_uncorrected_errors_total" + gpu2), 1);

  // nvidia-smi failing: no GPU series rather than stale ones.
  std::ofstream(smi_)
      << "#!/bin/sh\necho 'Unable to determine the device handle for GPU2'\nexit 15\n";
  node.PollOnce();
  body = registry_.Render();
  EXPECT_FALSE(absl::StrContains(body, "trainctl_gpu_utilization_ratio{")) << body;
  EXPECT_FALSE(absl::StrContains(body, "trainctl_gpu_ecc_uncorrected_errors_total{")) << body;
  EXPECT_EQ(testing::PromtoolCheckMetrics(body), "") << body;
}

TEST_F(NodeMetricsTest, ACpuNodeHasNoGpuSeriesAndAnUnreadableKernelLogNoXidSeries) {
  NodeMetricsOptions cpu = Options();
  cpu.nvidia_smi = "";
  {
    NodeMetrics node(cpu, &registry_, [] { return WorkerStats{}; });
    node.Start();  // nothing to poll: no thread
    node.PollOnce();
    const std::string body = registry_.Render();
    EXPECT_FALSE(absl::StrContains(body, "trainctl_gpu_utilization_ratio{")) << body;
    EXPECT_EQ(Sample(body, R"(trainctl_worker_connected{node="gpu-node-7"})"), 0);
    EXPECT_EQ(testing::PromtoolCheckMetrics(body), "") << body;
  }
  metrics::Registry other;
  NodeMetricsOptions unreadable = Options();
  unreadable.kernel_log = dir_.path() + "/no-such-log";
  NodeMetrics node(unreadable, &other, nullptr);
  node.PollOnce();
  node.PollOnce();
  const std::string body = other.Render();
  EXPECT_TRUE(absl::StrContains(body, "trainctl_gpu_utilization_ratio{")) << body;
  EXPECT_FALSE(absl::StrContains(body, "trainctl_gpu_xid_errors_total{")) << body;
}

TEST_F(NodeMetricsTest, ThePollerRunsInTheBackgroundAndStopsPromptly) {
  NodeMetricsOptions options = Options();
  options.poll_interval = absl::Milliseconds(50);
  auto node = std::make_unique<NodeMetrics>(options, &registry_, nullptr);
  node->Start();
  { std::ofstream(kernel_log_) << "[ 1.0] NVRM: Xid (PCI:0000:18:00): 31, pid=9, name=x\n"; }
  std::string body;
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        body = registry_.Render();
        return absl::StrContains(body, R"(xid="31")") &&
               absl::StrContains(body, "trainctl_gpu_power_watts{");
      },
      absl::Seconds(10)))
      << body;
  const absl::Time start = absl::Now();
  node.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

}  // namespace
}  // namespace trainctl::worker
