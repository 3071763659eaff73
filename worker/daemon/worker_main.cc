// trainctl-worker: the daemon on each node. Registers the node's GPUs (or CPU slots) with the
// coordinator, runs the ranks of the tasks placed on it, and streams their status, logs and events.
//
//   trainctl-worker --coordinator HOST:PORT[,HOST:PORT...] [--node_name NAME]
//                   [--advertise_addr ADDR] [--work_dir DIR] [--labels k=v,k=v] [--slots N]
//                   [--metrics_listen HOST:PORT] [--kernel_log PATH]
//                   [--sysfs_root DIR] [--proc_modules PATH]
#include <limits.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/access_tokens.h"
#include "common/build_info.h"
#include "common/client_config.h"
#include "common/clock.h"
#include "common/credentials.h"
#include "common/daemon.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/rank_env.h"
#include "common/service_loop_reporter.h"
#include "common/service_notifier.h"
#include "common/status_macros.h"
#include "common/worker_limits.h"
#include "worker/daemon/gpu_discovery.h"
#include "worker/daemon/node_metrics.h"
#include "worker/daemon/rank_user.h"
#include "worker/daemon/topology_probe.h"
#include "worker/daemon/worker.h"

extern char** environ;

ABSL_FLAG(std::string, coordinator, "127.0.0.1:50051",
          "the coordinator's HOST[:PORT] (port 50051 when omitted), or a comma-separated list: an "
          "active coordinator and its standbys, tried in turn until one takes the session");
ABSL_FLAG(std::string, node_name, "", "this node's name (default: the host name)");
ABSL_FLAG(std::string, advertise_addr, "",
          "the IPv4 address other nodes reach this one at (default: 127.0.0.1 when the "
          "coordinator is on loopback, else the host name's address)");
ABSL_FLAG(std::string, work_dir, "./var/worker", "rank logs, task specs, the outbox spill file");
ABSL_FLAG(std::string, labels, "", "node labels for job node_selectors: k=v,k=v");
ABSL_FLAG(std::string, output_roots, "",
          "directories jobs may write under (their output_dir), comma-separated; a launch whose "
          "paths resolve elsewhere fails (default: --work_dir)");
ABSL_FLAG(int, slots, 1, "CPU slots (ranks) offered when the node has no GPU");
ABSL_FLAG(std::string, nvidia_smi, "nvidia-smi", "GPU discovery program (absent: a CPU node)");
ABSL_FLAG(std::string, trainer, "",
          "the rank program (default: trainctl-trainer next to this binary or in ../trainer)");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(2), "how often to heartbeat");
ABSL_FLAG(absl::Duration, kill_grace, absl::Seconds(10),
          "SIGTERM -> SIGKILL grace when stopping ranks");
ABSL_FLAG(absl::Duration, reconnect_max, absl::Seconds(5),
          "longest wait between attempts to reach the coordinator (exponential back-off; with "
          "several --coordinator addresses, between rounds that try each once)");
ABSL_FLAG(std::string, log_level, "info", "debug | info | warning | error");
ABSL_FLAG(int64_t, rank_log_rate, int64_t{1} << 20,
          "bytes per second of each rank's output forwarded to the coordinator, after a burst of "
          "--rank_log_burst (0: no limit); the rest stays in the rank's log file");
ABSL_FLAG(int64_t, rank_log_burst, int64_t{8} << 20,
          "bytes of a rank's output forwarded at once before --rank_log_rate applies");
ABSL_FLAG(int64_t, max_rank_log_bytes, int64_t{4} << 30,
          "bytes each rank's log file (<work_dir>/tasks/<task>/rank-<r>.log) keeps at most "
          "(0: no limit)");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics on HOST:PORT (GET /metrics); empty: off. The documented port "
          "is 9402");
ABSL_FLAG(std::string, metrics_ready_file, "",
          "once /metrics is served, write its bound HOST:PORT to this file (scripts, tests)");
ABSL_FLAG(std::string, kernel_log, "/dev/kmsg",
          "kernel log to count NVIDIA Xid errors in (/dev/kmsg needs CAP_SYSLOG or "
          "kernel.dmesg_restrict=0; a file such as /var/log/kern.log works too); empty: none");
