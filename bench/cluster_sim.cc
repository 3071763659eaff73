// cluster_sim: the coordinator at cluster scale (issue 28 §3). For each --nodes count it starts the
// real trainctl-coordinator (a subprocess, fresh SQLite file, --db_sync as given, default lease)
// and that many simulated worker nodes of --slots CPU slots, each a real WorkerService.Session over
// loopback gRPC on the callback API (tests/integration/ingest_load.h SimSession: 1,000 sessions on
// gRPC's few threads, one more thread for every node's timers). A node heartbeats every
// --heartbeat_interval, takes launches, reports its ranks RUNNING at once, sends a log line per
// rank every --log_interval, and reports SUCCEEDED after --job_seconds (its ranks only "sleep").
//
// A run: every node registers; --idle_seconds with heartbeats only (the coordinator's CPU per
// heartbeat); --jobs jobs (shapes from --mix) submitted from --clients threads (submit latency);
// then until every job succeeded (or --max_seconds after the first submit): submit -> all ranks
// reported RUNNING per job, a node's idle time between one task's end and its next launch, jobs/s,
// the scheduling pass time from the coordinator's /metrics
// (trainctl_scheduler_pass_duration_seconds, polled every second with ListNodes: lost nodes and the
// oldest heartbeat), the coordinator's CPU seconds (/proc/PID/stat) and peak RSS (VmHWM); and, with
// the coordinator gone, one pure Schedule() pass over --jobs waiting jobs x the nodes
// (bench/scheduler_bench's way). One row per node count, the growth between counts, and the issue's
// targets at the largest count.
#include <stdlib.h>  // mkdtemp
#include <sys/resource.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/cluster_sim_fleet.h"
#include "cli/job_client.h"
#include "coordinator/scheduler.h"
#include "tests/testing/promtool.h"
#include "tests/testing/subprocess.h"

ABSL_FLAG(std::vector<std::string>, nodes, std::vector<std::string>({"100", "300", "1000"}),
          "simulated node counts, one run each");
ABSL_FLAG(int, slots, 8, "CPU slots per node");
ABSL_FLAG(int, jobs, 10000, "jobs submitted per run");
ABSL_FLAG(std::string, mix, "1x8",
          "job shapes NODESxSLOTS[:WEIGHT], comma-separated (e.g. 1x8:70,2x8:20,4x4:10)");
ABSL_FLAG(double, job_seconds, 2, "how long a task's ranks \"sleep\" before SUCCEEDED");
ABSL_FLAG(double, log_interval, 1, "seconds between a rank's log lines");
ABSL_FLAG(double, heartbeat_interval, 2, "seconds between a node's heartbeats (the worker's)");
ABSL_FLAG(std::string, db_sync, "full", "the coordinator's --db_sync: full | normal");
ABSL_FLAG(int, clients, 4, "submitting client threads");
ABSL_FLAG(int, idle_seconds, 10, "heartbeats only, before the submits");
ABSL_FLAG(int, max_seconds, 300, "a run stops this long after its first submit, drained or not");
ABSL_FLAG(int, seed, 1, "seed of the job mix");

namespace trainctl::bench {
namespace {

namespace fs = std::filesystem;
namespace v1 = trainctl::v1;
using cluster_sim::Fleet;
using cluster_sim::FleetOptions;
using cluster_sim::Ms;
using cluster_sim::Timeline;
using testing::Latency;
using testing::internal_load::Summarize;

// ---- the coordinator process ----------------------------------------------------------------

class CoordinatorProcess {
 public:
  explicit CoordinatorProcess(const std::string& dir) : log_(dir + "/coordinator.log") {
    const std::string ready = dir + "/ready", metrics_ready = dir + "/metrics-ready";
    process_ = std::make_unique<testing::Subprocess>(
        std::vector<std::string>{TRAINCTL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--db",
                                 dir + "/trainctl.db", "--db_sync", absl::GetFlag(FLAGS_db_sync),
                                 "--ready_file", ready, "--metrics_listen", "127.0.0.1:0",
                                 "--metrics_ready_file", metrics_ready, "--log_level", "warning"},
        log_);
    if (!testing::WaitFor([&] { return fs::exists(ready); }, absl::Seconds(30))) {
      std::cerr << "coordinator did not start:\n" << testing::ReadFileOrEmpty(log_);
      std::exit(1);
    }
    address_ = std::string(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(ready)));
    const std::string bound(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(metrics_ready)));
    metrics_port_ = std::stoi(bound.substr(bound.rfind(':') + 1));
  }

