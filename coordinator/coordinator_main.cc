// trainctl-coordinator: accepts job specs over gRPC, keeps jobs, events and logs in SQLite, and
// schedules jobs onto the worker daemons connected to it (WorkerService).
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/access_tokens.h"
#include "common/build_info.h"
#include "common/clock.h"
#include "common/credentials.h"
#include "common/daemon.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/rank_env.h"
#include "common/service_loop_reporter.h"
#include "common/service_notifier.h"
#include "common/thread_pool.h"
#include "coordinator/cluster.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/db_lock.h"
#include "coordinator/diagnosis_metrics.h"
#include "coordinator/in_memory_job_store.h"
#include "coordinator/job_diagnoser.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_metrics.h"
#include "coordinator/job_notifier.h"
#include "coordinator/job_service.h"
#include "coordinator/node_inventory.h"
#include "coordinator/rpc_authorizer.h"
#include "coordinator/rpc_metrics.h"
#include "coordinator/sqlite_job_store.h"
#include "coordinator/worker_service.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "HOST:PORT to serve gRPC on (port 0: any free port)");
ABSL_FLAG(std::string, db, "./var/trainctl.db", "SQLite database file (':memory:' keeps nothing)");
ABSL_FLAG(std::string, db_sync, "full",
          "full: fsync every commit (survives power loss); normal: survives process crashes only");
ABSL_FLAG(std::string, log_level, "info", "debug | info | warning | error");
ABSL_FLAG(int, rpc_threads, 16, "threads that run blocking RPC work (SQLite)");
ABSL_FLAG(
    absl::Duration, lease_timeout, absl::Seconds(10),
    "a worker that sends nothing (heartbeats included) for this long is lost; its tasks fail");
ABSL_FLAG(
    absl::Duration, recovery_grace, absl::ZeroDuration(),
    "after a restart, how long placed jobs wait for their workers to report (0: lease + 10s)");
ABSL_FLAG(absl::Duration, topology_refresh_timeout, absl::Seconds(15),
          "how long `trainctl nodes NODE --topology --refresh` waits for the node's fresh probe");
ABSL_FLAG(std::string, ready_file, "",
          "once serving, write the bound HOST:PORT to this file (for scripts and tests)");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT to serve Prometheus /metrics on (the documented port is 9401, e.g. "
          "0.0.0.0:9401; port 0: any free port); empty: no metrics endpoint");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain to serve TLS with (with --tls_key); empty: plaintext");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that signs client certificates: clients may present one and workers must (mTLS; "
          "a worker's node name must be its certificate's CN or a DNS name of it)");
ABSL_FLAG(bool, tls_require_client_cert, false,
          "with --tls_ca: demand a client certificate from every client at the handshake (CLI "
          "users and health probes too)");
ABSL_FLAG(std::string, tokens_file, "",
          "bearer tokens with roles, one 'SUBJECT ROLE SHA256-HEX' per line (roles: admin, user, "
          "viewer, worker); empty: no authentication. Read again on SIGHUP (systemctl reload): "
          "a file that does not parse leaves the tokens in force");
ABSL_FLAG(std::string, rank_env_allow, "",
          "environment variables a job's env may set in its ranks besides the default allowlist "
          "(docs/security.md: NCCL_*, CUDA_*, TORCH_*, ...): comma-separated exact names and "
          "PREFIX_* patterns; give the coordinator and every worker the same list");
ABSL_FLAG(int64_t, max_job_log_bytes, int64_t{64} << 20,
          "rank log text stored per job at most (bytes); later lines are dropped with a warning "
          "event (workers keep every rank's whole output in their rank log files)");
ABSL_FLAG(std::string, metrics_ready_file, "",
          "once /metrics is served, write its bound HOST:PORT to this file (written before "
          "--ready_file)");

ABSL_FLAG(std::string, testonly_stall_file, "",
          "TEST ONLY, never in production: while this file exists the cluster loop hangs, so its "
          "systemd watchdog pings (WATCHDOG=1) stop as a deadlocked loop's would");