ABSL_FLAG(absl::Duration, gpu_metrics_interval, absl::Seconds(5),
          "how often nvidia-smi and the kernel log are read for /metrics");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that signs the coordinator's certificate: TLS to the coordinator");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate (mTLS); its CN or a DNS name must be --node_name");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, token_file, "",
          "file holding this worker's bearer token (role worker), when the coordinator has "
          "--tokens_file; read again before every session, so a rotated token is used from the "
          "next reconnect; default: $TRAINCTL_TOKEN");
ABSL_FLAG(std::string, rank_env_allow, "",
          "environment variables a job's env may set in its ranks besides the default allowlist "
          "(docs/security.md: NCCL_*, CUDA_*, TORCH_*, ...): comma-separated exact names and "
          "PREFIX_* patterns; give the coordinator and every worker the same list");
ABSL_FLAG(std::string, rank_user, "",
          "run ranks as this user (name or uid), so they cannot read the worker's token file and "
          "TLS key; needs root or CAP_SETUID+CAP_SETGID. Default: the worker's own user");
ABSL_FLAG(std::string, sysfs_root, "/sys",
          "where the topology probe reads class/infiniband (RDMA ports) and class/net");
ABSL_FLAG(std::string, proc_modules, "/proc/modules",
          "where the topology probe looks for a GPUDirect RDMA peer-memory module");

ABSL_FLAG(std::string, testonly_stall_file, "",
          "TEST ONLY, never in production: while this file exists the session loop hangs, so its "
          "systemd watchdog pings (WATCHDOG=1) stop as a deadlocked loop's would");

namespace trainctl::worker {
namespace {

namespace v1 = trainctl::v1;

std::string SelfDir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  return std::filesystem::path(std::string(buf, n)).parent_path().string();
}

std::string DefaultTrainer() {
  const std::filesystem::path dir = SelfDir();
  for (const auto& candidate :
       {dir / "trainctl-trainer", dir / ".." / "trainer" / "trainctl-trainer"}) {
    if (std::filesystem::exists(candidate)) return std::filesystem::canonical(candidate).string();
  }
  return "";
}

std::string HostName() {
  char buf[HOST_NAME_MAX + 1] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// TLS to the coordinator and the bearer token, from the flags and $TRAINCTL_TOKEN (the one
// environment variable the worker reads). A client certificate that does not hold the node's name
// is an error here: the coordinator would refuse every session.
absl::Status SetUpCredentials(WorkerOptions* options) {
  TlsOptions tls;
  tls.ca = absl::GetFlag(FLAGS_tls_ca);
  tls.cert = absl::GetFlag(FLAGS_tls_cert);
  tls.key = absl::GetFlag(FLAGS_tls_key);
  auto credentials = MakeChannelCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  options->credentials = *std::move(credentials);
  if (!tls.cert.empty()) {
    std::ifstream in(tls.cert);
    std::ostringstream pem;
    pem << in.rdbuf();
    auto names = CertificateNames(pem.str());
    if (!names.ok()) return absl::InvalidArgumentError(absl::StrCat("--tls_cert: ", tls.cert));
    if (std::find(names->begin(), names->end(), options->node_name) == names->end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls_cert: ", tls.cert, " holds ",
                       names->empty() ? std::string("no name") : absl::StrJoin(*names, ", "),
                       ", not the node name '", options->node_name,
                       "': the coordinator would refuse this node (see --node_name)"));
    }
  }
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    auto token = ReadTokenFile(path);
    if (!token.ok())
      return absl::InvalidArgumentError(absl::StrCat("--token_file: ", token.status().message()));
    options->token = *std::move(token);
    options->token_file = path;  // read again before each session: a rotated token needs no restart
  } else if (const char* env = std::getenv("TRAINCTL_TOKEN"); env != nullptr) {
    options->token = std::string(absl::StripAsciiWhitespace(env));
  }
  return absl::OkStatus();
}

