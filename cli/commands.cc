#include "cli/commands.h"

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/chart.h"
#include "cli/diagnose_command.h"
#include "cli/event_line.h"
#include "cli/job_client.h"
#include "cli/metrics_view.h"
#include "cli/node_topology_command.h"
#include "cli/pipeline_view.h"
#include "cli/progress_line.h"
#include "cli/spec_commands.h"
#include "cli/table.h"
#include "cli/terminal_text.h"
#include "cli/tokenize_command.h"
#include "cli/watch_view.h"
#include "common/data/data_cli.h"
#include "common/job_spec.h"
#include "common/json_proto.h"
#include "common/memory_plan.h"
#include "common/remedies_spec.h"
#include "common/verb_args.h"
#include "google/protobuf/util/time_util.h"

namespace trainctl::cli {
namespace {

using trainctl::v1::Job;
using trainctl::v1::JobEvent;
using trainctl::v1::JobSpec;
using trainctl::v1::LogLine;

constexpr char kDefaultCoordinator[] = "127.0.0.1:50051";

constexpr char kUsage[] = R"(trainctl — train Qwen2-VL models with distill / SFT / GRPO / eval jobs

Usage: trainctl [--coordinator HOST:PORT] [-o FORMAT] VERB [options]
       trainctl --version             the version and the git revision it was built from

  submit FILE [seed flags]       submit a job spec (YAML or JSON); flags override the file; the
         [--force]               coordinator refuses a job whose memory plan does not fit the
                                 GPUs of its nodes, naming remedies, unless --force
  submit --kind sft <seed flags> submit from the seed's launch flags (--model_name_or_path ...
                                 --deepspeed ds.json --per_device_train_batch_size 4 --bf16 True ...)
  validate ...                   same arguments as submit, offline: prints the resolved DeepSpeed
                                 config as JSON and the memory plan per GPU (on stderr; with -o
                                 json both as one object) (exit 0), or every error (exit 1)
  ls [--state S[,S]] [--limit N] list jobs, newest first
  describe ID                    one job in full: its loss (and reward) curve, its events
  cancel ID [--reason TEXT]      cancel a job
  watch ID                       follow a job until it ends (exit 0 if it succeeded): on a
                                 terminal one live line (step, loss, tokens/s, ETA), else events
  metrics ID [--name loss,...]   a job's metric history, downsampled to --max_points per metric
         [-o table|csv|json]     (default 1000)
  logs ID [-f] [--tail N]        print a job's rank logs; -f follows until the job ends
  nodes                          list worker nodes: state, slots, labels, tasks
  nodes NODE --topology [--refresh]
                                 a node's GPUs, link matrix, RDMA ports, GPUDirect RDMA and
                                 NCCL environment, as last probed (--refresh: probe it now)
  diagnose ID                    a job's interconnect: node topology, NCCL transports, the
                                 bandwidth probe, findings with their remedies
  diagnose --probe [--nodes N] [--slots_per_node S] [--node_selector k=v] [--sizes B,B]
                                 run a bandwidth probe job over N nodes, then diagnose it
  tokenize --tokenizer DIR       offline: each UTF-8 line on stdin -> a JSON array of token ids
           [--decode]            (DIR holds tokenizer.json); --decode turns JSON arrays back to text

  prepare --input F.jsonl --out DIR --tokenizer DIR
                                 offline: JSONL (open-r1 / VLM-R1 / messages) -> training shards
  datagen shapes --out DIR --n N the synthetic shapes dataset (PNG + open-r1 JSONL)

Options for every verb that talks to the coordinator, before or after the verb:
  --coordinator HOST:PORT[,...]  default $TRAINCTL_COORDINATOR, else 127.0.0.1:50051
  --tls_ca/--tls_cert/--tls_key  PEM files for TLS (default $TRAINCTL_TLS_CA/_CERT/_KEY);
                                 the token: $TRAINCTL_TOKEN or ~/.config/trainctl/token; both
                                 may come from ~/.config/trainctl/config (see docs/security.md)
  -o, --output table|json        read verbs print JSON with -o json (metrics: also csv)
)";