namespace trainctl {
namespace {

absl::Status CreateParentDirectory(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", parent.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<JobStore>> OpenStore(const std::string& path,
                                                    const std::string& sync) {
  if (path == ":memory:") return std::unique_ptr<JobStore>(new InMemoryJobStore());
  if (sync != "full" && sync != "normal") {
    return absl::InvalidArgumentError(
        absl::StrCat("--db_sync must be full or normal, got '", sync, "'"));
  }
  SqliteJobStore::Options options;
  options.path = path;
  options.synchronous_full = sync == "full";
  auto store = SqliteJobStore::Open(options);
  if (!store.ok()) return store.status();
  return std::unique_ptr<JobStore>(std::move(*store));
}

std::string BoundAddress(const std::string& listen, int port) {
  const auto colon = listen.rfind(':');
  return absl::StrCat(listen.substr(0, colon), ":", port);
}

// The tokens file read again (SIGHUP): the new tokens take effect for the calls that follow. A file
// that cannot be read or parsed changes nothing: the tokens in force stay, and the error is logged
// and counted (trainctl_tokens_reloads_total{result="error"}), never a locked-out cluster.
class TokenReloader {
 public:
  TokenReloader(std::string path, RpcAuthorizer* authorizer, metrics::Registry* registry,
                size_t loaded)
      : path_(std::move(path)),
        authorizer_(authorizer),
        reloads_(
            registry->AddCounter("trainctl_tokens_reloads_total",
                                 "Reloads of the tokens file on SIGHUP, by result (ok, error).")),
        // Both series from the start, at 0: the first failure is then an increase for the alert.
        reloads_ok_(reloads_.Add({{"result", "ok"}})),
        reloads_error_(reloads_.Add({{"result", "error"}})),
        tokens_(
            registry
                ->AddGauge("trainctl_bearer_tokens", "Bearer tokens in force from --tokens_file.")
                .Add({})) {
    tokens_.Set(static_cast<double>(loaded));
  }

  void Reload() {
    if (path_.empty()) {
      TRAINCTL_LOG(WARNING) << "SIGHUP: no --tokens_file to read again; nothing changes";
      return;
    }
    auto tokens = TokenTable::Load(path_);
    const size_t count = tokens.ok() ? tokens->size() : 0;
    const absl::Status status =
        tokens.ok() ? authorizer_->ReplaceTokens(*std::move(tokens)) : tokens.status();
    if (!status.ok()) {
      reloads_error_.Increment();
      TRAINCTL_LOG(ERROR) << "SIGHUP: tokens file not reloaded, the " << tokens_.Value()
                          << " tokens in force stay: " << status.message();
      return;
    }
    reloads_ok_.Increment();
    TRAINCTL_LOG(INFO) << "SIGHUP: " << count << " bearer tokens from " << path_ << " (were "
                       << tokens_.Value() << ")";
    tokens_.Set(static_cast<double>(count));
  }