  const std::string& address() const { return address_; }
  std::string Metrics() const { return testing::HttpGet("127.0.0.1", metrics_port_, "/metrics"); }

  // User + system CPU seconds so far (/proc/PID/stat fields 14 and 15).
  double CpuSeconds() const {
    const std::string stat =
        testing::ReadFileOrEmpty(absl::StrCat("/proc/", process_->pid(), "/stat"));
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string field;
    double ticks = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i >= 14) ticks += std::stod(field);
    }
    return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  // A /proc/PID/status figure ("VmHWM", "VmRSS", "Threads") as written there (kB for sizes).
  int64_t Status(const std::string& key) const {
    std::ifstream in(absl::StrCat("/proc/", process_->pid(), "/status"));
    std::string line;
    int64_t value = 0;
    while (std::getline(in, line)) {
      if (absl::StartsWith(line, key + ":")) {
        std::istringstream(line.substr(key.size() + 1)) >> value;
      }
    }
    return value;
  }
  std::string log_path() const { return log_; }

 private:
  std::string log_;
  std::unique_ptr<testing::Subprocess> process_;
  std::string address_;
  int metrics_port_ = 0;
};

// A sample of the exposition: the line `series VALUE` (series with its labels as exposed).
double Sample(const std::string& body, const std::string& series) {
  size_t at = 0;
  while ((at = body.find(series + " ", at)) != std::string::npos) {
    if (at == 0 || body[at - 1] == '\n') {
      double v = 0;
      const size_t end = body.find('\n', at);
      if (absl::SimpleAtod(body.substr(at + series.size() + 1, end - at - series.size() - 1), &v)) {
        return v;
      }
    }
    at += series.size();
  }
  return 0;
}

// The upper bound of the bucket that holds quantile `q` of a histogram (seconds; 0: no samples).
double BucketQuantile(const std::string& body, const std::string& name, double q) {
  const double count = Sample(body, name + "_count");
  std::istringstream lines(body);
  std::string line;
  const std::string prefix = name + "_bucket{le=\"";
  while (count > 0 && std::getline(lines, line)) {
    if (!absl::StartsWith(line, prefix)) continue;
    const size_t close = line.find('"', prefix.size());
    double le = 0, n = 0;
    if (!absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &n) || n < q * count) continue;
    const std::string bound = line.substr(prefix.size(), close - prefix.size());
    return absl::SimpleAtod(bound, &le) ? le : std::numeric_limits<double>::infinity();
  }
  return 0;
}

// ---- jobs -----------------------------------------------------------------------------------

struct Shape {
  int nodes = 1, slots = 8, weight = 1;
};

std::vector<Shape> ParseMix(const std::string& mix) {
  std::vector<Shape> shapes;
  for (absl::string_view part : absl::StrSplit(mix, ',', absl::SkipEmpty())) {
    Shape s;
    std::vector<std::string> w = absl::StrSplit(part, ':');
    std::vector<std::string> ns = absl::StrSplit(w[0], 'x');
    if (ns.size() != 2 || !absl::SimpleAtoi(ns[0], &s.nodes) ||
        !absl::SimpleAtoi(ns[1], &s.slots) ||
        (w.size() > 1 && !absl::SimpleAtoi(w[1], &s.weight)) || s.nodes < 1 || s.slots < 1 ||
        s.weight < 1) {
      std::cerr << "cluster_sim: bad --mix part '" << part << "'\n";
      std::exit(2);
    }
    shapes.push_back(s);
  }
  return shapes;
}