// What the ranks may be given and who they run as: --rank_env_allow, --rank_user (tried now, so
// that a worker without the privilege fails at start-up rather than on every task).
absl::Status SetUpRanks(WorkerOptions* options) {
  auto policy = RankEnvPolicy::WithExtra(absl::GetFlag(FLAGS_rank_env_allow));
  if (!policy.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank_env_allow: ", policy.status().message()));
  }
  options->rank_env = *std::move(policy);
  if (const std::string name = absl::GetFlag(FLAGS_rank_user); !name.empty()) {
    auto user = LookUpRankUser(name);
    if (!user.ok())
      return absl::InvalidArgumentError(absl::StrCat("--rank_user: ", user.status().message()));
    if (absl::Status s = CheckCanRunAs(*user); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("--rank_user: ", s.message()));
    }
    options->rank_user = *std::move(user);
  } else if (!options->token.empty() || !absl::GetFlag(FLAGS_tls_key).empty()) {
    TRAINCTL_LOG(WARNING) << "ranks run as this worker's user and can read its credentials ("
                          << (options->token_file.empty() ? "token" : options->token_file)
                          << (absl::GetFlag(FLAGS_tls_key).empty()
                                  ? ""
                                  : absl::StrCat(", ", absl::GetFlag(FLAGS_tls_key)))
                          << "); set --rank_user to run them as another user";
  }
  return absl::OkStatus();
}

// Where the coordinator is and what this node offers it: --coordinator, --node_name,
// --advertise_addr, --work_dir, --labels, --output_roots, --slots.
absl::Status ReadNodeFlags(WorkerOptions* options) {
  // Without a port: 50051, not the 443 gRPC's resolver would dial (common/client_config.h).
  absl::StatusOr<std::vector<std::string>> targets =
      CoordinatorTargets(absl::GetFlag(FLAGS_coordinator));
  if (!targets.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--coordinator: ", targets.status().message()));
  }
  options->coordinators = *std::move(targets);
  options->node_name = absl::GetFlag(FLAGS_node_name);
  if (options->node_name.empty()) options->node_name = HostName();
  options->advertise_addr = absl::GetFlag(FLAGS_advertise_addr);
  if (options->advertise_addr.empty()) {
    const bool loopback = std::all_of(
        options->coordinators.begin(), options->coordinators.end(), [](const std::string& c) {
          return absl::StartsWith(c, "127.") || absl::StartsWith(c, "localhost:");
        });
    options->advertise_addr = loopback ? "127.0.0.1" : HostName();
  }
  options->work_dir = absl::GetFlag(FLAGS_work_dir);
  for (absl::string_view kv : absl::StrSplit(absl::GetFlag(FLAGS_labels), ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    if (p.first.empty() || !absl::StrContains(kv, '=')) {
      return absl::InvalidArgumentError(absl::StrCat("--labels: '", kv, "' is not key=value"));
    }
    options->labels[p.first] = p.second;
  }
  for (absl::string_view root :
       absl::StrSplit(absl::GetFlag(FLAGS_output_roots), ',', absl::SkipEmpty())) {
    options->output_roots.emplace_back(root);
  }
  options->cpu_slots = absl::GetFlag(FLAGS_slots);
  if (options->cpu_slots < 1) return absl::InvalidArgumentError("--slots: must be at least 1");
  return absl::OkStatus();
}

// What the coordinator will check, checked here first: a node it would refuse does not start.
absl::Status CheckRegistrable(const WorkerOptions& options) {
  v1::RegisterWorker probe;
  probe.set_node_name(options.node_name);
  probe.set_advertise_addr(options.advertise_addr);
  probe.mutable_labels()->insert(options.labels.begin(), options.labels.end());
  for (const v1::GpuInfo& gpu : options.gpus) *probe.mutable_resources()->add_gpus() = gpu;
  probe.mutable_resources()->set_cpu_slots(options.gpus.empty() ? options.cpu_slots : 0);
  probe.set_boot_id("start-up");
  if (absl::Status s = CheckRegisterWorker(probe); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the coordinator would refuse this node: ", s.message(),
                     " (see --node_name, --advertise_addr, --labels, --slots)"));
  }
  return absl::OkStatus();
}