struct Context {
  ParsedArgs args;
  std::string coordinator;
  bool json = false;
  std::ostream& out;
  std::ostream& err;
  std::string format;  // table | json | csv
  Terminal terminal;
  Connection connection = {};  // resolved for the verbs that talk to the coordinator
};

std::string FormatTime(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  const absl::Time time =
      absl::FromUnixMicros(google::protobuf::util::TimeUtil::TimestampToMicroseconds(t));
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", time, absl::UTCTimeZone());
}

std::string Age(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0) return "-";
  const int64_t s = std::max<int64_t>(0, absl::ToUnixSeconds(absl::Now()) - t.seconds());
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 7200) return absl::StrCat(s / 60, "m");
  if (s < 172800) return absl::StrCat(s / 3600, "h");
  return absl::StrCat(s / 86400, "d");
}

int Validate(Context& c) { return ValidateSpec(c.args, c.json, c.out, c.err); }

int Submit(Context& c) { return SubmitSpec(c.args, c.json, c.connection, c.out, c.err); }

absl::StatusOr<std::vector<trainctl::v1::JobState>> ParseStates(const std::string& text) {
  std::vector<trainctl::v1::JobState> states;
  for (absl::string_view name : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    bool found = false;
    for (int s = trainctl::v1::JobState_MIN + 1; s <= trainctl::v1::JobState_MAX; ++s) {
      if (absl::EqualsIgnoreCase(StateName(static_cast<trainctl::v1::JobState>(s)), name)) {
        states.push_back(static_cast<trainctl::v1::JobState>(s));
        found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat("--state: unknown state '", name,
                       "' (pending|scheduled|running|succeeded|failed|cancelled|restarting)"));
    }
  }
  return states;
}

// "▕████▌     ▏ 45%" of the job's (or its current stage's) steps; "-" before the total is known.
std::string ProgressColumn(const Job& job) {
  const auto& p = job.progress();
  if (p.total_steps() <= 0) return "-";
  const double f = std::clamp(static_cast<double>(p.step()) / p.total_steps(), 0.0, 1.0);
  return absl::StrCat("▕", ProgressBar(f, 10), "▏ ", static_cast<int>(f * 100), "%");
}

// The coordinator's estimate as of the last sample, while the job runs.
std::string EtaColumn(const Job& job) {
  if (job.state() != trainctl::v1::JOB_STATE_RUNNING || job.progress().eta_seconds() <= 0) {
    return "-";
  }
  return FormatDuration(job.progress().eta_seconds());
}

int List(Context& c) {
  auto states = ParseStates(c.args.Get("state"));
  if (!states.ok()) return Fail(c.err, states.status());
  int limit = 50;
  if (c.args.Has("limit") && (!absl::SimpleAtoi(c.args.Get("limit"), &limit) || limit <= 0)) {
    return Fail(c.err, absl::InvalidArgumentError("--limit: must be a positive integer"));
  }
  JobClient client(c.connection);
  trainctl::v1::ListJobsResponse all;
  trainctl::v1::ListJobsRequest request;
  for (auto s : *states) request.add_states(s);
  do {
    request.set_page_size(std::min(1000, limit - all.jobs_size()));
    auto page = client.List(request);
    if (!page.ok()) return Fail(c.err, page.status());
    for (auto& job : *page->mutable_jobs()) *all.add_jobs() = std::move(job);
    request.set_page_token(page->next_page_token());
    all.set_next_page_token(page->next_page_token());
  } while (!request.page_token().empty() && all.jobs_size() < limit);
  if (c.json) {
    c.out << MessageToJsonText(all, /*pretty=*/true) << '\n';
    return kExitOk;
  }
  Table table(
      {"ID", "NAME", "KIND", "STATE", "ATTEMPT", "RESOURCES", "STEP", "PROGRESS", "ETA", "AGE"});
  for (const Job& job : all.jobs()) {
    const auto& r = job.spec().resources();
    const std::string step =
        job.progress().total_steps() > 0
            ? absl::StrCat(job.progress().step(), "/", job.progress().total_steps())
            : absl::StrCat(job.progress().step());
    table.AddRow({job.id(), job.spec().name(), KindColumn(job), StateName(job.state()),
                  absl::StrCat(job.attempt()), absl::StrCat(r.nodes(), "x", r.slots_per_node()),
                  step, ProgressColumn(job), EtaColumn(job), Age(job.create_time())});
  }
  table.Print(c.out);
  return kExitOk;
}

