// submit_bench: how close SubmitJob comes to its floors, measured in one run on loopback.
//
// Starts the coordinator's gRPC stack in-process (health service on, JobServiceImpl over
// JobManager over the --store: SqliteJobStore on a fresh file, or PostgresJobStore on a fresh
// database of a PostgreSQL test server started for the run; ThreadPool executor) and measures:
//   floor A  an empty RPC: grpc.health.v1.Health/Check on the same server;
//   floor B  one INSERT of a Job-sized blob in its own transaction, same engine and durability as
//            the store, own connection (bench/submit_bench_stores.h);
//   SubmitJob with the seed's SFT spec, from 1 client and from --clients concurrent clients;
//   floor B from --clients threads, each on its own connection (what group commit is up against).
// See bench/README.md for how to read the figures.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <stdlib.h>  // mkdtemp

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "bench/submit_bench_stores.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_notifier.h"
#include "coordinator/job_service.h"
#include "trainctl/v1/job.grpc.pb.h"

ABSL_FLAG(int, requests, 2000,
          "measured calls per phase; a phase with several clients splits them between its clients");
ABSL_FLAG(int, warmup, 50, "unmeasured calls each client makes before a phase starts");
ABSL_FLAG(std::string, store, "sqlite",
          "the job store: sqlite (a fresh file) | postgres (a fresh database on a PostgreSQL test "
          "server started for the run, fsync=off)");
ABSL_FLAG(std::string, sync, "full",
          "SQLite synchronous mode of the store and of the insert floor: full | normal (sqlite "
          "only)");
ABSL_FLAG(int, clients, 32, "concurrent clients in the contended phases");
ABSL_FLAG(
    int, rounds, 5,
    "the contended phases take turns this many times (disk speed drifts; see bench/README.md)");
ABSL_FLAG(int, turn, 50,
          "one-client measurements take turns of this many calls (disk speed drifts; see "
          "bench/README.md)");
ABSL_FLAG(int, rpc_threads, 16, "executor threads of the server (trainctl-coordinator's default)");

