// trainctl-coordinator: accepts job specs over gRPC, keeps jobs, events and logs in SQLite or
// PostgreSQL (where several coordinators may stand by for the one that leads), and
// schedules jobs onto the worker daemons connected to it (WorkerService).
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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
#include "common/status_macros.h"
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
#include "coordinator/postgres_job_store.h"
#include "coordinator/rpc_authorizer.h"
#include "coordinator/rpc_metrics.h"
#include "coordinator/sqlite_job_store.h"
#include "coordinator/worker_service.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "HOST:PORT to serve gRPC on (port 0: any free port)");
ABSL_FLAG(std::string, db, "./var/trainctl.db",
          "where jobs are kept: a SQLite database file, a PostgreSQL database as a libpq URI "
          "(postgresql://USER[:PASSWORD]@HOST[:PORT]/DB[?sslmode=...]), or ':memory:' (keeps "
          "nothing)");
ABSL_FLAG(std::string, db_sync, "full",
          "SQLite only: full: fsync every commit (survives power loss); normal: survives process "
          "crashes only (PostgreSQL: every commit is synchronous_commit = on)");
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

ABSL_FLAG(bool, standby, false,
          "PostgreSQL --db only: when another coordinator leads the database, wait as its standby "
          "(not listening) and take over when it goes, instead of refusing to start");
ABSL_FLAG(absl::Duration, leader_lease, absl::Seconds(10),
          "PostgreSQL --db only: the lead's lease, renewed every third of it; a leader that stops "
          "renewing (paused, cut off) is taken over by a standby this long after its last renewal");

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

absl::StatusOr<std::unique_ptr<JobStore>> OpenStore(const std::string& db,
                                                    const std::string& sync) {
  if (db == ":memory:") return std::unique_ptr<JobStore>(new InMemoryJobStore());
  if (pg::IsPostgresUri(db)) {
    PostgresJobStore::Options options;
    options.uri = db;
    auto store = PostgresJobStore::Open(options);
    if (!store.ok()) return store.status();
    return std::unique_ptr<JobStore>(std::move(*store));
  }
  if (sync != "full" && sync != "normal") {
    return absl::InvalidArgumentError(
        absl::StrCat("--db_sync must be full or normal, got '", sync, "'"));
  }
  SqliteJobStore::Options options;
  options.path = db;
  options.synchronous_full = sync == "full";
  auto store = SqliteJobStore::Open(options);
  if (!store.ok()) return store.status();
  return std::unique_ptr<JobStore>(std::move(*store));
}

// A --db that names a scheme this coordinator does not know ("mysql://..."; "postgresq://..."),
// which would otherwise be taken for a SQLite file path.
absl::Status CheckDbScheme(const std::string& db) {
  const size_t scheme = db.find("://");
  if (scheme == std::string::npos || pg::IsPostgresUri(db)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--db: unknown scheme '", db.substr(0, scheme + 3),
                   "' (postgresql:// for PostgreSQL, a file path for SQLite, or :memory:)"));
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

// Who may call what and what ranks may be given, from the flags; read before the database is
// touched, so a mistake in them stops the start there.
struct Access {
  TlsOptions tls;
  std::shared_ptr<grpc::ServerCredentials> credentials;
  AuthorizerOptions authorizer;
  size_t tokens_loaded = 0;
  RankEnvPolicy rank_env;
};

absl::StatusOr<Access> LoadAccess() {
  Access access;
  access.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  access.tls.key = absl::GetFlag(FLAGS_tls_key);
  access.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  access.tls.require_client_cert = absl::GetFlag(FLAGS_tls_require_client_cert);
  ASSIGN_OR_RETURN(access.credentials, MakeServerCredentials(access.tls));
  access.authorizer.client_certificates = !access.tls.ca.empty();
  if (const std::string tokens_file = absl::GetFlag(FLAGS_tokens_file); !tokens_file.empty()) {
    ASSIGN_OR_RETURN(TokenTable tokens, TokenTable::Load(tokens_file));
    TRAINCTL_LOG(INFO) << tokens.size() << " bearer tokens from " << tokens_file;
    if (!access.tls.enabled()) {
      TRAINCTL_LOG(WARNING) << "--tokens_file without --tls_cert: tokens travel in clear text";
    }
    access.tokens_loaded = tokens.size();
    access.authorizer.tokens = std::move(tokens);
  }
  auto rank_env = RankEnvPolicy::WithExtra(absl::GetFlag(FLAGS_rank_env_allow));
  if (!rank_env.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank_env_allow: ", rank_env.status().message()));
  }
  access.rank_env = *std::move(rank_env);
  return access;
}

