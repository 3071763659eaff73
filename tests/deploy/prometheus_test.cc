// deploy/ against the real thing (issue 13): Debian's Prometheus, configured from
// deploy/prometheus/prometheus.yml and evaluating deploy/prometheus/alerts.yml, scrapes a real
// trainctl-coordinator and a real trainctl-worker (a CPU node: no nvidia-smi) while the real
// trainer runs a tiny SFT job (tests/trainer/shapes_fixture.h). One Prometheus and one cluster
// serve every check, in this order:
//  - `up` of both targets, the running job's trainctl_job_loss with its job/name/kind/nodes labels,
//    and the GPU-less node's series (slots, info, rank CPU; no GPU series);
//  - every query of deploy/grafana/dashboards/trainctl.json ($job, $node and $__rate_interval
//    filled in) and of its variables runs without error, and every trainctl_ name the dashboard or
//    the alert rules use is one the daemons' /metrics declare;
//  - TrainctlJobFailed fires for a job whose model does not exist, and TrainctlNodeLost once the
//    worker is killed with SIGKILL (the coordinator's lease is 2 s).
//
// The generated config is deploy/prometheus/prometheus.yml with exactly these textual changes:
// scrape and evaluation intervals of 1 s instead of 15 s, the coordinator's target and the
// workers' file_sd file replaced by the test's, and rule_files naming the real alerts.yml by its
// absolute path. The rules are not changed: the two alerts fired here have no `for:`, so they fire
// as written.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/job_client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/deploy/prometheus_server.h"
#include "tests/integration/daemons.h"
#include "tests/testing/subprocess.h"
#include "tests/trainer/shapes_fixture.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
namespace v1 = trainctl::v1;
using nlohmann::json;
using testing::PrometheusServer;
using testing::RunResult;
using testing::Subprocess;
using testing::WaitFor;

const std::string kDeploy = TRAINCTL_SOURCE_DIR "/deploy";
const std::string kNode = "node-a";

// `text` with `from` replaced by `to`; a test failure naming `file` when `from` is not in it (the
// deploy file changed under the test).
std::string ReplaceOnce(std::string text, const std::string& from, const std::string& to,
                        const std::string& file) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << file << " no longer contains '" << from << "'";
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// The metric names an exposition declares in its `# TYPE` lines (the registry writes them for
// every family, with or without series), a histogram's _bucket/_sum/_count with it.
std::set<std::string> DeclaredNames(const std::string& exposition) {
  std::set<std::string> names;
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::ConsumePrefix(&line, "# TYPE ")) continue;
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 2) continue;
    names.insert(parts[0]);
    if (parts[1] == "histogram") {
      for (const char* suffix : {"_bucket", "_sum", "_count"}) names.insert(parts[0] + suffix);
    }
  }
  return names;
}

// The trainctl_ metric names in a query or a rule file.
std::set<std::string> TrainctlNames(const std::string& text) {
  static const std::regex kName("trainctl_[a-zA-Z0-9_]+");
  std::set<std::string> names;
  for (std::sregex_iterator it(text.begin(), text.end(), kName), end; it != end; ++it) {
    names.insert(it->str());
  }
  return names;
}

// Every panel of a dashboard, rows' nested panels included.
void CollectPanels(const json& panels, std::vector<json>* out) {
  for (const json& p : panels) {
    out->push_back(p);
    if (p.contains("panels")) CollectPanels(p["panels"], out);
  }
}

std::string Label(const json& series, const std::string& name) {
  const json& metric = series["metric"];
  return metric.contains(name) ? metric[name].get<std::string>() : "";
}

class PrometheusTest : public testing::ShapesTrainingTest, protected testing::Daemons {
 protected:
  std::string daemon_dir() const override { return dir_.path(); }

  ~PrometheusTest() override {
    prometheus_.reset();
    StopDaemons();
  }