namespace trainctl::bench {
namespace {

using Clock = std::chrono::steady_clock;
using trainctl::v1::JobService;
using trainctl::v1::JobSpec;
using trainctl::v1::SubmitJobRequest;
using trainctl::v1::SubmitJobResponse;

struct Stats {
  int64_t count = 0;
  double p50_us = 0;
  double p99_us = 0;
  double ops_per_s = 0;
  // One-client rows: the lowest and highest p50 of a single turn, to show drift within the run.
  double turn_p50_min_us = 0;
  double turn_p50_max_us = 0;
};

// ---------------------------------------------------------------------------------------------
// Load generation. fsync latency on shared or virtual disks drifts over seconds, so measurements
// that are compared with each other run interleaved rather than one after the other.

// The calls of one measurement, accumulated over rounds.
struct Sample {
  std::vector<double> latencies_us;
  double seconds = 0;  // time spent making them
};

double Percentile(const std::vector<double>& sorted, double p) {
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::max<size_t>(rank, 1) - 1];
}

Stats Summarize(Sample sample) {
  std::sort(sample.latencies_us.begin(), sample.latencies_us.end());
  Stats stats;
  stats.count = static_cast<int64_t>(sample.latencies_us.size());
  stats.p50_us = Percentile(sample.latencies_us, 0.50);
  stats.p99_us = Percentile(sample.latencies_us, 0.99);
  stats.ops_per_s = static_cast<double>(stats.count) / sample.seconds;
  return stats;
}

std::vector<Stats> SummarizeAll(std::vector<Sample> samples) {
  std::vector<Stats> stats;
  for (Sample& sample : samples) stats.push_back(Summarize(std::move(sample)));
  return stats;
}

// Makes one call, adding it to `sample` unless that is null (warm-up).
absl::Status TimedCall(const Op& op, Sample* sample) {
  const auto start = Clock::now();
  RETURN_IF_ERROR(op());
  const std::chrono::duration<double, std::micro> took = Clock::now() - start;
  if (sample != nullptr) {
    sample->latencies_us.push_back(took.count());
    sample->seconds += took.count() / 1e6;
  }
  return absl::OkStatus();
}

// Sets the range of the p50s of each `turn` consecutive calls in `in_order`.
void SetTurnRange(std::vector<double> in_order, int turn, Stats* stats) {
  stats->turn_p50_min_us = INFINITY;
  stats->turn_p50_max_us = 0;
  for (size_t begin = 0; begin < in_order.size(); begin += turn) {
    const auto first = in_order.begin() + begin;
    const auto last = in_order.begin() + std::min(in_order.size(), begin + turn);
    std::sort(first, last);
    const double p50 = *(first + (last - first - 1) / 2);
    stats->turn_p50_min_us = std::min(stats->turn_p50_min_us, p50);
    stats->turn_p50_max_us = std::max(stats->turn_p50_max_us, p50);
  }
}

// One client taking `ops` in turns of `turn` calls each, until each has made `count` measured
// calls: every op meets the same disk, yet runs warm (no other kind of call in between).
absl::StatusOr<std::vector<Stats>> MeasureInterleaved(const std::vector<Op>& ops, int warmup,
                                                      int count, int turn) {
  std::vector<Sample> samples(ops.size());
  for (const Op& op : ops) {
    for (int i = 0; i < warmup; ++i) RETURN_IF_ERROR(TimedCall(op, nullptr));
  }
  for (int done = 0; done < count; done += turn) {
    const int calls = std::min(turn, count - done);
    for (size_t k = 0; k < ops.size(); ++k) {
      for (int i = 0; i < calls; ++i) RETURN_IF_ERROR(TimedCall(ops[k], &samples[k]));
    }
  }
  std::vector<Stats> stats;
  for (const Sample& sample : samples) {
    stats.push_back(Summarize(sample));
    SetTurnRange(sample.latencies_us, turn, &stats.back());
  }
  return stats;
}

struct ClientRun {
  absl::Status status;
  Sample sample;
};

// Each client warms up, waits until every client has, then makes its measured calls.
void RunClient(const Op& op, int warmup, int count, absl::BlockingCounter* ready,
               absl::Notification* go, ClientRun* out) {
  for (int i = 0; i < warmup && out->status.ok(); ++i) out->status = TimedCall(op, nullptr);
  ready->DecrementCount();
  go->WaitForNotification();
  for (int i = 0; i < count && out->status.ok(); ++i) out->status = TimedCall(op, &out->sample);
}

// One thread per client, `total` calls split between them. The sample's time is the wall time
// from the common start to the last client's end, so count / seconds is the throughput.
absl::Status RunConcurrently(const std::vector<Op>& clients, int warmup, int total,
                             Sample* sample) {
  const int n = static_cast<int>(clients.size());
  const int per_client = std::max(1, (total + n - 1) / n);
  std::vector<ClientRun> runs(n);
  absl::BlockingCounter ready(n);
  absl::Notification go;
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back(RunClient, std::cref(clients[i]), warmup, per_client, &ready, &go,
                         &runs[i]);
  }
  ready.Wait();
  const auto start = Clock::now();
  go.Notify();
  for (std::thread& t : threads) t.join();
  const std::chrono::duration<double> seconds = Clock::now() - start;
  for (ClientRun& run : runs) {
    RETURN_IF_ERROR(run.status);
    sample->latencies_us.insert(sample->latencies_us.end(), run.sample.latencies_us.begin(),
                                run.sample.latencies_us.end());
  }
  sample->seconds += seconds.count();
  return absl::OkStatus();
}

// Several loads (each a set of concurrent clients), taking turns for `rounds` rounds.
absl::StatusOr<std::vector<Stats>> MeasureAlternating(const std::vector<std::vector<Op>>& loads,
                                                      int warmup, int count, int rounds) {
  std::vector<Sample> samples(loads.size());
  for (int round = 0; round < rounds; ++round) {
    const int calls = count / rounds + (round < count % rounds ? 1 : 0);
    for (size_t k = 0; k < loads.size(); ++k) {
      RETURN_IF_ERROR(RunConcurrently(loads[k], round == 0 ? warmup : 0, calls, &samples[k]));
    }
  }
  return SummarizeAll(std::move(samples));
}

