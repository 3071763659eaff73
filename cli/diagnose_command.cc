#include "cli/diagnose_command.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/diagnose_view.h"
#include "cli/exit_codes.h"
#include "cli/job_client.h"
#include "common/json_proto.h"

namespace trainctl::cli {
namespace {

namespace v1 = trainctl::v1;

int DiagnoseFailed(std::ostream& err, const absl::Status& status) {
  return Fail(err, status, UsageOrFailed(status), "trainctl diagnose");
}

bool Terminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

absl::StatusOr<int> PositiveInt(const ParsedArgs& args, const std::string& name, int fallback) {
  if (!args.Has(name)) return fallback;
  int n = 0;
  if (!absl::SimpleAtoi(args.Get(name), &n) || n <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": must be a positive integer"));
  }
  return n;
}

// The probe job's spec from the flags.
absl::StatusOr<v1::JobSpec> ProbeSpec(const ParsedArgs& args) {
  v1::JobSpec spec;
  spec.set_name("bandwidth-probe");
  spec.set_kind(v1::JOB_KIND_PROBE);
  auto nodes = PositiveInt(args, "nodes", 1);
  if (!nodes.ok()) return nodes.status();
  auto slots = PositiveInt(args, "slots_per_node", 1);
  if (!slots.ok()) return slots.status();
  spec.mutable_resources()->set_nodes(*nodes);
  spec.mutable_resources()->set_slots_per_node(*slots);
  spec.mutable_diagnostics()->set_bandwidth_probe(true);
  for (absl::string_view size : absl::StrSplit(args.Get("sizes"), ',', absl::SkipEmpty())) {
    int64_t bytes = 0;
    if (!absl::SimpleAtoi(size, &bytes) || bytes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sizes: '", size, "' is not a positive byte count"));
    }
    spec.mutable_diagnostics()->add_probe_sizes(bytes);
  }
  for (absl::string_view pair : absl::StrSplit(args.Get("node_selector"), ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(pair, absl::MaxSplits('=', 1));
    if (kv.first.empty() || kv.second.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--node_selector: '", pair, "' is not KEY=VALUE"));
    }
    (*spec.mutable_node_selector())[kv.first] = kv.second;
  }
  return spec;
}

// Submits the probe and waits for it to end; returns its id.
absl::StatusOr<std::string> RunProbe(JobClient& client, const ParsedArgs& args, std::ostream& err) {
  auto spec = ProbeSpec(args);
  if (!spec.ok()) return spec.status();
  auto timeout = PositiveInt(args, "timeout", 600);
  if (!timeout.ok()) return timeout.status();
  v1::SubmitJobRequest request;
  *request.mutable_spec() = *spec;
  auto submitted = client.Submit(request);
  if (!submitted.ok()) return submitted.status();
  const std::string id = submitted->job().id();
  err << "probe job " << id << " submitted; waiting for it to run\n";
  const absl::Time deadline = absl::Now() + absl::Seconds(*timeout);
  while (true) {
    auto job = client.Get(id);
    if (!job.ok()) return job.status();
    if (Terminal(job->state())) {
      if (job->state() != v1::JOB_STATE_SUCCEEDED) {
        err << "probe job " << id << " ended " << v1::JobState_Name(job->state()) << ": "
            << job->message() << "\n";
      }
      return id;
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("probe job ", id, " still ",
                                                      v1::JobState_Name(job->state()), " after ",
                                                      *timeout, " s (--timeout)"));
    }
    absl::SleepFor(absl::Milliseconds(300));
  }
}

}  // namespace

std::vector<OptionSpec> DiagnoseOptions() {
  return {{"probe", "", false},        {"nodes", "", true}, {"slots_per_node", "", true},
          {"node_selector", "", true}, {"sizes", "", true}, {"timeout", "", true}};
}

int RunDiagnose(const ParsedArgs& args, const Connection& connection, const std::string& format,
                std::ostream& out, std::ostream& err) {
  const bool probe = args.Has("probe");
  if (probe != args.positional.empty()) {
    return DiagnoseFailed(
        err, absl::InvalidArgumentError(probe ? "--probe runs a new probe job: give no job ID"
                                              : "diagnose needs one job ID (or --probe)"));
  }
  if (args.positional.size() > 1) {
    return DiagnoseFailed(err, absl::InvalidArgumentError("diagnose takes one job ID"));
  }
  for (const char* name : {"nodes", "slots_per_node", "node_selector", "sizes", "timeout"}) {
    if (!probe && args.Has(name)) {
      return DiagnoseFailed(err,
                            absl::InvalidArgumentError(absl::StrCat("--", name, " needs --probe")));
    }
  }
  JobClient client(connection);
  std::string id = probe ? "" : args.positional[0];
  if (probe) {
    auto ran = RunProbe(client, args, err);
    if (!ran.ok()) return DiagnoseFailed(err, ran.status());
    id = *ran;
  }
  auto diagnosis = client.Diagnose(id);
  if (!diagnosis.ok()) return DiagnoseFailed(err, diagnosis.status());
  if (format == "json") {
    out << MessageToJsonText(*diagnosis, /*pretty=*/true) << '\n';
  } else {
    out << DiagnosisText(*diagnosis);
  }
  return kExitOk;
}

}  // namespace trainctl::cli