  // HOST:PORT from a daemon's ready file, once it is there ("" after `timeout`).
  std::string ReadyAddress(const std::string& file, absl::Duration timeout) {
    if (!WaitFor([&] { return fs::exists(file); }, timeout)) return "";
    return std::string(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(file)));
  }

  // The coordinator, its RPCs and /metrics on ports it picks, with a 2 s lease.
  void StartCoordinator() {
    coordinator_ = std::make_unique<Subprocess>(
        std::vector<std::string>{TRAINCTL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--db",
                                 dir_.path() + "/var/trainctl.db", "--ready_file",
                                 dir_.path() + "/ready", "--lease_timeout", "2s", "--db_sync",
                                 "normal", "--metrics_listen", "127.0.0.1:0",
                                 "--metrics_ready_file", dir_.path() + "/coordinator-metrics"},
        dir_.path() + "/coordinator.log");
    address_ = ReadyAddress(dir_.path() + "/ready", absl::Seconds(30));
    ASSERT_FALSE(address_.empty()) << Logs();
    coordinator_metrics_ = ReadyAddress(dir_.path() + "/coordinator-metrics", absl::Seconds(10));
    ASSERT_FALSE(coordinator_metrics_.empty()) << Logs();
    client_ = std::make_unique<cli::JobClient>(address_);
  }

  // A CPU worker with 2 slots (no nvidia-smi) and /metrics on a port it picks.
  void StartWorker() {
    workers_[kNode] =
        std::make_unique<Subprocess>(std::vector<std::string>{TRAINCTL_WORKER_BIN,
                                                              "--coordinator",
                                                              address_,
                                                              "--node_name",
                                                              kNode,
                                                              "--work_dir",
                                                              dir_.path() + "/work-" + kNode,
                                                              "--slots",
                                                              "2",
                                                              "--heartbeat_interval",
                                                              "300ms",
                                                              "--reconnect_max",
                                                              "1s",
                                                              "--kill_grace",
                                                              "2s",
                                                              "--trainer",
                                                              TRAINCTL_TRAINER_BIN,
                                                              "--nvidia_smi",
                                                              "/nonexistent/nvidia-smi",
                                                              "--output_roots",
                                                              dir_.path(),
                                                              "--metrics_listen",
                                                              "127.0.0.1:0",
                                                              "--metrics_ready_file",
                                                              dir_.path() + "/worker-metrics"},
                                     dir_.path() + "/worker-" + kNode + ".log");
    worker_metrics_ = ReadyAddress(dir_.path() + "/worker-metrics", absl::Seconds(30));
    ASSERT_FALSE(worker_metrics_.empty()) << Logs();
  }

  // deploy/prometheus/prometheus.yml, changed only as the header says, and Prometheus on it.
  void StartPrometheus() {
    const std::string source = kDeploy + "/prometheus/prometheus.yml";
    std::string config = testing::ReadFileOrEmpty(source);
    ASSERT_FALSE(config.empty()) << source;
    config = ReplaceOnce(config, "scrape_interval: 15s", "scrape_interval: 1s", source);
    config = ReplaceOnce(config, "evaluation_interval: 15s", "evaluation_interval: 1s", source);
    config = ReplaceOnce(config, "\"localhost:9401\"", "\"" + coordinator_metrics_ + "\"", source);
    config = ReplaceOnce(config, "- alerts.yml", "- " + kDeploy + "/prometheus/alerts.yml", source);
    config = ReplaceOnce(config, "- workers.yml", "- " + dir_.path() + "/workers.yml", source);
    dir_.Write("workers.yml", absl::StrCat("- targets: [\"", worker_metrics_,
                                           "\"]\n  labels:\n    role: worker\n"));
    const std::string path = dir_.Write("prometheus.yml", config);
    auto server = PrometheusServer::Start(TRAINCTL_PROMETHEUS_BIN, path, dir_.path() + "/prom",
                                          absl::Seconds(30));
    ASSERT_TRUE(server.ok()) << server.status();
    prometheus_ = std::move(*server);
  }

  std::string Submit(const std::string& spec_path) {
    RunResult r = testing::Run({TRAINCTL_CLI_BIN, "submit", spec_path, "-o", "json"},
                               {{"TRAINCTL_COORDINATOR", address_}});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    auto j = json::parse(r.out, nullptr, false);
    return j.is_object() && j.contains("id") ? j["id"].get<std::string>() : "";
  }

  // The series `expr` returns once there is at least one (a test failure, with the logs, and an
  // empty array after `timeout`).
  json WaitSeries(const std::string& expr, absl::Duration timeout) {
    json result = json::array();
    std::string error;
    const bool ok = WaitFor(
        [&] {
          auto r = prometheus_->Query(expr);
          if (!r.ok()) {
            error = r.status().ToString();
            return false;
          }
          result = *r;
          return !result.empty();
        },
        timeout);
    EXPECT_TRUE(ok) << "no series for " << expr << " " << error << "\n"
                    << prometheus_->Log() << Logs();
    return ok ? result : json::array();
  }

  // The firing alert `name` whose labels include `labels`, once Prometheus has it (a test failure
  // listing the alerts it has, and null, after `timeout`).
  json WaitFiring(const std::string& name, const std::map<std::string, std::string>& labels,
                  absl::Duration timeout) {
    json found;
    json alerts;
    const bool ok = WaitFor(
        [&] {
          alerts = prometheus_->Alerts();
          for (const json& a : alerts) {
            if (a["labels"].value("alertname", "") != name || a.value("state", "") != "firing") {
              continue;
            }
            bool match = true;
            for (const auto& [k, v] : labels) match = match && a["labels"].value(k, "") == v;
            if (match) {
              found = a;
              return true;
            }
          }
          return false;
        },
        timeout);
    EXPECT_TRUE(ok) << name << " is not firing; alerts: " << alerts.dump(1) << "\n"
                    << prometheus_->Log() << Logs();
    return found;
  }

  // Everything a daemon's /metrics declares.
  std::set<std::string> Declared(const std::string& address) {
    const auto [host, port] = std::pair<std::string, std::string>(absl::StrSplit(address, ':'));
    httplib::Client client(host, std::stoi(port));
    auto r = client.Get("/metrics");
    EXPECT_TRUE(r && r->status == 200) << address;
    return r ? DeclaredNames(r->body) : std::set<std::string>();
  }

  // Runs every query of the dashboard and its variables against Prometheus: no query may fail,
  // `$job` must offer `job_id` and `$node` this test's node. Adds the trainctl_ names used to
  // `names`.
  void RunDashboardQueries(const std::string& job_id, std::set<std::string>* names);

  // The scenario's phases, in the order the test runs them.

  // Both targets up, with the job labels of the scrape config.
  void ExpectBothTargetsUp();
  // The running job's loss, with the job's labels (the exporter's `job` kept by honor_labels).
  void ExpectJobLoss(const std::string& job_id);
  // The GPU-less node: its slots and info, its rank's CPU time, and no GPU series at all.
  void ExpectCpuNodeSeries(const std::string& job_id);
  // The dashboard while the job trains; every trainctl_ name it and the rules use is declared.
  void ExpectDashboardAndRulesUseDeclaredNames(const std::string& job_id);
  // TrainctlJobFailed, for real: a job whose model does not exist fails its only attempt.
  void ExpectJobFailedFires();
  // TrainctlNodeLost, for real: the worker killed outright misses its 2 s lease.
  void ExpectNodeLostFires();

  std::string coordinator_metrics_;  // HOST:PORT of the coordinator's /metrics
  std::string worker_metrics_;
  std::unique_ptr<PrometheusServer> prometheus_;
};