// Job i's shape: the same sequence for every run and node count.
std::vector<Shape> JobShapes(int count, const std::vector<Shape>& mix) {
  int total = 0;
  for (const Shape& s : mix) total += s.weight;
  std::mt19937 rng(static_cast<uint32_t>(absl::GetFlag(FLAGS_seed)));
  std::vector<Shape> shapes;
  for (int i = 0; i < count; ++i) {
    int pick = static_cast<int>(rng() % static_cast<uint32_t>(total));
    size_t k = 0;
    while (pick >= mix[k].weight) pick -= mix[k++].weight;
    shapes.push_back(mix[k]);
  }
  return shapes;
}

// ---- the observer: ListNodes and /metrics every second --------------------------------------

class Observer {
 public:
  explicit Observer(const CoordinatorProcess* coordinator)
      : coordinator_(coordinator), thread_([this] { Run(); }) {}
  ~Observer() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  Latency list_nodes;
  std::set<std::string> lost;
  double max_age_s = 0;  // the oldest "last seen" of a ready node, as of the reply (an upper bound)
  double max_pass_ms = 0;   // the highest per-second mean pass time
  double depth_at_max = 0;  // the queue depth then
  double max_depth = 0;

 private:
  void Run() {
    cli::JobClient client(coordinator_->address());
    std::vector<double> ms;
    double sum = 0, count = 0;
    while (!stop_) {
      const absl::Time t0 = absl::Now();
      auto nodes = client.ListNodes();
      const absl::Time t1 = absl::Now();
      if (nodes.ok()) {
        ms.push_back(Ms(t1 - t0));
        for (const v1::Node& n : nodes->nodes()) {
          if (n.state() == "lost") lost.insert(n.name());
          if (n.state() != "ready") continue;
          const double seen =
              static_cast<double>(n.last_seen().seconds()) + n.last_seen().nanos() / 1e9;
          max_age_s = std::max(max_age_s, absl::ToDoubleSeconds(t1 - absl::UnixEpoch()) - seen);
        }
      }
      const std::string body = coordinator_->Metrics();
      const double s = Sample(body, "trainctl_scheduler_pass_duration_seconds_sum");
      const double c = Sample(body, "trainctl_scheduler_pass_duration_seconds_count");
      const double depth = Sample(body, "trainctl_scheduler_queue_depth");
      max_depth = std::max(max_depth, depth);
      if (c > count && (s - sum) / (c - count) * 1e3 > max_pass_ms) {
        max_pass_ms = (s - sum) / (c - count) * 1e3;
        depth_at_max = depth;
      }
      sum = s;
      count = c;
      while (!stop_ && absl::Now() < t0 + absl::Seconds(1)) absl::SleepFor(absl::Milliseconds(20));
    }
    list_nodes = Summarize(ms);
  }

  const CoordinatorProcess* const coordinator_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---- submits --------------------------------------------------------------------------------

struct Submits {
  Latency ms;
  double per_second = 0;
  int failed = 0;
  std::string error;
  int64_t tasks = 0;  // node ranks of the jobs accepted
};

Submits SubmitAll(const std::string& address, const std::vector<Shape>& shapes,
                  Timeline* timeline) {
  const int clients = std::max(1, absl::GetFlag(FLAGS_clients));
  std::atomic<int> next{0};
  absl::Mutex mu;
  Submits out;
  std::vector<double> ms;
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      cli::JobClient client(address);
      for (int i = next++; i < static_cast<int>(shapes.size()); i = next++) {
        v1::SubmitJobRequest request;
        *request.mutable_spec() =
            testing::internal_load::LoadJobSpec(shapes[i].slots, i, shapes[i].nodes);
        request.set_request_id(absl::StrCat("cluster-sim-", i));
        const absl::Time t0 = absl::Now();
        auto reply = client.Submit(request);
        const absl::Time t1 = absl::Now();
        absl::MutexLock lock(&mu);
        if (!reply.ok()) {
          ++out.failed;
          out.error = reply.status().ToString();
          continue;
        }
        ms.push_back(Ms(t1 - t0));
        out.tasks += shapes[i].nodes;
        timeline->Submitted(reply->job().id(), i, t0, shapes[i].nodes);
      }
    });
  }
  for (auto& t : threads) t.join();
  out.ms = Summarize(ms);
  out.per_second = static_cast<double>(ms.size()) / absl::ToDoubleSeconds(absl::Now() - start);
  return out;
}