// The job store, and the lock that keeps a SQLite file to one coordinator (a second would schedule
// the same jobs from its own view; PostgresJobStore holds its own lock in the database).
struct Database {
  std::string path;
  bool sqlite_file = false;
  std::unique_ptr<DbLock> lock;  // null but for a SQLite file
  std::unique_ptr<JobStore> store;
};

absl::StatusOr<Database> OpenDatabase() {
  Database db;
  db.path = absl::GetFlag(FLAGS_db);
  RETURN_IF_ERROR(CheckDbScheme(db.path));
  db.sqlite_file = db.path != ":memory:" && !pg::IsPostgresUri(db.path);
  if (db.sqlite_file) {
    if (absl::Status s = CreateParentDirectory(db.path); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("store: ", s.message()));
    }
    ASSIGN_OR_RETURN(db.lock, DbLock::Acquire(db.path));
  }
  auto store = OpenStore(db.path, absl::GetFlag(FLAGS_db_sync));
  if (!store.ok()) {
    return absl::Status(store.status().code(), absl::StrCat("store: ", store.status().message()));
  }
  db.store = *std::move(store);
  return db;
}

constexpr char kLeaderHelp[] =
    "1 when this coordinator leads (serves the cluster), 0 for a standby waiting for the lead "
    "(PostgreSQL --db with --standby).";

// What the daemon tells systemd (Type=notify): READY=1 once serving with recovery done, STATUS=
// lines and WATCHDOG=1 from the cluster loop, STOPPING=1 on a stop signal. Nothing without
// $NOTIFY_SOCKET. `bound` is read once `serving` is set.
class ServiceStatus {
 public:
  ServiceStatus(Clock* clock, absl::Duration watchdog_interval)
      : reporter_(&notifier_, clock,
                  {watchdog_interval, absl::GetFlag(FLAGS_testonly_stall_file)}) {}

  void Tick(const ClusterSummary& summary) {
    if (!serving_.load(std::memory_order_acquire)) {
      reporter_.Tick(false, "starting: jobs recovered, not serving yet");
      return;
    }
    reporter_.Tick(true, absl::StrCat("serving on ", bound_, ", ", summary.placed_jobs,
                                      summary.placed_jobs == 1 ? " job" : " jobs", " running, ",
                                      summary.waiting_jobs, " waiting, ", summary.nodes,
                                      summary.nodes == 1 ? " node" : " nodes"));
  }
  void Serving(const std::string& bound) {
    bound_ = bound;
    serving_.store(true, std::memory_order_release);
  }
  void Stopping() { reporter_.Stopping("stopping: draining RPCs"); }

 private:
  SystemdNotifier notifier_;
  ServiceLoopReporter reporter_;
  std::string bound_;  // written once, before `serving_` is set
  std::atomic<bool> serving_{false};
};

ClusterOptions MakeClusterOptions(metrics::Registry* registry, ServiceStatus* status) {
  ClusterOptions options;
  options.lease_timeout = absl::GetFlag(FLAGS_lease_timeout);
  options.recovery_grace = absl::GetFlag(FLAGS_recovery_grace);
  options.metrics = registry;
  options.ingest.max_job_log_bytes = absl::GetFlag(FLAGS_max_job_log_bytes);
  options.on_tick = [status](const ClusterSummary& summary) { status->Tick(summary); };
  return options;
}