void PrometheusTest::RunDashboardQueries(const std::string& job_id, std::set<std::string>* names) {
  const std::string file = kDeploy + "/grafana/dashboards/trainctl.json";
  const json dashboard = json::parse(testing::ReadFileOrEmpty(file), nullptr, false);
  ASSERT_TRUE(dashboard.is_object()) << file << " is not JSON";

  // Variables: label_values(METRIC, LABEL), as Grafana asks /api/v1/label/LABEL/values.
  const std::map<std::string, std::string> want_values = {{"job", job_id}, {"node", kNode}};
  static const std::regex kLabelValues(R"(^label_values\((\w+),\s*(\w+)\)$)");
  for (const json& v : dashboard["templating"]["list"]) {
    if (v["type"] != "query") continue;
    const std::string query = v["query"].is_object() ? v["query"]["query"].get<std::string>()
                                                     : v["query"].get<std::string>();
    std::smatch m;
    ASSERT_TRUE(std::regex_match(query, m, kLabelValues)) << v["name"] << ": " << query;
    const std::string name = v["name"];
    // A series appears with the scrape after its first sample: wait for the one it must offer.
    absl::StatusOr<json> body;
    auto offers = [&] {
      body = prometheus_->Api(
          absl::StrCat("/api/v1/label/", m[2].str(), "/values?match%5B%5D=", m[1].str()));
      if (!body.ok() || (*body)["status"] != "success" || !want_values.count(name)) return true;
      const json& values = (*body)["data"];
      return std::find(values.begin(), values.end(), want_values.at(name)) != values.end();
    };
    const bool offered = WaitFor(offers, absl::Seconds(30));
    ASSERT_TRUE(body.ok()) << body.status();
    ASSERT_EQ((*body)["status"], "success") << query << ": " << body->dump();
    EXPECT_TRUE(offered) << "$" << name << " (" << query << ") does not offer "
                         << want_values.at(name) << ": " << (*body)["data"].dump();
    for (const std::string& n : TrainctlNames(query)) names->insert(n);
  }

  // Panels: each target as Grafana would send it, instant or over a range.
  std::vector<json> panels;
  CollectPanels(dashboard["panels"], &panels);
  int queries = 0;
  int with_data = 0;
  std::set<int> ids;
  for (const json& panel : panels) {
    EXPECT_TRUE(ids.insert(panel["id"].get<int>()).second)
        << "panel id " << panel["id"] << " twice";
    if (panel["type"] == "row") continue;
    const std::string title = panel["title"];
    ASSERT_TRUE(panel.contains("targets") && !panel["targets"].empty()) << title;
    for (const json& target : panel["targets"]) {
      const std::string raw = target["expr"];
      const std::string expr = absl::StrReplaceAll(raw, {{"$__rate_interval", "10s"},
                                                         {"${job}", job_id},
                                                         {"$job", job_id},
                                                         {"${node}", kNode},
                                                         {"$node", kNode}});
      EXPECT_FALSE(absl::StrContains(expr, "$")) << title << ": unknown variable in " << raw;
      auto result = target.value("instant", false)
                        ? prometheus_->Query(expr)
                        : prometheus_->QueryRange(expr, absl::Seconds(30), absl::Seconds(1));
      ++queries;
      EXPECT_TRUE(result.ok()) << "panel '" << title << "': " << result.status();
      if (result.ok() && !result->empty()) ++with_data;
      if (title == "Loss") {
        EXPECT_TRUE(result.ok() && !result->empty())
            << "the Loss panel shows nothing for " << job_id;
      }
      for (const std::string& n : TrainctlNames(raw)) names->insert(n);
    }
  }
  // CPU node and an SFT job: GPU and GRPO panels are empty, the rest should show something.
  std::cout << "dashboard: " << panels.size() << " panels, " << queries << " queries, " << with_data
            << " with data\n";
}