// The node's topology probe (topology_probe.h) over its GPUs and the NCCL settings its ranks
// inherit, with each probe error logged.
std::function<v1::NodeTopology()> MakeTopologyProbe(const std::vector<v1::GpuInfo>& gpus) {
  TopologyProbeOptions probe;
  probe.gpus = gpus;
  probe.nvidia_smi = absl::GetFlag(FLAGS_nvidia_smi);
  probe.sysfs_root = absl::GetFlag(FLAGS_sysfs_root);
  probe.proc_modules = absl::GetFlag(FLAGS_proc_modules);
  // The one place the worker reads its environment: the NCCL settings its ranks inherit.
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos || !IsNcclRelevant(entry.substr(0, eq))) continue;
    probe.environment.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return [probe] {
    v1::NodeTopology topology = ProbeTopology(probe, absl::Now());
    for (const std::string& error : topology.probe_errors()) {
      TRAINCTL_LOG(WARNING) << "topology probe: " << error;
    }
    return topology;
  };
}

// The rank program and how its ranks are supervised: --trainer, --heartbeat_interval,
// --kill_grace, --rank_log_rate, --rank_log_burst, --max_rank_log_bytes, --reconnect_max.
absl::Status ReadRankFlags(WorkerOptions* options) {
  options->trainer_bin = absl::GetFlag(FLAGS_trainer);
  if (options->trainer_bin.empty()) options->trainer_bin = DefaultTrainer();
  if (options->trainer_bin.empty() || access(options->trainer_bin.c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("--trainer: no executable rank program at '", options->trainer_bin, "'"));
  }
  options->trainer_bin = std::filesystem::absolute(options->trainer_bin).string();
  options->heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  options->kill_grace = absl::GetFlag(FLAGS_kill_grace);
  const int64_t rate = absl::GetFlag(FLAGS_rank_log_rate);
  const int64_t burst = absl::GetFlag(FLAGS_rank_log_burst);
  const int64_t max_bytes = absl::GetFlag(FLAGS_max_rank_log_bytes);
  if (rate < 0 || burst < 65536 || max_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rank_log_rate and --max_rank_log_bytes must be at least 0 and --rank_log_burst at "
        "least 65536 (a whole line), got ",
        rate, ", ", max_bytes, " and ", burst));
  }
  options->rank_log_rate_bytes = static_cast<double>(rate);
  options->rank_log_burst_bytes = static_cast<double>(burst);
  options->max_rank_log_bytes = max_bytes;
  options->reconnect_max = absl::GetFlag(FLAGS_reconnect_max);
  return absl::OkStatus();
}

// The worker's options from its flags; `exit_code` is what main returns when they fail (2: a
// flag that says something impossible, 1: the node lacks what they name).
absl::StatusOr<WorkerOptions> ReadOptions(int* exit_code) {
  WorkerOptions options;
  *exit_code = 2;
  RETURN_IF_ERROR(ReadNodeFlags(&options));
  *exit_code = 1;
  auto gpus = DiscoverGpus(absl::GetFlag(FLAGS_nvidia_smi));
  if (!gpus.ok()) {
    return absl::Status(gpus.status().code(),
                        absl::StrCat("GPU discovery: ", gpus.status().message()));
  }
  options.gpus = std::move(*gpus);
  *exit_code = 2;
  RETURN_IF_ERROR(CheckRegistrable(options));
  options.probe_topology = MakeTopologyProbe(options.gpus);
  *exit_code = 1;
  RETURN_IF_ERROR(ReadRankFlags(&options));
  *exit_code = 2;
  RETURN_IF_ERROR(SetUpCredentials(&options));
  RETURN_IF_ERROR(SetUpRanks(&options));
  if (absl::GetFlag(FLAGS_gpu_metrics_interval) <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--gpu_metrics_interval: must be positive");
  }
  return options;
}

// The node's /metrics (--metrics_listen) over `worker`'s stats; null without the flag.
std::unique_ptr<NodeMetrics> MakeNodeMetrics(const WorkerOptions& options, Worker* worker,
                                             metrics::Registry* registry) {
  if (absl::GetFlag(FLAGS_metrics_listen).empty()) return nullptr;
  NodeMetricsOptions metrics_options;
  metrics_options.node_name = options.node_name;
  metrics_options.version = BuildVersion();
  if (!options.gpus.empty()) metrics_options.nvidia_smi = absl::GetFlag(FLAGS_nvidia_smi);
  metrics_options.kernel_log = absl::GetFlag(FLAGS_kernel_log);
  metrics_options.poll_interval = absl::GetFlag(FLAGS_gpu_metrics_interval);
  return std::make_unique<NodeMetrics>(std::move(metrics_options), registry,
                                       [worker] { return worker->Stats(); });
}