// How many jobs, in submission order, fit the empty cluster (slots counted, gangs packed).
int FirstWave(const std::vector<Shape>& shapes, int nodes) {
  std::vector<int> free(nodes, absl::GetFlag(FLAGS_slots));
  int placed = 0;
  for (const Shape& s : shapes) {
    std::vector<int> fit;
    for (int n = 0; n < nodes && static_cast<int>(fit.size()) < s.nodes; ++n) {
      if (free[n] >= s.slots) fit.push_back(n);
    }
    if (static_cast<int>(fit.size()) < s.nodes) break;
    for (int n : fit) free[n] -= s.slots;
    ++placed;
  }
  return placed;
}

// ---- one pure scheduling pass ----------------------------------------------------------------

// Best of 3 Schedule() passes over the jobs (all waiting) on `nodes` nodes: `idle` (an empty
// cluster: a burst's first pass) or all full but one (a task just ended: the steady state).
double PurePassMs(int nodes, const std::vector<Shape>& shapes, bool idle) {
  const int slots = absl::GetFlag(FLAGS_slots);
  std::vector<SchedNode> cluster(nodes);
  for (int i = 0; i < nodes; ++i) {
    cluster[i].name = absl::StrFormat("sim-%04d", i);
    cluster[i].total_slots = slots;
    cluster[i].free_slots = idle || i == nodes / 2 ? slots : 0;
  }
  std::vector<SchedJob> jobs(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    jobs[i].id = absl::StrCat("job-", i + 1);
    jobs[i].order = static_cast<int64_t>(i + 1);
    jobs[i].nodes = shapes[i].nodes;
    jobs[i].slots_per_node = shapes[i].slots;
  }
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<SchedNode> n = cluster;
    std::vector<SchedJob> j = jobs;
    const absl::Time t0 = absl::Now();
    const SchedulePass pass = Schedule(n, std::move(j));
    best = std::min(best, Ms(absl::Now() - t0));
    (void)pass;
  }
  return best;
}

// ---- one run --------------------------------------------------------------------------------

struct Row {
  int nodes = 0;
  double register_s = 0, idle_cpu_pct = 0, heartbeat_us = 0;
  Submits submits;
  Timeline::Figures jobs;
  int64_t tasks_done = 0;
  double pass_mean_ms = 0, pass_p99_ms = 0, pass_max_ms = 0, pass_depth = 0, max_depth = 0;
  int64_t passes = 0;
  double pure_idle_ms = 0, pure_full_ms = 0;
  double cpu_s = 0, run_s = 0, hwm_mib = 0, bench_cpu_s = 0;
  int64_t threads = 0;
  int lost = 0;
  double max_age_s = 0;
  Latency list_nodes;
  std::string notes;
};

double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Heartbeats only: the coordinator's CPU per heartbeat.
void IdlePhase(const CoordinatorProcess& c, Fleet& fleet, Row* row) {
  const double cpu0 = c.CpuSeconds();
  const int64_t hb0 = fleet.heartbeats();
  const absl::Time t0 = absl::Now();
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_idle_seconds)));
  const double cpu = c.CpuSeconds() - cpu0;
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  row->idle_cpu_pct = 100 * cpu / secs;
  const int64_t beats = fleet.heartbeats() - hb0;
  row->heartbeat_us = beats > 0 ? cpu / static_cast<double>(beats) * 1e6 : 0;
}