// ---------------------------------------------------------------------------------------------
// The server under test, wired as coordinator_main.cc wires it. Members in dependency order.

class BenchServer {
 public:
  static absl::StatusOr<std::unique_ptr<BenchServer>> Start(std::unique_ptr<JobStore> store,
                                                            int rpc_threads) {
    auto server = std::unique_ptr<BenchServer>(new BenchServer(std::move(store), rpc_threads));
    RETURN_IF_ERROR(server->Listen());
    return server;
  }
  ~BenchServer() { server_->Shutdown(); }

  const std::string& address() const { return address_; }

 private:
  BenchServer(std::unique_ptr<JobStore> store, int rpc_threads)
      : store_(std::move(store)),
        jobs_(store_.get(), &clock_),
        executor_(rpc_threads),
        service_(&jobs_, &notifier_, &executor_) {
    jobs_.AddObserver(&notifier_);
  }

  absl::Status Listen() {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port == 0) {
      return absl::UnavailableError("cannot listen on 127.0.0.1");
    }
    address_ = absl::StrCat("127.0.0.1:", port);
    return absl::OkStatus();
  }

  std::unique_ptr<JobStore> store_;
  RealClock clock_;
  JobNotifier notifier_;
  JobManager jobs_;
  ThreadPool executor_;
  JobServiceImpl service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

// ---------------------------------------------------------------------------------------------
// Clients.

// A channel of its own: a local subchannel pool keeps gRPC from sharing one TCP connection
// between the clients' channels.
absl::StatusOr<std::shared_ptr<grpc::Channel>> Connect(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5))) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", address));
  }
  return channel;
}