void PrometheusTest::ExpectBothTargetsUp() {
  EXPECT_TRUE(WaitFor(
      [&] {
        auto r = prometheus_->Query("up == 1");
        return r.ok() && r->size() == 2;
      },
      absl::Seconds(20)))
      << prometheus_->Log() << Logs();
  json up = WaitSeries("up", absl::Seconds(1));
  std::map<std::string, std::string> instances;  // job -> instance
  for (const json& s : up) {
    instances[Label(s, "job")] = Label(s, "instance");
    EXPECT_EQ(s["value"][1], "1") << s.dump() << "\n" << prometheus_->Log();
  }
  EXPECT_EQ(instances,
            (std::map<std::string, std::string>{{"trainctl-coordinator", coordinator_metrics_},
                                                {"trainctl-worker", worker_metrics_}}));
}

void PrometheusTest::ExpectJobLoss(const std::string& job_id) {
  json loss =
      WaitSeries(absl::StrCat("trainctl_job_loss{job=\"", job_id, "\"}"), absl::Seconds(60));
  ASSERT_EQ(loss.size(), 1u) << loss.dump();
  EXPECT_EQ(Label(loss[0], "name"), "prom-sft");
  EXPECT_EQ(Label(loss[0], "kind"), "sft");
  EXPECT_EQ(Label(loss[0], "nodes"), "1");
  EXPECT_EQ(Label(loss[0], "instance"), coordinator_metrics_);
  EXPECT_EQ(Label(loss[0], "exported_job"), "");
  const double loss_value = std::stod(loss[0]["value"][1].get<std::string>());
  EXPECT_GT(loss_value, 0) << loss.dump();
  EXPECT_LT(loss_value, 20) << loss.dump();
}

void PrometheusTest::ExpectCpuNodeSeries(const std::string& job_id) {
  json slots =
      WaitSeries(absl::StrCat("trainctl_worker_slots{node=\"", kNode, "\"}"), absl::Seconds(10));
  ASSERT_EQ(slots.size(), 1u);
  EXPECT_EQ(slots[0]["value"][1], "2");
  EXPECT_EQ(Label(slots[0], "job"), "trainctl-worker");
  EXPECT_EQ(Label(slots[0], "instance"), worker_metrics_);
  json info =
      WaitSeries(absl::StrCat("trainctl_worker_info{node=\"", kNode, "\"}"), absl::Seconds(10));
  ASSERT_EQ(info.size(), 1u);
  EXPECT_FALSE(Label(info[0], "version").empty()) << info.dump();
  json cpu = WaitSeries(absl::StrCat("trainctl_rank_cpu_seconds_total{job=\"", job_id, "\"}"),
                        absl::Seconds(20));
  ASSERT_EQ(cpu.size(), 1u) << cpu.dump();
  EXPECT_EQ(Label(cpu[0], "node"), kNode);
  EXPECT_EQ(Label(cpu[0], "rank"), "0");
  auto gpu = prometheus_->Query(
      absl::StrCat(R"({__name__=~"trainctl_gpu_.+", Hostname=")", kNode, R"("})"));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_TRUE(gpu->empty()) << gpu->dump();
}