 private:
  const std::string path_;
  RpcAuthorizer* const authorizer_;
  prometheus::Family<prometheus::Counter>& reloads_;
  prometheus::Counter& reloads_ok_;
  prometheus::Counter& reloads_error_;
  prometheus::Gauge& tokens_;
};

int Run() {
  // Signals are taken by one thread with sigwait, so they are blocked before any other thread
  // starts.
  sigset_t signals;
  if (absl::Status s = InitDaemon(absl::GetFlag(FLAGS_log_level), &signals); !s.ok()) {
    TRAINCTL_LOG(ERROR) << s.message();
    return 2;
  }
  // SIGHUP reads the tokens file again; taken by the same thread as the stop signals.
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // Before any thread starts: it also removes the variables from the environment.
  const absl::Duration watchdog_interval = TakeSystemdWatchdogInterval();

  // TLS and tokens first: a mistake in them stops the start before the database is touched.
  TlsOptions tls;
  tls.cert = absl::GetFlag(FLAGS_tls_cert);
  tls.key = absl::GetFlag(FLAGS_tls_key);
  tls.ca = absl::GetFlag(FLAGS_tls_ca);
  tls.require_client_cert = absl::GetFlag(FLAGS_tls_require_client_cert);
  auto credentials = MakeServerCredentials(tls);
  if (!credentials.ok()) {
    TRAINCTL_LOG(ERROR) << credentials.status().message();
    return 2;
  }
  AuthorizerOptions auth_options;
  auth_options.client_certificates = !tls.ca.empty();
  const std::string tokens_file = absl::GetFlag(FLAGS_tokens_file);
  size_t tokens_loaded = 0;
  if (!tokens_file.empty()) {
    auto tokens = TokenTable::Load(tokens_file);
    if (!tokens.ok()) {
      TRAINCTL_LOG(ERROR) << tokens.status().message();
      return 2;
    }
    TRAINCTL_LOG(INFO) << tokens->size() << " bearer tokens from " << tokens_file;
    if (!tls.enabled()) {
      TRAINCTL_LOG(WARNING) << "--tokens_file without --tls_cert: tokens travel in clear text";
    }
    tokens_loaded = tokens->size();
    auth_options.tokens = *std::move(tokens);
  }
  auto rank_env = RankEnvPolicy::WithExtra(absl::GetFlag(FLAGS_rank_env_allow));
  if (!rank_env.ok()) {
    TRAINCTL_LOG(ERROR) << "--rank_env_allow: " << rank_env.status().message();
    return 2;
  }
  RpcAuthorizer authorizer(std::move(auth_options));

  if (absl::GetFlag(FLAGS_max_job_log_bytes) < 0) {
    TRAINCTL_LOG(ERROR) << "--max_job_log_bytes must be at least 0 (0: store no rank logs), got "
                        << absl::GetFlag(FLAGS_max_job_log_bytes);
    return 1;
  }
  const std::string db_path = absl::GetFlag(FLAGS_db);
  // One coordinator per database: a second would schedule the same jobs from its own view.
  std::unique_ptr<DbLock> db_lock;
  if (db_path != ":memory:") {
    if (absl::Status s = CreateParentDirectory(db_path); !s.ok()) {
      TRAINCTL_LOG(ERROR) << "store: " << s.message();
      return 1;
    }
    auto lock = DbLock::Acquire(db_path);
    if (!lock.ok()) {
      TRAINCTL_LOG(ERROR) << lock.status().message();
      return 1;
    }
    db_lock = std::move(*lock);
  }
  auto store = OpenStore(db_path, absl::GetFlag(FLAGS_db_sync));
  if (!store.ok()) {
    TRAINCTL_LOG(ERROR) << "store: " << store.status().message();
    return 1;
  }
  RealClock clock;
  // systemd (Type=notify): READY=1 once serving with recovery done, STATUS= lines and WATCHDOG=1
  // from the cluster loop, STOPPING=1 on a stop signal. Nothing without $NOTIFY_SOCKET.
  SystemdNotifier service_notifier;
  ServiceLoopOptions service_options;
  service_options.watchdog_interval = watchdog_interval;
  service_options.testonly_stall_file = absl::GetFlag(FLAGS_testonly_stall_file);
  ServiceLoopReporter service(&service_notifier, &clock, service_options);
  std::string bound;  // written once, before `serving` is set
  std::atomic<bool> serving{false};
  JobNotifier notifier;
  // Kept whether or not it is served: updating it costs little, and the code has one path.
  metrics::Registry registry;
  JobMetrics job_metrics(&registry);
  TokenReloader token_reloader(tokens_file, &authorizer, &registry, tokens_loaded);
  JobManager jobs(store->get(), &clock);
  jobs.AddObserver(&notifier);
  jobs.AddObserver(&job_metrics);
  jobs.SetRankEnvPolicy(*std::move(rank_env));
  ThreadPool executor(std::max(1, absl::GetFlag(FLAGS_rpc_threads)));
  JobServiceImpl job_service(&jobs, &notifier, &executor);
  job_service.SetAuthorizer(&authorizer);
  ClusterOptions cluster_options;
  cluster_options.lease_timeout = absl::GetFlag(FLAGS_lease_timeout);
  cluster_options.recovery_grace = absl::GetFlag(FLAGS_recovery_grace);
  cluster_options.metrics = &registry;
  cluster_options.ingest.max_job_log_bytes = absl::GetFlag(FLAGS_max_job_log_bytes);
  cluster_options.on_tick = [&service, &bound, &serving](const ClusterSummary& summary) {
    if (!serving.load(std::memory_order_acquire)) {
      service.Tick(false, "starting: jobs recovered, not serving yet");
      return;
    }
    service.Tick(true, absl::StrCat("serving on ", bound, ", ", summary.placed_jobs,
                                    summary.placed_jobs == 1 ? " job" : " jobs", " running, ",
                                    summary.waiting_jobs, " waiting, ", summary.nodes,
                                    summary.nodes == 1 ? " node" : " nodes"));
  };
  Cluster cluster(&jobs, &clock, cluster_options);
  NodeInventory nodes([&cluster] { return cluster.ListNodes(); },
                      [&cluster](const std::string& node, absl::Duration timeout) {
                        return cluster.RefreshTopology(node, timeout);
                      },
                      store->get(), absl::GetFlag(FLAGS_topology_refresh_timeout));
  job_service.SetNodeLister(
      [&nodes](const trainctl::v1::ListNodesRequest& request) { return nodes.List(request); });
  AddCoordinatorCollectors(
      &registry, store->get(), [&cluster] { return cluster.ListNodes(); },
      db_path == ":memory:" ? "" : db_path);
  // `trainctl diagnose` and trainctl_job_findings: the rules over the nodes' stored topology
  // and the jobs' NCCL and bandwidth events.
  JobStore* job_store = store->get();
  JobDiagnoser diagnoser(
      job_store, [job_store](const std::string& node) { return job_store->GetNodeTopology(node); });
  job_service.SetDiagnoser(&diagnoser);
  DiagnosisMetrics diagnosis_metrics(&registry, job_store, &diagnoser);
  WorkerServiceImpl worker_service(&cluster);
  worker_service.SetAuthorizer(&authorizer);
  if (absl::Status s = cluster.Start(); !s.ok()) {
    TRAINCTL_LOG(ERROR) << "loading jobs: " << s.message();
    return 1;
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string listen = absl::GetFlag(FLAGS_listen);
  int port = 0;
  // Without SO_REUSEPORT a port another process serves on is an error here, not a silent share.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(listen, *credentials, &port);
  builder.RegisterService(&job_service);
  builder.RegisterService(&worker_service);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(MakeRpcMetricsInterceptor(&registry));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    TRAINCTL_LOG(ERROR) << "cannot listen on " << listen << " (address in use or invalid)";
    return 1;
  }
  bound = BoundAddress(listen, port);
  TRAINCTL_LOG(INFO) << "trainctl-coordinator serving on " << bound << ", db " << db_path << ", "
                     << (tls.enabled() ? (tls.ca.empty() ? "TLS" : "TLS, client certificates")
                                       : "plaintext")
                     << (authorizer.tokens_on() ? ", bearer tokens" : ", no authentication");
  if (db_lock != nullptr) {
    if (absl::Status s = db_lock->SetAddress(bound); !s.ok()) TRAINCTL_LOG(WARNING) << s.message();
  }
  auto metrics_server = metrics::StartDaemonMetrics(&registry, absl::GetFlag(FLAGS_metrics_listen),
                                                    absl::GetFlag(FLAGS_metrics_ready_file));
  if (!metrics_server.ok()) {
    TRAINCTL_LOG(ERROR) << metrics_server.status().message();
    server->Shutdown();
    cluster.Stop();
    return 1;
  }
  if (absl::Status s = WriteReadyFile(absl::GetFlag(FLAGS_ready_file), bound); !s.ok()) {
    TRAINCTL_LOG(ERROR) << "--ready_file: " << s.message();
    server->Shutdown();
    cluster.Stop();
    return 1;
  }
  serving.store(true, std::memory_order_release);

  {
    StopSignalThread stopper(
        signals,
        [&server, &service](int) {
          service.Stopping("stopping: draining RPCs");
          server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
        },
        [&token_reloader] { token_reloader.Reload(); });
    server->Wait();
  }
  // Before the cluster stops: a scrape asks the cluster's loop for its nodes.
  metrics_server->reset();
  cluster.Stop();
  TRAINCTL_LOG(INFO) << "stopped";
  return 0;
}

}  // namespace
}  // namespace trainctl

int main(int argc, char** argv) {
  trainctl::ParseDaemonFlags(argc, argv, "trainctl-coordinator",
                             "trainctl-coordinator --listen HOST:PORT --db PATH");
  return trainctl::Run();
}