// The coordinator's parts, each built with what it uses; members are declared in the order they
// are built (and destroyed in reverse).
class Coordinator {
 public:
  Coordinator(Access access, Database db, absl::Duration watchdog_interval)
      : access_(std::move(access)),
        db_(std::move(db)),
        status_(&clock_, watchdog_interval),
        job_metrics_(&registry_),
        authorizer_(std::move(access_.authorizer)),
        token_reloader_(absl::GetFlag(FLAGS_tokens_file), &authorizer_, &registry_,
                        access_.tokens_loaded),
        jobs_(db_.store.get(), &clock_, std::move(access_.rank_env)),
        executor_(std::max(1, absl::GetFlag(FLAGS_rpc_threads))),
        cluster_(Observed(&jobs_, {&notifier_, &job_metrics_}), &clock_,
                 MakeClusterOptions(&registry_, &status_)),
        nodes_([this] { return cluster_.ListNodes(); },
               [this](const std::string& node, absl::Duration timeout) {
                 return cluster_.RefreshTopology(node, timeout);
               },
               db_.store.get(), absl::GetFlag(FLAGS_topology_refresh_timeout)),
        // `trainctl diagnose` and trainctl_job_findings: the rules over the nodes' stored
        // topology and the jobs' NCCL and bandwidth events.
        diagnoser_(db_.store.get(),
                   [store = db_.store.get()](const std::string& node) {
                     return store->GetNodeTopology(node);
                   }),
        diagnosis_metrics_(&registry_, db_.store.get(), &diagnoser_),
        job_service_(
            &jobs_, &notifier_, &executor_,
            {&authorizer_,
             [this](const trainctl::v1::ListNodesRequest& request) { return nodes_.List(request); },
             &diagnoser_}),
        worker_service_(&cluster_, &authorizer_) {
    // A coordinator that serves leads (a standby serves none of this: AwaitLead).
    registry_.AddGauge("trainctl_coordinator_leader", kLeaderHelp).Add({}).Set(1);
    AddCoordinatorCollectors(
        &registry_, db_.store.get(), [this] { return cluster_.ListNodes(); },
        db_.sqlite_file ? db_.path : "");
  }

  // Recovers the jobs, starts the cluster loop and serves gRPC, /metrics and the ready files.
  // On error nothing is left running.
  absl::Status Start();
  // Serves until a stop signal in `signals` (SIGHUP reloads the tokens), then drains and stops.
  void ServeUntilStopped(const sigset_t& signals);

 private:
  // `jobs` with `observers` added, for the cluster, which adds itself after them: the watchers'
  // notifier and the job metrics hear of a change before the scheduler does.
  static JobManager* Observed(JobManager* jobs, std::initializer_list<JobObserver*> observers) {
    for (JobObserver* observer : observers) jobs->AddObserver(observer);
    return jobs;
  }
  absl::Status StartGrpc();

  Access access_;
  Database db_;
  RealClock clock_;
  ServiceStatus status_;
  JobNotifier notifier_;
  // Kept whether or not it is served: updating it costs little, and the code has one path.
  metrics::Registry registry_;
  JobMetrics job_metrics_;
  RpcAuthorizer authorizer_;
  TokenReloader token_reloader_;
  JobManager jobs_;
  ThreadPool executor_;
  Cluster cluster_;
  NodeInventory nodes_;
  JobDiagnoser diagnoser_;
  DiagnosisMetrics diagnosis_metrics_;
  JobServiceImpl job_service_;
  WorkerServiceImpl worker_service_;
  std::string bound_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;
};

absl::Status Coordinator::StartGrpc() {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string listen = absl::GetFlag(FLAGS_listen);
  int port = 0;
  // Without SO_REUSEPORT a port another process serves on is an error here, not a silent share.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(listen, access_.credentials, &port);
  builder.RegisterService(&job_service_);
  builder.RegisterService(&worker_service_);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(MakeRpcMetricsInterceptor(&registry_));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, " (address in use or invalid)"));
  }
  bound_ = BoundAddress(listen, port);
  TRAINCTL_LOG(INFO) << "trainctl-coordinator serving on " << bound_ << ", db "
                     << pg::RedactUri(db_.path) << ", "
                     << (access_.tls.enabled()
                             ? (access_.tls.ca.empty() ? "TLS" : "TLS, client certificates")
                             : "plaintext")
                     << (authorizer_.tokens_on() ? ", bearer tokens" : ", no authentication");
  if (db_.lock != nullptr) {
    if (absl::Status s = db_.lock->SetAddress(bound_); !s.ok())
      TRAINCTL_LOG(WARNING) << s.message();
  }
  return absl::OkStatus();
}