int Nodes(Context& c) {
  if (!c.args.positional.empty() || c.args.Has("topology") || c.args.Has("refresh")) {
    JobClient client(c.connection, c.args.Has("refresh") ? RefreshDeadline() : absl::Seconds(4));
    return RunNodeTopology(c.args, client, c.json, c.out, c.err);
  }
  JobClient client(c.connection);
  auto nodes = client.ListNodes();
  if (!nodes.ok()) return Fail(c.err, nodes.status());
  if (c.json) {
    c.out << MessageToJsonText(*nodes, /*pretty=*/true) << '\n';
    return kExitOk;
  }
  Table table({"NAME", "ADDRESS", "STATE", "SLOTS", "FREE", "LABELS", "TASKS", "LAST SEEN"});
  for (const trainctl::v1::Node& node : nodes->nodes()) {
    std::vector<std::string> labels;
    for (const auto& [k, v] : node.labels()) labels.push_back(absl::StrCat(k, "=", v));
    std::sort(labels.begin(), labels.end());
    std::vector<std::string> tasks;
    for (const auto& t : node.tasks())
      tasks.push_back(absl::StrCat(t.job_id(), "/", t.node_rank()));
    table.AddRow({node.name(), node.address(), node.state(),
                  absl::StrCat(node.total_slots(), node.gpus() > 0 ? " gpu" : " cpu"),
                  absl::StrCat(node.free_slots()),
                  labels.empty() ? "-" : absl::StrJoin(labels, ","),
                  tasks.empty() ? "-" : absl::StrJoin(tasks, ","), Age(node.last_seen())});
  }
  table.Print(c.out);
  return kExitOk;
}

std::string TrainingSummary(const trainctl::v1::TrainingArguments& t) {
  return absl::StrCat("micro batch ", t.per_device_train_batch_size(), " x accum ",
                      t.gradient_accumulation_steps(), ", lr ", t.learning_rate(), ", epochs ",
                      t.num_train_epochs(), t.bf16() ? ", bf16" : "", t.fp16() ? ", fp16" : "",
                      t.has_tf32() && t.tf32() ? ", tf32" : "", ", save ", t.save_strategy(),
                      ", log every ", t.logging_steps());
}

// "step 40/100, epoch 1.25, loss 0.52, 1.2e+04 tokens/s, 0.52 s/step, ETA 2m05s": epoch and
// tokens/s as the trainer's lead rank last reported them, step time and ETA while the coordinator
// has an estimate.
std::string ProgressLine(const Job& job) {
  const auto& p = job.progress();
  std::string out = absl::StrCat("step ", p.step());
  if (p.total_steps() > 0) absl::StrAppend(&out, "/", p.total_steps());
  if (p.epoch() > 0) absl::StrAppend(&out, absl::StrFormat(", epoch %.3g", p.epoch()));
  absl::StrAppend(&out, ", loss ", p.loss());
  if (p.tokens_per_second() > 0) {
    absl::StrAppend(&out, absl::StrFormat(", %.3g tokens/s", p.tokens_per_second()));
  }
  if (p.step_time() > 0) absl::StrAppend(&out, absl::StrFormat(", %.3g s/step", p.step_time()));
  if (EtaColumn(job) != "-") absl::StrAppend(&out, ", ETA ", EtaColumn(job));
  return out;
}