// Until every task ended, or --max_seconds after `start`.
void Drain(Timeline& timeline, int64_t tasks, absl::Time start, Row* row) {
  const absl::Time deadline = start + absl::Seconds(absl::GetFlag(FLAGS_max_seconds));
  while (timeline.tasks_finished() < tasks && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  row->tasks_done = timeline.tasks_finished();
  if (row->tasks_done < tasks) {
    absl::StrAppend(&row->notes, "stopped at --max_seconds with ", tasks - row->tasks_done, " of ",
                    tasks, " tasks not finished; ");
  }
}

void ReadPassMetrics(const std::string& body, Row* row) {
  const std::string pass = "trainctl_scheduler_pass_duration_seconds";
  const double count = Sample(body, pass + "_count");
  row->passes = static_cast<int64_t>(count);
  row->pass_mean_ms = count > 0 ? Sample(body, pass + "_sum") / count * 1e3 : 0;
  row->pass_p99_ms = BucketQuantile(body, pass, 0.99) * 1e3;
  row->lost =
      std::max<int>(row->lost, static_cast<int>(Sample(body, "trainctl_node_lease_misses_total")));
}

Row RunOnce(int nodes, const std::vector<Shape>& shapes, const std::string& dir) {
  Row row;
  row.nodes = nodes;
  CoordinatorProcess coordinator(dir);
  Timeline timeline;
  const double self0 = SelfCpuSeconds();
  const absl::Time t0 = absl::Now();
  FleetOptions options;
  options.slots = absl::GetFlag(FLAGS_slots);
  options.heartbeat = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_interval));
  options.log_interval = absl::Seconds(absl::GetFlag(FLAGS_log_interval));
  options.job_time = absl::Seconds(absl::GetFlag(FLAGS_job_seconds));
  auto fleet = std::make_unique<Fleet>(coordinator.address(), nodes, options, &timeline);
  if (const int missing = fleet->AwaitRegistered(absl::Seconds(120)); missing > 0) {
    absl::StrAppend(&row.notes, missing, " nodes never registered; ");
  }
  row.register_s = absl::ToDoubleSeconds(absl::Now() - t0);
  IdlePhase(coordinator, *fleet, &row);

  const double cpu0 = coordinator.CpuSeconds();
  const absl::Time start = absl::Now();
  Observer observer(&coordinator);
  row.submits = SubmitAll(coordinator.address(), shapes, &timeline);
  if (row.submits.failed > 0) {
    absl::StrAppend(&row.notes, row.submits.failed, " submits failed (", row.submits.error, "); ");
  }
  Drain(timeline, row.submits.tasks, start, &row);
  row.run_s = absl::ToDoubleSeconds(absl::Now() - start);
  row.cpu_s = coordinator.CpuSeconds() - cpu0;
  row.bench_cpu_s = SelfCpuSeconds() - self0;
  observer.Stop();
  ReadPassMetrics(coordinator.Metrics(), &row);
  row.hwm_mib = static_cast<double>(coordinator.Status("VmHWM")) / 1024;
  row.threads = coordinator.Status("Threads");
  row.jobs = timeline.Compute(FirstWave(shapes, nodes));
  row.list_nodes = observer.list_nodes;
  row.max_age_s = observer.max_age_s;
  row.pass_max_ms = observer.max_pass_ms;
  row.pass_depth = observer.depth_at_max;
  row.max_depth = observer.max_depth;
  row.lost = std::max<int>(row.lost, static_cast<int>(observer.lost.size()));
  int ended = 0;
  const std::string why = fleet->Ended(&ended);
  if (ended > 0) {
    row.lost = std::max(row.lost, ended);
    absl::StrAppend(&row.notes, ended, " sessions ended by the coordinator (", why, "); ");
  }
  if (const size_t q = fleet->MaxQueued(); q > 8)
    absl::StrAppend(&row.notes, "a node had ", q, " messages queued at the end; ");
  fleet.reset();
  return row;
}

// ---- the report -----------------------------------------------------------------------------

// "a/b[/c]" with `digits` decimals.
std::string Slash(std::initializer_list<double> values, int digits) {
  std::string out;
  for (double v : values)
    absl::StrAppend(&out, out.empty() ? "" : "/", absl::StrFormat("%.*f", digits, v));
  return out;
}