absl::Status Coordinator::Start() {
  if (absl::Status s = cluster_.Start(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("loading jobs: ", s.message()));
  }
  absl::Status started = StartGrpc();
  if (started.ok()) {
    auto metrics_server = metrics::StartDaemonMetrics(
        &registry_, absl::GetFlag(FLAGS_metrics_listen), absl::GetFlag(FLAGS_metrics_ready_file));
    if (metrics_server.ok()) {
      metrics_server_ = *std::move(metrics_server);
    } else {
      started = metrics_server.status();
    }
  }
  if (started.ok()) {
    if (absl::Status s = WriteReadyFile(absl::GetFlag(FLAGS_ready_file), bound_); !s.ok()) {
      started = absl::Status(s.code(), absl::StrCat("--ready_file: ", s.message()));
    }
  }
  if (!started.ok()) {
    if (server_ != nullptr) server_->Shutdown();
    cluster_.Stop();
    return started;
  }
  status_.Serving(bound_);
  return absl::OkStatus();
}

void Coordinator::ServeUntilStopped(const sigset_t& signals) {
  {
    StopSignalThread stopper(
        signals,
        [this](int) {
          status_.Stopping();
          server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
        },
        [this] { token_reloader_.Reload(); });
    server_->Wait();
  }
  // Before the cluster stops: a scrape asks the cluster's loop for its nodes.
  metrics_server_.reset();
  cluster_.Stop();
}

// "host pid N": who holds the lead, for the other coordinators' messages.
std::string LeadHolder() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, " pid ", getpid());
}

// Until this coordinator leads `store`: a standby (--standby) waits, tries again every second,
// reports to systemd and serves /metrics with trainctl_coordinator_leader 0; without --standby a
// refusal ends the start. Returns -1 when it led at once, -2 when it led after standing by, else
// the exit code (0: stopped while standby).
int AwaitLead(PostgresJobStore* store, const sigset_t& signals, absl::Duration watchdog_interval) {
  const absl::Duration lease = absl::GetFlag(FLAGS_leader_lease);
  absl::Status lead = store->TryLead(LeadHolder(), lease);
  // A leader that just died (this coordinator's previous run, restarted at once) may hold the lock
  // until the server has noticed its closed connection: a moment's grace before refusing.
  const absl::Time grace = absl::Now() + absl::Seconds(3);
  while (!lead.ok() && !absl::GetFlag(FLAGS_standby) && absl::Now() < grace) {
    const timespec pause = {0, 200'000'000};
    if (const int signal = sigtimedwait(&signals, nullptr, &pause);
        signal == SIGINT || signal == SIGTERM) {
      return 0;
    }
    lead = store->TryLead(LeadHolder(), lease);
  }
  if (lead.ok()) return -1;
  if (!absl::GetFlag(FLAGS_standby)) {
    TRAINCTL_LOG(ERROR) << "store: " << lead.message()
                        << (lead.code() == absl::StatusCode::kFailedPrecondition
                                ? " (--standby waits for it instead)"
                                : "");
    return 1;
  }
  RealClock clock;
  SystemdNotifier notifier;
  ServiceLoopReporter service(&notifier, &clock,
                              {watchdog_interval, absl::GetFlag(FLAGS_testonly_stall_file)});
  metrics::Registry registry;
  registry.AddGauge("trainctl_coordinator_leader", kLeaderHelp).Add({}).Set(0);
  auto metrics_server = metrics::StartDaemonMetrics(&registry, absl::GetFlag(FLAGS_metrics_listen),
                                                    absl::GetFlag(FLAGS_metrics_ready_file));
  if (!metrics_server.ok()) {
    TRAINCTL_LOG(ERROR) << metrics_server.status().message();
    return 1;
  }
  std::string last;
  const timespec wait = {1, 0};
  while (!lead.ok()) {
    if (lead.message() != last) TRAINCTL_LOG(WARNING) << "standby: " << lead.message();
    last = std::string(lead.message());
    service.Tick(true, absl::StrCat("standby: ", lead.message()));
    const int signal = sigtimedwait(&signals, nullptr, &wait);
    if (signal == SIGINT || signal == SIGTERM) {
      service.Stopping("stopping: standby");
      TRAINCTL_LOG(INFO) << "stopped (standby)";
      return 0;
    }
    lead = store->TryLead(LeadHolder(), lease);
  }
  TRAINCTL_LOG(INFO) << "took the lead of the database; recovering its jobs";
  return -2;
}