// Runs the worker until a stop signal in `signals`. Exit code.
int Serve(const sigset_t& signals, absl::Duration watchdog_interval, WorkerOptions options) {
  // Rank descendants orphaned by a rank are reparented here, so their groups can be reaped even
  // where pid 1 does not reap (rank_launcher.h).
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  // systemd (Type=notify): READY=1 once registered with the coordinator, STATUS= lines and
  // WATCHDOG=1 from the session loop, STOPPING=1 on a stop signal. Nothing without $NOTIFY_SOCKET.
  RealClock clock;
  SystemdNotifier service_notifier;
  ServiceLoopReporter service(&service_notifier, &clock,
                              {watchdog_interval, absl::GetFlag(FLAGS_testonly_stall_file)});
  options.on_loop = [&service, node = options.node_name](const WorkerLoopSummary& summary) {
    const std::string tasks = absl::StrCat(summary.tasks, summary.tasks == 1 ? " task" : " tasks");
    service.Tick(
        summary.registered,
        summary.registered
            ? absl::StrCat("registered as ", node, " with ", summary.coordinator, ", ", tasks)
            : absl::StrCat("connecting to ", summary.coordinator, " as ", node, ", ", tasks));
  };
  // Declared before the worker, so the metrics (which read it) go first.
  metrics::Registry registry;
  Worker worker(options);
  std::unique_ptr<NodeMetrics> node_metrics = MakeNodeMetrics(options, &worker, &registry);
  auto metrics_server = metrics::StartDaemonMetrics(&registry, absl::GetFlag(FLAGS_metrics_listen),
                                                    absl::GetFlag(FLAGS_metrics_ready_file));
  if (!metrics_server.ok()) {
    TRAINCTL_LOG(ERROR) << metrics_server.status().message();
    return 2;
  }
  if (node_metrics != nullptr) node_metrics->Start();
  {
    StopSignalThread stopper(signals, [&worker, &service](int) {
      service.Stopping("stopping: ending ranks, reporting them");
      worker.Stop();
    });
    worker.Run();  // returns after Stop
  }
  TRAINCTL_LOG(INFO) << "stopped";
  return 0;
}

int Run() {
  // Signals are taken by one thread with sigwait, so they are blocked before any other thread
  // starts.
  sigset_t signals;
  if (absl::Status s = InitDaemon(absl::GetFlag(FLAGS_log_level), &signals); !s.ok()) {
    TRAINCTL_LOG(ERROR) << s.message();
    return 2;
  }
  // Before any thread starts: it also removes the variables from the environment.
  const absl::Duration watchdog_interval = TakeSystemdWatchdogInterval();
  int exit_code = 0;
  absl::StatusOr<WorkerOptions> options = ReadOptions(&exit_code);
  if (!options.ok()) {
    TRAINCTL_LOG(ERROR) << options.status().message();
    return exit_code;
  }
  TRAINCTL_LOG(INFO) << "trainctl-worker " << options->node_name << " (" << options->advertise_addr
                     << "): "
                     << (options->gpus.empty() ? absl::StrCat(options->cpu_slots, " CPU slots")
                                               : absl::StrCat(options->gpus.size(), " GPUs"))
                     << ", coordinator " << absl::StrJoin(options->coordinators, ",")
                     << ", work dir " << options->work_dir << ", jobs write under "
                     << (options->output_roots.empty() ? options->work_dir
                                                       : absl::StrJoin(options->output_roots, ","));
  return Serve(signals, watchdog_interval, *std::move(options));
}

}  // namespace
}  // namespace trainctl::worker

int main(int argc, char** argv) {
  trainctl::ParseDaemonFlags(
      argc, argv, "trainctl-worker",
      "trainctl-worker --coordinator HOST:PORT[,...] [--node_name N] [--advertise_addr A] "
      "[--work_dir D] [--labels k=v,...] [--slots N] [--metrics_listen HOST:PORT]");
  return trainctl::worker::Run();
}