void PrometheusTest::ExpectDashboardAndRulesUseDeclaredNames(const std::string& job_id) {
  std::set<std::string> used;
  ASSERT_NO_FATAL_FAILURE(RunDashboardQueries(job_id, &used));
  for (const std::string& n :
       TrainctlNames(testing::ReadFileOrEmpty(kDeploy + "/prometheus/alerts.yml"))) {
    used.insert(n);
  }
  // Declared by one of the daemons (GPU and GRPO families are declared without series here).
  std::set<std::string> declared = Declared(coordinator_metrics_);
  for (const std::string& n : Declared(worker_metrics_)) declared.insert(n);
  EXPECT_GT(used.size(), 40u);
  std::vector<std::string> undeclared;
  for (const std::string& n : used) {
    if (!declared.count(n)) undeclared.push_back(n);
  }
  EXPECT_TRUE(undeclared.empty()) << "used by deploy/ but exposed by neither daemon: "
                                  << absl::StrJoin(undeclared, ", ");
  auto scraped = prometheus_->Api("/api/v1/label/__name__/values");
  ASSERT_TRUE(scraped.ok()) << scraped.status();
  std::vector<std::string> no_series;
  for (const std::string& n : used) {
    const json& names = (*scraped)["data"];
    if (std::find(names.begin(), names.end(), n) == names.end()) no_series.push_back(n);
  }
  std::cout << "deploy/ uses " << used.size() << " trainctl names; without series on this "
            << "CPU cluster: " << absl::StrJoin(no_series, ", ") << "\n";
}

void PrometheusTest::ExpectJobFailedFires() {
  const std::string bad = Submit(WriteSpec("prom-bad", dir_.path() + "/out-bad", {},
                                           {{"model_name_or_path", dir_.path() + "/no-model"}}));
  ASSERT_FALSE(bad.empty());
  WaitState(bad, v1::JOB_STATE_FAILED, absl::Seconds(60));
  json failed = WaitFiring("TrainctlJobFailed", {{"kind", "sft"}, {"severity", "warning"}},
                           absl::Seconds(20));
  ASSERT_TRUE(failed.is_object());
  EXPECT_TRUE(absl::StrContains(failed["annotations"].value("summary", ""), "sft job failed"))
      << failed.dump();
  EXPECT_TRUE(
      absl::StrContains(failed["annotations"].value("description", ""), coordinator_metrics_))
      << failed.dump();
}

void PrometheusTest::ExpectNodeLostFires() {
  workers_[kNode]->Kill(SIGKILL);
  json lost = WaitFiring("TrainctlNodeLost", {{"severity", "critical"}}, absl::Seconds(30));
  ASSERT_TRUE(lost.is_object());
  EXPECT_EQ(std::stod(lost.value("value", "0")), 1) << lost.dump();
  EXPECT_TRUE(
      absl::StrContains(lost["annotations"].value("summary", ""), "1 trainctl node(s) lost"))
      << lost.dump();
  // And Prometheus sees the worker's target down.
  WaitSeries(R"(up{job="trainctl-worker"} == 0)", absl::Seconds(10));
}

TEST_F(PrometheusTest, ScrapesTheDaemonsRunsTheDashboardAndFiresAlerts) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  ASSERT_NO_FATAL_FAILURE(StartWorker());
  ASSERT_NO_FATAL_FAILURE(StartPrometheus());
  ASSERT_NO_FATAL_FAILURE(ExpectBothTargetsUp());

  // A real SFT job long enough to outlast the checks (the worker is killed under it at the end).
  const std::string id = Submit(WriteSpec("prom-sft", dir_.path() + "/out-sft",
                                          {{"max_steps", 2000}, {"save_strategy", "no"}},
                                          {{"resources", {{"nodes", 1}, {"slots_per_node", 1}}}}));
  ASSERT_FALSE(id.empty());
  ASSERT_NO_FATAL_FAILURE(ExpectJobLoss(id));
  ASSERT_NO_FATAL_FAILURE(ExpectCpuNodeSeries(id));
  ASSERT_NO_FATAL_FAILURE(ExpectDashboardAndRulesUseDeclaredNames(id));

  ASSERT_NO_FATAL_FAILURE(ExpectJobFailedFires());
  ASSERT_NO_FATAL_FAILURE(ExpectNodeLostFires());
}

}  // namespace
}  // namespace trainctl