void PrintRows(const std::vector<Row>& rows) {
  absl::PrintF("\n%6s %9s %9s %8s %8s %5s %15s %9s %8s\n", "nodes", "register", "idle CPU",
               "CPU/hb", "oldest", "lost", "coord CPU", "peak RSS", "threads");
  absl::PrintF("%6s %9s %9s %8s %8s %5s %15s %9s %8s\n", "", "all, s", "% core", "us", "hb, s", "",
               "s (% core)", "MiB", "");
  for (const Row& r : rows) {
    absl::PrintF("%6d %9.1f %9.1f %8.0f %8.2f %5d %15s %9.0f %8lld\n", r.nodes, r.register_s,
                 r.idle_cpu_pct, r.heartbeat_us, r.max_age_s, r.lost,
                 absl::StrFormat("%.1f (%.0f%%)", r.cpu_s, 100 * r.cpu_s / r.run_s), r.hwm_mib,
                 r.threads);
  }
  absl::PrintF("\n%6s %15s %9s %8s %8s %24s %14s %10s\n", "nodes", "submit p50/p99", "submits/s",
               "passes", "waiting", "pass mean/p99<=/worst-1s", "Schedule()", "ListNodes");
  absl::PrintF("%6s %15s %9s %8s %8s %24s %14s %10s\n", "", "ms", "", "", "most",
               "ms (coordinator)", "idle/full ms", "p99 ms");
  for (const Row& r : rows) {
    absl::PrintF("%6d %15s %9.0f %8lld %8.0f %24s %14s %10.1f\n", r.nodes,
                 Slash({r.submits.ms.p50_ms, r.submits.ms.p99_ms}, 1), r.submits.per_second,
                 r.passes, r.max_depth, Slash({r.pass_mean_ms, r.pass_p99_ms, r.pass_max_ms}, 2),
                 Slash({r.pure_idle_ms, r.pure_full_ms}, 2), r.list_nodes.p99_ms);
  }
  absl::PrintF("\n%6s %11s %7s %16s %16s %14s %7s %8s\n", "nodes", "jobs done", "jobs/s",
               "1st wave s->run", "node idle", "all s->run", "run", "sim CPU");
  absl::PrintF("%6s %11s %7s %16s %16s %14s %7s %8s\n", "", "", "", "p50/p99 ms", "p50/p99 ms",
               "p50/p99 s", "s", "s");
  for (const Row& r : rows) {
    absl::PrintF("%6d %11lld %7.1f %16s %16s %14s %7.1f %8.1f\n", r.nodes, r.jobs.jobs_done,
                 r.jobs.jobs_per_s, Slash({r.jobs.first_wave.p50_ms, r.jobs.first_wave.p99_ms}, 1),
                 Slash({r.jobs.idle.p50_ms, r.jobs.idle.p99_ms}, 1),
                 Slash({r.jobs.all.p50_ms / 1e3, r.jobs.all.p99_ms / 1e3}, 1), r.run_s,
                 r.bench_cpu_s);
  }
  for (const Row& r : rows) {
    if (!r.notes.empty()) absl::PrintF("notes at %d nodes: %s\n", r.nodes, r.notes);
  }
}

void PrintGrowth(const std::vector<Row>& rows) {
  for (size_t i = 1; i < rows.size(); ++i) {
    const Row& a = rows[i - 1];
    const Row& b = rows[i];
    auto x = [](double from, double to) { return from > 0 ? to / from : 0.0; };
    absl::PrintF(
        "growth %d -> %d nodes (%.2fx): idle CPU %.2fx, submit p99 %.2fx, pass mean %.2fx, "
        "Schedule() idle %.2fx, CPU per job %.2fx, peak RSS %.2fx\n",
        a.nodes, b.nodes, x(a.nodes, b.nodes), x(a.idle_cpu_pct, b.idle_cpu_pct),
        x(a.submits.ms.p99_ms, b.submits.ms.p99_ms), x(a.pass_mean_ms, b.pass_mean_ms),
        x(a.pure_idle_ms, b.pure_idle_ms),
        x(a.cpu_s / std::max<double>(1, a.jobs.jobs_done),
          b.cpu_s / std::max<double>(1, b.jobs.jobs_done)),
        x(a.hwm_mib, b.hwm_mib));
    // What each added node costs: its heartbeats' CPU at idle, and peak RSS (its session, its
    // node record, its share of the jobs placed at once).
    const double added = b.nodes - a.nodes;
    const double beats = added / absl::GetFlag(FLAGS_heartbeat_interval);
    absl::PrintF("  per added node: %.0f us of CPU per heartbeat, %.0f KiB of peak RSS\n",
                 (b.idle_cpu_pct - a.idle_cpu_pct) / 100 / beats * 1e6,
                 (b.hwm_mib - a.hwm_mib) * 1024 / added);
  }
}