// The job's spec and state, one "Name:" row each.
void PrintJobFields(const Job& job, std::ostream& out) {
  const JobSpec& spec = job.spec();
  const auto& r = spec.resources();
  Table fields({"ID:", job.id()});
  fields.AddRow({"Name:", spec.name()});
  fields.AddRow({"Kind:", KindColumn(job)});
  fields.AddRow({"Owner:", job.owner().empty() ? "-" : job.owner()});
  fields.AddRow({"State:", StateName(job.state()) +
                               (job.message().empty() ? "" : "  (" + job.message() + ")")});
  if (job.cancel_requested() && job.state() != trainctl::v1::JOB_STATE_CANCELLED) {
    fields.AddRow({"Cancel:", "requested"});
  }
  fields.AddRow({"Attempt:", absl::StrCat(job.attempt(), " (max restarts ", spec.max_restarts(),
                                          job.stages_size() > 0 ? " per stage)" : ")")});
  fields.AddRow({"Model:", spec.model_name_or_path()});
  fields.AddRow({"Data:", spec.data_path()});
  fields.AddRow({"Output dir:", spec.output_dir()});
  fields.AddRow({"Resources:", absl::StrCat(r.nodes(), " node(s) x ", r.slots_per_node(),
                                            " slot(s), world ", r.nodes() * r.slots_per_node())});
  fields.AddRow({"Priority:", absl::StrCat(spec.priority())});
  fields.AddRow({"Training:", TrainingSummary(spec.training())});
  fields.AddRow({"DeepSpeed:", spec.deepspeed().empty()
                                   ? (spec.deepspeed_config_json().empty() ? "-" : "inline")
                                   : spec.deepspeed()});
  for (const auto& [k, v] :
       std::map<std::string, std::string>(spec.env().begin(), spec.env().end())) {
    fields.AddRow({"Env:", k + "=" + v});
  }
  for (const auto& [k, v] : std::map<std::string, std::string>(spec.node_selector().begin(),
                                                               spec.node_selector().end())) {
    fields.AddRow({"Node selector:", k + "=" + v});
  }
  fields.AddRow({"Created:", FormatTime(job.create_time())});
  fields.AddRow({"Started:", FormatTime(job.start_time())});
  fields.AddRow({"Ended:", FormatTime(job.end_time())});
  fields.AddRow({"Progress:", ProgressLine(job)});
  fields.AddRow({"Checkpoint:", job.last_checkpoint().path().empty()
                                    ? "-"
                                    : absl::StrCat(job.last_checkpoint().path(), " (step ",
                                                   job.last_checkpoint().step(), ")")});
  fields.Print(out);
}

int Describe(Context& c) {
  if (c.args.positional.size() != 1)
    return Fail(c.err, absl::InvalidArgumentError("describe needs one job ID"));
  JobClient client(c.connection);
  auto job = client.Get(c.args.positional[0]);
  if (!job.ok()) return Fail(c.err, job.status());
  std::vector<JobEvent> events;
  trainctl::v1::WatchJobRequest request;
  request.set_id(job->id());
  request.set_replay_only(true);
  if (auto s = client.Watch(request, [&](const JobEvent& e) { events.push_back(e); }); !s.ok()) {
    return Fail(c.err, s);
  }
  if (c.json) {
    c.out << MessageToJsonText(*job, /*pretty=*/true) << '\n';
    return kExitOk;
  }
  PrintJobFields(*job, c.out);
  if (job->remedies_size() > 0) {
    c.out << "\nRemedies:\n";
    for (const trainctl::v1::Remedy& remedy : job->remedies()) {
      c.out << "  " << RemedyLine(remedy)
            << (remedy.detail().empty() ? "" : "\n    " + remedy.detail()) << "\n";
    }
  }
  if (job->stages_size() > 0) {
    c.out << "\nStages:\n";
    PrintStages(*job, absl::Now(), c.out);
  }
  if (job->has_memory_plan()) c.out << "\n" << FormatMemoryPlan(job->memory_plan());
  // The curves; a coordinator without GetMetrics (an older one) just has none.
  trainctl::v1::GetMetricsRequest metrics;
  metrics.set_id(job->id());
  metrics.add_names("loss");
  metrics.add_names("reward");
  metrics.set_max_points(2 * ChartOptions().width);  // two braille dots per cell
  if (auto history = client.GetMetrics(metrics); history.ok()) {
    const std::string charts = MetricCharts(*history, {"loss", "reward"});
    if (!charts.empty()) c.out << "\n" << charts;
  }
  c.out << "\nEvents:\n";
  Table table({"  SEQ", "TIME", "EVENT"});
  for (const JobEvent& e : events) {
    table.AddRow({absl::StrCat("  ", e.seq()), FormatTime(e.time()), EventLine(e)});
  }
  table.Print(c.out);
  return kExitOk;
}