absl::Status FromGrpc(const grpc::Status& status, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

// grpc.health.v1.Health/Check with an empty request (the whole server's health), through the same
// blocking, pre-registered call path that the generated JobService stub uses.
class HealthClient {
 public:
  explicit HealthClient(std::shared_ptr<grpc::Channel> channel)
      : channel_(std::move(channel)),
        check_("/grpc.health.v1.Health/Check", grpc::internal::RpcMethod::NORMAL_RPC, channel_) {}

  absl::Status Check() {
    grpc::Slice empty;
    const grpc::ByteBuffer request(&empty, 1);
    grpc::ByteBuffer response;
    grpc::ClientContext context;
    return FromGrpc(
        grpc::internal::BlockingUnaryCall(channel_.get(), check_, &context, request, &response),
        "Health/Check");
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  grpc::internal::RpcMethod check_;
};

class SubmitClient {
 public:
  SubmitClient(std::shared_ptr<grpc::Channel> channel, const JobSpec& spec, std::string id_prefix)
      : stub_(JobService::NewStub(std::move(channel))), id_prefix_(std::move(id_prefix)) {
    *request_.mutable_spec() = spec;
  }

  // Submits the spec under a request_id never used before, so every call creates a job.
  absl::StatusOr<SubmitJobResponse> Submit() {
    request_.set_request_id(absl::StrCat(id_prefix_, next_id_++));
    grpc::ClientContext context;
    SubmitJobResponse response;
    RETURN_IF_ERROR(FromGrpc(stub_->SubmitJob(&context, request_, &response), "SubmitJob"));
    if (!response.created()) return absl::InternalError("SubmitJob: request_id was reused");
    return response;
  }

 private:
  std::unique_ptr<JobService::Stub> stub_;
  std::string id_prefix_;
  SubmitJobRequest request_;
  int64_t next_id_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The phases.

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The seed's SFT job, its DeepSpeed config embedded as the CLI embeds it.
absl::StatusOr<JobSpec> SeedSftSpec() {
  const std::string ds_path = "configs/ds_zero3_bf16.json";
  ASSIGN_OR_RETURN(std::string ds_json, ReadFile(absl::StrCat(TRAINCTL_SOURCE_DIR, "/", ds_path)));
  JobSpec spec;
  spec.set_kind(trainctl::v1::JOB_KIND_SFT);
  spec.set_model_name_or_path("Qwen/Qwen2-VL-7B-Instruct");
  spec.set_data_path("./data");
  spec.set_output_dir("./out");
  spec.set_deepspeed(ds_path);
  spec.set_deepspeed_config_json(ds_json);
  auto* training = spec.mutable_training();
  training->set_per_device_train_batch_size(4);
  training->set_gradient_accumulation_steps(4);
  training->set_learning_rate(2e-5);
  training->set_bf16(true);
  spec.mutable_resources()->set_nodes(1);
  spec.mutable_resources()->set_slots_per_node(8);
  return spec;
}

absl::StatusOr<std::vector<Op>> HealthClients(const std::string& address, int n) {
  std::vector<Op> ops;
  for (int i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, Connect(address));
    auto client = std::make_shared<HealthClient>(std::move(channel));
    ops.push_back([client] { return client->Check(); });
  }
  return ops;
}

absl::StatusOr<std::vector<Op>> SubmitClients(const std::string& address, const JobSpec& spec,
                                              absl::string_view phase, int n) {
  std::vector<Op> ops;
  for (int i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, Connect(address));
    auto client = std::make_shared<SubmitClient>(std::move(channel), spec,
                                                 absl::StrCat("bench-", phase, "-", i, "-"));
    ops.push_back([client] { return client->Submit().status(); });
  }
  return ops;
}

absl::StatusOr<std::vector<Op>> InserterClients(const BenchStores& stores, size_t blob_size,
                                                int n) {
  std::vector<Op> ops;
  for (int i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(Op op, stores.NewInserter(blob_size));
    ops.push_back(std::move(op));
  }
  return ops;
}

// The size of the row SubmitJob writes: the stored Job, as one probe submit returns it.
absl::StatusOr<size_t> StoredJobSize(const std::string& address, const JobSpec& spec) {
  ASSIGN_OR_RETURN(auto channel, Connect(address));
  SubmitClient probe(std::move(channel), spec, "bench-probe-");
  ASSIGN_OR_RETURN(SubmitJobResponse response, probe.Submit());
  trainctl::v1::Job job = response.job();
  job.clear_id();  // the row's key, not part of the blob
  return job.ByteSizeLong();
}

// ---------------------------------------------------------------------------------------------
// Report.

struct Results {
  Stats rpc_1, insert_1, submit_1;  // one client, interleaved
  Stats submit_n, insert_n;         // --clients at once, alternating
};

struct Row {
  std::string name;
  int clients;
  Stats stats;
};

void PrintTable(const std::vector<Row>& rows) {
  absl::PrintF("%-46s %7s %7s %10s %10s %10s\n", "measurement", "clients", "calls", "p50 us",
               "p99 us", "ops/s");
  for (const Row& row : rows) {
    absl::PrintF("%-46s %7d %7d %10.1f %10.1f %10.0f\n", row.name, row.clients, row.stats.count,
                 row.stats.p50_us, row.stats.p99_us, row.stats.ops_per_s);
  }
}

// A floor slower than the call it is a floor of, or turns whose p50s are an order of magnitude
// apart, mean the disk changed speed under the run (virtual disks do: ~0.2 ms <-> ~4 ms fsyncs).
bool DiskDrifted(const Results& r) {
  constexpr double kMaxSpread = 10;
  auto spread = [](const Stats& s) { return s.turn_p50_max_us / s.turn_p50_min_us; };
  return r.insert_1.p50_us > r.submit_1.p50_us || spread(r.insert_1) > kMaxSpread ||
         spread(r.submit_1) > kMaxSpread;
}

// ---------------------------------------------------------------------------------------------

struct Config {
  StoreKind store = StoreKind::kSqlite;
  int requests = 0;
  int warmup = 0;
  bool synchronous_full = true;
  int clients = 0;
  int rounds = 0;
  int turn = 0;
  int rpc_threads = 0;
};

void PrintReport(const Results& r, const Config& c) {
  const bool sqlite = c.store == StoreKind::kSqlite;
  const std::string floor =
      sqlite ? "floor B: SQLite insert+commit" : "floor B: Postgres insert+commit";
  PrintTable({
      {"floor A: Health/Check RPC", 1, r.rpc_1},
      {floor, 1, r.insert_1},
      {"SubmitJob", 1, r.submit_1},
      {"SubmitJob", c.clients, r.submit_n},
      {floor + ", own conn each", c.clients, r.insert_n},
  });
  const double ratio = r.submit_1.p50_us / (r.rpc_1.p50_us + r.insert_1.p50_us);
  absl::PrintF("\nsubmit_p50 / (rpc_p50 + insert_p50), 1 client:  %.2f  (target <= 1.50: %s)\n",
               ratio, ratio <= 1.5 ? "met" : "MISSED");
  absl::PrintF("submit_throughput_%d / %s_insert_throughput_%d:  %.2f\n", c.clients,
               sqlite ? "sqlite" : "postgres", c.clients,
               r.submit_n.ops_per_s / r.insert_n.ops_per_s);
  absl::PrintF("\nfloor B p50 per turn: %.0f..%.0f us; SubmitJob p50 per turn: %.0f..%.0f us\n",
               r.insert_1.turn_p50_min_us, r.insert_1.turn_p50_max_us, r.submit_1.turn_p50_min_us,
               r.submit_1.turn_p50_max_us);
  if (sqlite && c.synchronous_full && DiskDrifted(r)) {
    absl::PrintF(
        "warning: the disk changed speed during the run; the ratios are unreliable, run "
        "again\n");
  }
}

absl::StatusOr<Config> ReadFlags() {
  const std::string store = absl::GetFlag(FLAGS_store);
  const std::string sync = absl::GetFlag(FLAGS_sync);
  if (store != "sqlite" && store != "postgres") {
    return absl::InvalidArgumentError(
        absl::StrCat("--store must be sqlite or postgres, got '", store, "'"));
  }
  if (sync != "full" && sync != "normal") {
    return absl::InvalidArgumentError(
        absl::StrCat("--sync must be full or normal, got '", sync, "'"));
  }
  if (store == "postgres" && sync != "full") {
    return absl::InvalidArgumentError(
        "--sync is SQLite's: with --store postgres every commit is synchronous_commit = on");
  }
  Config config;
  config.store = store == "sqlite" ? StoreKind::kSqlite : StoreKind::kPostgres;
  config.requests = absl::GetFlag(FLAGS_requests);
  config.warmup = absl::GetFlag(FLAGS_warmup);
  config.synchronous_full = sync == "full";
  config.clients = absl::GetFlag(FLAGS_clients);
  config.rounds = absl::GetFlag(FLAGS_rounds);
  config.turn = absl::GetFlag(FLAGS_turn);
  config.rpc_threads = absl::GetFlag(FLAGS_rpc_threads);
  if (config.requests < 1 || config.warmup < 0 || config.clients < 1 || config.rounds < 1 ||
      config.turn < 1 || config.rpc_threads < 1) {
    return absl::InvalidArgumentError(
        "--requests, --clients, --rounds, --turn and --rpc_threads must be >= 1, --warmup >= 0");
  }
  return config;
}

absl::StatusOr<std::filesystem::path> MakeTempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "submit_bench.XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::UnavailableError(absl::StrCat("mkdtemp ", pattern, ": ", strerror(errno)));
  }
  return std::filesystem::path(pattern);
}