// The targets, at the largest node count measured.
bool PrintTargets(const Row& r, int jobs) {
  const bool leases = r.lost == 0;
  const bool submit = r.submits.ms.p99_ms < 50;
  const double pure = std::max(r.pure_idle_ms, r.pure_full_ms);
  const bool pass = pure < 50 && r.pass_max_ms < 50;
  absl::PrintF(
      "\ntargets at %d nodes x %d slots, %d jobs:\n"
      "  every lease held                  %s (%d lost; oldest heartbeat seen %.2f s)\n"
      "  submit p99 < 50 ms                %s (%.1f ms)\n"
      "  scheduling pass < 50 ms          %s (%d jobs: Schedule() %.2f ms; the coordinator's "
      "passes: mean "
      "%.2f ms, p99 <= %.2f ms (bucket), worst 1-s mean %.2f ms at %.0f waiting)\n",
      r.nodes, absl::GetFlag(FLAGS_slots), jobs, leases ? "PASS" : "FAIL", r.lost, r.max_age_s,
      submit ? "PASS" : "FAIL", r.submits.ms.p99_ms, pass ? "PASS" : "FAIL", jobs, pure,
      r.pass_mean_ms, r.pass_p99_ms, r.pass_max_ms, r.pass_depth);
  return leases && submit && pass;
}

int Main() {
  std::vector<int> counts;
  for (const std::string& s : absl::GetFlag(FLAGS_nodes)) counts.push_back(std::stoi(s));
  const std::string sync = absl::GetFlag(FLAGS_db_sync);
  if (counts.empty() || (sync != "full" && sync != "normal") || absl::GetFlag(FLAGS_jobs) < 1) {
    std::cerr << "cluster_sim: --nodes N,..., --jobs > 0, --db_sync full|normal\n";
    return 2;
  }
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;  // a connection per node, both ends
  setrlimit(RLIMIT_NOFILE, &files);
  const std::vector<Shape> shapes =
      JobShapes(absl::GetFlag(FLAGS_jobs), ParseMix(absl::GetFlag(FLAGS_mix)));
  absl::PrintF(
      "cluster_sim: %d jobs (%s), %.1f s each, a log line per rank every %.1f s, heartbeats every "
      "%.1f s, --db_sync %s, %d clients, %d s idle first\n",
      shapes.size(), absl::GetFlag(FLAGS_mix), absl::GetFlag(FLAGS_job_seconds),
      absl::GetFlag(FLAGS_log_interval), absl::GetFlag(FLAGS_heartbeat_interval), sync,
      absl::GetFlag(FLAGS_clients), absl::GetFlag(FLAGS_idle_seconds));
  std::vector<Row> rows;
  for (int n : counts) {
    char tmpl[] = "/tmp/cluster_sim.XXXXXX";
    const std::string dir = mkdtemp(tmpl);
    Row row = RunOnce(n, shapes, dir);
    row.pure_idle_ms = PurePassMs(n, shapes, true);
    row.pure_full_ms = PurePassMs(n, shapes, false);
    absl::PrintF("%d nodes: done in %.0f s\n", n, row.run_s);
    rows.push_back(row);
    fs::remove_all(dir);
  }
  PrintRows(rows);
  PrintGrowth(rows);
  return PrintTargets(rows.back(), static_cast<int>(shapes.size())) ? 0 : 1;
}

}  // namespace
}  // namespace trainctl::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return trainctl::bench::Main();
}