int Cancel(Context& c) {
  if (c.args.positional.size() != 1)
    return Fail(c.err, absl::InvalidArgumentError("cancel needs one job ID"));
  JobClient client(c.connection);
  auto job = client.Cancel(c.args.positional[0], c.args.Get("reason"));
  if (!job.ok()) return Fail(c.err, job.status());
  if (c.json) {
    c.out << MessageToJsonText(*job, /*pretty=*/true) << '\n';
  } else if (job->state() == trainctl::v1::JOB_STATE_CANCELLED) {
    c.out << job->id() << " cancelled\n";
  } else {
    c.out << job->id() << " cancel requested; its ranks are being stopped (state "
          << StateName(job->state()) << ")\n";
  }
  return kExitOk;
}

// Erases the terminal's current line and goes back to its start: the live line is redrawn there.
constexpr char kRedraw[] = "\r\x1b[2K";

int Watch(Context& c) {
  if (c.args.positional.size() != 1)
    return Fail(c.err, absl::InvalidArgumentError("watch needs one job ID"));
  JobClient client(c.connection);
  auto job = client.Get(c.args.positional[0]);
  if (!job.ok()) return Fail(c.err, job.status());
  const bool live = c.terminal.is_tty && !c.json;
  absl::Mutex mu;  // the view and `out`, shared with the ticker
  WatchView view(*job);
  absl::Time drawn = absl::InfinitePast();
  auto draw = [&](absl::Time now) {  // with mu held
    const int columns = c.terminal.columns ? c.terminal.columns() : 80;
    c.out << kRedraw << FormatProgressLine(view.View(now), std::max(20, columns - 1)) << std::flush;
    drawn = now;
  };
  // On a terminal the line moves between events too (elapsed, the ETA counting down), and the
  // ETA is the coordinator's, fetched every 2 s on a connection of its own.
  absl::Notification done;
  std::thread ticker;
  if (live) {
    ticker = std::thread([&] {
      JobClient poller(c.connection);
      absl::Time polled = absl::InfinitePast();
      do {
        std::optional<Job> fresh;
        if (absl::Now() - polled >= absl::Seconds(2)) {
          polled = absl::Now();
          if (auto got = poller.Get(job->id()); got.ok()) fresh = std::move(*got);
        }
        absl::MutexLock lock(&mu);
        if (fresh) view.OnJob(*fresh, absl::Now());
        draw(absl::Now());
      } while (!done.WaitForNotificationWithTimeout(absl::Seconds(1)));
    });
  }
  trainctl::v1::WatchJobRequest request;
  request.set_id(job->id());
  absl::Status s = client.Watch(request, [&](const JobEvent& e) {
    absl::MutexLock lock(&mu);
    const bool own_line = view.OnEvent(e);
    if (c.json) {
      c.out << MessageToJsonText(e, /*pretty=*/false) << std::endl;
    } else if (!live) {
      c.out << FormatTime(e.time()) << "  " << EventLine(e) << std::endl;
    } else {
      // Events print above the live line; metric samples only move it (at most 10 times a
      // second, so a long replay does not flood the terminal).
      if (own_line) c.out << kRedraw << FormatTime(e.time()) << "  " << EventLine(e) << "\n";
      const absl::Time now = absl::Now();
      if (own_line || now - drawn >= absl::Milliseconds(100)) draw(now);
    }
  });
  if (live) {
    done.Notify();
    ticker.join();
  }
  absl::MutexLock lock(&mu);
  if (!s.ok()) {
    if (live) c.out << "\n";
    return Fail(c.err, s);
  }
  if (!c.json) {
    if (auto last = client.Get(job->id()); last.ok()) view.OnJob(*last, absl::Now());
    if (live) {
      draw(absl::Now());
      c.out << "\n";
    }
    c.out << view.Summary(absl::Now()) << std::endl;
  }
  return view.state() == trainctl::v1::JOB_STATE_SUCCEEDED ? kExitOk : kExitFailed;
}