absl::Status MeasureOneClient(const Config& c, const std::string& address, const JobSpec& spec,
                              const BenchStores& stores, size_t job_size, Results* r) {
  ASSIGN_OR_RETURN(std::vector<Op> health, HealthClients(address, 1));
  ASSIGN_OR_RETURN(std::vector<Op> insert, InserterClients(stores, job_size, 1));
  ASSIGN_OR_RETURN(std::vector<Op> submit, SubmitClients(address, spec, "1", 1));
  ASSIGN_OR_RETURN(std::vector<Stats> stats, MeasureInterleaved({health[0], insert[0], submit[0]},
                                                                c.warmup, c.requests, c.turn));
  r->rpc_1 = stats[0];
  r->insert_1 = stats[1];
  r->submit_1 = stats[2];
  return absl::OkStatus();
}

absl::Status MeasureContended(const Config& c, const std::string& address, const JobSpec& spec,
                              const BenchStores& stores, size_t job_size, Results* r) {
  ASSIGN_OR_RETURN(std::vector<Op> submit, SubmitClients(address, spec, "n", c.clients));
  ASSIGN_OR_RETURN(std::vector<Op> insert, InserterClients(stores, job_size, c.clients));
  ASSIGN_OR_RETURN(std::vector<Stats> stats,
                   MeasureAlternating({submit, insert}, c.warmup, c.requests, c.rounds));
  r->submit_n = stats[0];
  r->insert_n = stats[1];
  return absl::OkStatus();
}