// Renews the lead's lease every third of it while the coordinator serves. A lead taken over (the
// database says another coordinator leads) ends the process at once: its workers and clients then
// find the leader, and its writes would be refused anyway. A renewal that fails otherwise (the
// server unreachable) is retried; the lease may run out meanwhile, and a standby take over.
class LeaseRenewer {
 public:
  explicit LeaseRenewer(PostgresJobStore* store) : store_(store), thread_([this] { Loop(); }) {}
  ~LeaseRenewer() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

 private:
  void Loop() {
    const absl::Duration every = absl::GetFlag(FLAGS_leader_lease) / 3;
    absl::MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), every)) {
      mu_.Unlock();
      const absl::Status renewed = store_->RenewLead();
      mu_.Lock();
      if (renewed.code() == absl::StatusCode::kFailedPrecondition) {
        TRAINCTL_LOG(ERROR) << "lost the lead: " << renewed.message() << "; exiting";
        std::_Exit(3);
      }
      if (!renewed.ok()) TRAINCTL_LOG(WARNING) << "lease not renewed: " << renewed.message();
    }
  }

  PostgresJobStore* const store_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
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
  auto access = LoadAccess();
  if (!access.ok()) {
    TRAINCTL_LOG(ERROR) << access.status().message();
    return 2;
  }
  if (absl::GetFlag(FLAGS_max_job_log_bytes) < 0) {
    TRAINCTL_LOG(ERROR) << "--max_job_log_bytes must be at least 0 (0: store no rank logs), got "
                        << absl::GetFlag(FLAGS_max_job_log_bytes);
    return 1;
  }
  auto db = OpenDatabase();
  if (!db.ok()) {
    TRAINCTL_LOG(ERROR) << db.status().message();
    return 1;
  }
  if (absl::GetFlag(FLAGS_leader_lease) < absl::Seconds(1)) {
    TRAINCTL_LOG(ERROR) << "--leader_lease must be at least 1s, got "
                        << absl::GetFlag(FLAGS_leader_lease);
    return 2;
  }
  auto* postgres = dynamic_cast<PostgresJobStore*>(db->store.get());
  if (absl::GetFlag(FLAGS_standby) && postgres == nullptr) {
    TRAINCTL_LOG(ERROR) << "--standby needs a PostgreSQL --db (postgresql://...): a SQLite file "
                           "has one coordinator";
    return 2;
  }
  std::unique_ptr<LeaseRenewer> renewer;
  if (postgres != nullptr) {
    const int code = AwaitLead(postgres, signals, watchdog_interval);
    if (code >= 0) return code;
    // After standing by: the TLS files and tokens as they are now, which the operator may have
    // changed meanwhile (a standby serves nothing, so nothing else reads them); files that no
    // longer load leave those read at start in force, as a failed reload does.
    if (code == -2) {
      if (auto fresh = LoadAccess(); fresh.ok()) {
        access = *std::move(fresh);
      } else {
        TRAINCTL_LOG(ERROR) << "TLS files and tokens not read again, those read at start stay: "
                            << fresh.status().message();
      }
    }
    renewer = std::make_unique<LeaseRenewer>(postgres);
  }
  Coordinator coordinator(*std::move(access), *std::move(db), watchdog_interval);
  if (absl::Status s = coordinator.Start(); !s.ok()) {
    TRAINCTL_LOG(ERROR) << s.message();
    return 1;
  }
  coordinator.ServeUntilStopped(signals);
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