int Metrics(Context& c) {
  if (c.args.positional.size() != 1)
    return Fail(c.err, absl::InvalidArgumentError("metrics needs one job ID"));
  trainctl::v1::GetMetricsRequest request;
  request.set_id(c.args.positional[0]);
  for (absl::string_view name : absl::StrSplit(c.args.Get("name"), ',', absl::SkipWhitespace())) {
    request.add_names(std::string(absl::StripAsciiWhitespace(name)));
  }
  if (c.args.Has("max_points")) {
    int n = 0;
    if (!absl::SimpleAtoi(c.args.Get("max_points"), &n) || n <= 0) {
      return Fail(c.err, absl::InvalidArgumentError("--max_points: must be a positive integer"));
    }
    request.set_max_points(n);
  }
  JobClient client(c.connection);
  auto history = client.GetMetrics(request);
  if (!history.ok()) return Fail(c.err, history.status());
  for (const std::string& name : request.names()) {
    const bool found = std::any_of(history->series().begin(), history->series().end(),
                                   [&](const auto& series) { return series.name() == name; });
    if (!found) c.err << "warning: " << request.id() << " has no metric '" << name << "'\n";
  }
  if (c.format == "json") {
    c.out << MessageToJsonText(*history, /*pretty=*/true) << '\n';
  } else if (c.format == "csv") {
    c.out << MetricsCsv(*history);
  } else if (history->series_size() == 0) {
    c.err << request.id() << " has no metrics recorded\n";
  } else {
    c.out << MetricsTable(*history);
  }
  return kExitOk;
}

int Logs(Context& c) {
  if (c.args.positional.size() != 1)
    return Fail(c.err, absl::InvalidArgumentError("logs needs one job ID"));
  trainctl::v1::StreamLogsRequest request;
  request.set_id(c.args.positional[0]);
  request.set_follow(c.args.Has("follow"));
  if (c.args.Has("tail")) {
    int tail = 0;
    if (!absl::SimpleAtoi(c.args.Get("tail"), &tail) || tail <= 0) {
      return Fail(c.err, absl::InvalidArgumentError("--tail: must be a positive integer"));
    }
    request.set_tail(tail);
  }
  JobClient client(c.connection);
  absl::Status s = client.Logs(request, [&](const LogLine& line) {
    if (c.json) {
      c.out << MessageToJsonText(line, /*pretty=*/false) << std::endl;
    } else {
      // A rank's raw bytes (ESC, NUL, CR) would drive the terminal: written out there, kept in
      // pipes.
      c.out << "[rank " << line.rank() << "] "
            << (c.terminal.is_tty ? EscapeForTerminal(line.text()) : line.text()) << std::endl;
    }
  });
  return s.ok() ? kExitOk : Fail(c.err, s);
}

int Tokenize(Context& c) { return RunTokenize(c.args, c.out, c.err); }

int Diagnose(Context& c) { return RunDiagnose(c.args, c.connection, c.format, c.out, c.err); }

struct Verb {
  std::function<int(Context&)> run;
  std::vector<OptionSpec> options;
  bool passthrough = false;
};