absl::StatusOr<Results> Measure(const Config& c, const std::filesystem::path& dir) {
  ASSIGN_OR_RETURN(const JobSpec spec, SeedSftSpec());
  // The stores outlive the server (a PostgreSQL server outlives the store's connections).
  ASSIGN_OR_RETURN(std::unique_ptr<BenchStores> stores,
                   BenchStores::Open(c.store, dir, c.synchronous_full));
  ASSIGN_OR_RETURN(std::unique_ptr<BenchServer> server,
                   BenchServer::Start(stores->TakeStore(), c.rpc_threads));
  const std::string& address = server->address();
  ASSIGN_OR_RETURN(const size_t job_size, StoredJobSize(address, spec));
  absl::PrintF("server %s, %s, stored Job %d bytes\n\n", address, stores->Where(), job_size);
  Results r;
  RETURN_IF_ERROR(MeasureOneClient(c, address, spec, *stores, job_size, &r));
  RETURN_IF_ERROR(MeasureContended(c, address, spec, *stores, job_size, &r));
  return r;
}

void PrintHeader(const Config& c) {
  const std::string store =
      c.store == StoreKind::kSqlite
          ? absl::StrCat("store=sqlite sync=", c.synchronous_full ? "full" : "normal")
          : "store=postgres (test server with fsync=off: a commit waits for no disk; compare "
            "with --store sqlite --sync normal) synchronous_commit=on";
  absl::PrintF(
      "submit_bench: %s requests=%d warmup=%d turn=%d clients=%d rounds=%d rpc_threads=%d\n", store,
      c.requests, c.warmup, c.turn, c.clients, c.rounds, c.rpc_threads);
}

int Run() {
  absl::StatusOr<Config> config = ReadFlags();
  if (!config.ok()) {
    absl::FPrintF(stderr, "submit_bench: %s\n", config.status().ToString());
    return 2;
  }
  absl::StatusOr<std::filesystem::path> dir = MakeTempDir();
  if (!dir.ok()) {
    absl::FPrintF(stderr, "submit_bench: %s\n", dir.status().ToString());
    return 1;
  }
  PrintHeader(*config);
  absl::StatusOr<Results> results = Measure(*config, *dir);
  std::error_code ignored;
  std::filesystem::remove_all(*dir, ignored);
  if (!results.ok()) {
    absl::FPrintF(stderr, "submit_bench: %s\n", results.status().ToString());
    return 1;
  }
  PrintReport(*results, *config);
  return 0;
}

}  // namespace
}  // namespace trainctl::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "submit_bench [--store sqlite|postgres] [--requests N] [--warmup N] [--sync full|normal] "
      "[--clients N] [--turn N] "
      "[--rounds N] [--rpc_threads N]");
  absl::ParseCommandLine(argc, argv);
  return trainctl::bench::Run();
}