std::map<std::string, Verb> Verbs() {
  const OptionSpec coordinator{"coordinator", "", true};
  const OptionSpec output{"output", "-o", true};
  std::vector<OptionSpec> nodes = NodeTopologyOptions();
  nodes.insert(nodes.begin(), {coordinator, output});
  std::vector<OptionSpec> diagnose = DiagnoseOptions();
  diagnose.insert(diagnose.begin(), {coordinator, output});
  return {
      {"submit", {Submit, {coordinator, output, {"force", "", false}}, true}},
      {"validate", {Validate, {output}, true}},
      {"ls", {List, {coordinator, output, {"state", "", true}, {"limit", "", true}}}},
      {"describe", {Describe, {coordinator, output}}},
      {"cancel", {Cancel, {coordinator, output, {"reason", "", true}}}},
      {"watch", {Watch, {coordinator, output}}},
      {"metrics", {Metrics, {coordinator, output, {"name", "", true}, {"max_points", "", true}}}},
      {"logs", {Logs, {coordinator, output, {"follow", "-f", false}, {"tail", "", true}}}},
      {"nodes", {Nodes, nodes}},
      {"diagnose", {Diagnose, diagnose}},
      {"tokenize", {Tokenize, {{"tokenizer", "", true}, {"decode", "", false}}}},
  };
}

}  // namespace

int RunTrainctl(const std::vector<std::string>& args, const std::string& env_coordinator,
                std::ostream& out, std::ostream& err, const Terminal& terminal) {
  ClientEnvironment env;
  env.coordinator = env_coordinator;
  return RunTrainctl(args, env, out, err, terminal);
}

int RunTrainctl(const std::vector<std::string>& args, const ClientEnvironment& env,
                std::ostream& out, std::ostream& err, const Terminal& terminal) {
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    (args.empty() ? err : out) << kUsage;
    return args.empty() ? kExitUsage : kExitOk;
  }
  // Global options may come before the verb: `trainctl --coordinator H:P ls`.
  std::vector<OptionSpec> globals = ConnectionOptions();
  globals.push_back({"output", "-o", true});
  auto leading = ParseLeadingOptions(args, globals);
  if (!leading.ok()) {
    err << "trainctl: " << leading.status().message() << "\n\n" << kUsage;
    return kExitUsage;
  }
  if (leading->verb_index >= args.size()) {
    err << "trainctl: no command given\n\n" << kUsage;
    return kExitUsage;
  }
  const std::string& name = args[leading->verb_index];
  // The data verbs parse their own flags (common/data/data_cli.h).
  const std::vector<std::string> rest(args.begin() + leading->verb_index + 1, args.end());
  if ((name == "prepare" || name == "datagen") && !leading->options.empty()) {
    err << "trainctl " << name << ": --" << leading->options.begin()->first
        << ": not an option of this command\n";
    return kExitUsage;
  }
  if (name == "prepare") return data::RunPrepareVerb(rest, out, err);
  if (name == "datagen") return data::RunDatagenVerb(rest, out, err);
  auto verbs = Verbs();
  auto verb = verbs.find(name);
  if (verb == verbs.end()) {
    err << "trainctl: unknown command '" << name << "'\n\n" << kUsage;
    return kExitUsage;
  }
  const bool remote = AddConnectionOptions(&verb->second.options);
  auto parsed = ParseArgs(rest, verb->second.options, verb->second.passthrough);
  absl::Status merged =
      parsed.ok() ? MergeLeadingOptions(*leading, verb->second.options, &*parsed) : parsed.status();
  if (!merged.ok()) {
    err << "trainctl " << name << ": " << merged.message() << '\n';
    return kExitUsage;
  }
  Context c{std::move(*parsed), "", false, out, err, "", terminal};
  c.coordinator =
      c.args.Get("coordinator", env.coordinator.empty() ? kDefaultCoordinator : env.coordinator);
  if (remote) {
    auto connection = ResolveConnection(c.args.options, env);
    if (!connection.ok()) return Fail(err, connection.status());
    c.connection = *std::move(connection);
    c.coordinator = absl::StrJoin(c.connection.addresses, ",");
  }
  c.format = c.args.Get("output", "table");
  const bool csv_ok = name == "metrics";
  if (c.format != "table" && c.format != "json" && !(csv_ok && c.format == "csv")) {
    err << "trainctl " << name << ": -o must be table" << (csv_ok ? ", csv" : "")
        << " or json, got '" << c.format << "'\n";
    return kExitUsage;
  }
  c.json = c.format == "json";
  return verb->second.run(c);
}

}  // namespace trainctl::cli
