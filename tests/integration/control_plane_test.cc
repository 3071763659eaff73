// The control plane as users run it: the real trainctl-coordinator binary on a loopback port with a
// real SQLite file, driven by the real trainctl binary (and, for load, by concurrent gRPC clients).
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/job_client.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/control_plane_fixture.h"
#include "tests/testing/grpc_probe.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

using google::protobuf::util::MessageDifferencer;
using testing::ControlPlaneTest;
using testing::RunResult;
using testing::Subprocess;
using testing::WaitFor;

// The seed's launch flags, verbatim, with trainctl's --kind in front.
std::vector<std::string> SeedFlags() {
  std::vector<std::string> flags = {"--kind", "sft"};
  for (const std::string& f : testing::SeedLaunchFlags()) flags.push_back(f);
  return flags;
}

TEST_F(ControlPlaneTest, SubmitListDescribeCancelThroughTheCli) {
  StartCoordinator();
  RunResult submit = Trainctl({"submit", WriteSpec(), "-o", "json"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const auto job = nlohmann::json::parse(submit.out);
  const std::string id = job["id"];
  EXPECT_EQ(job["state"], "JOB_STATE_PENDING");
  EXPECT_EQ(job["spec"]["env"]["NCCL_IB_DISABLE"], "0");
  EXPECT_NE(submit.err.find("warning: spec.deepspeed.bf16.loss_scale"), std::string::npos)
      << submit.err;

  RunResult ls = Trainctl({"ls"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  std::vector<std::string> rows = absl::StrSplit(ls.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(rows.size(), 2u) << ls.out;
  EXPECT_TRUE(absl::StartsWith(rows[0], "ID "));
  EXPECT_TRUE(absl::StartsWith(rows[1], id + " "));
  EXPECT_NE(rows[1].find("qwen2vl-r1"), std::string::npos);
  EXPECT_NE(rows[1].find("pending"), std::string::npos);
  // Columns line up: STATE starts at the same offset in the header and the row.
  EXPECT_EQ(rows[0].find("STATE"), rows[1].find("pending"));

  RunResult describe = Trainctl({"describe", id});
  ASSERT_EQ(describe.exit_code, 0) << describe.err;
  EXPECT_NE(describe.out.find("State:        pending"), std::string::npos) << describe.out;
  EXPECT_NE(describe.out.find("world 8"), std::string::npos);
  EXPECT_NE(describe.out.find("NCCL_DEBUG=INFO"), std::string::npos);
  EXPECT_NE(describe.out.find("-> pending"), std::string::npos);

  RunResult cancel = Trainctl({"cancel", id, "--reason", "test over"});
  ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
  EXPECT_EQ(cancel.out, id + " cancelled\n");

  RunResult after = Trainctl({"describe", id, "-o", "json"});
  ASSERT_EQ(after.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(after.out)["state"], "JOB_STATE_CANCELLED");
  EXPECT_EQ(nlohmann::json::parse(after.out)["message"], "cancelled: test over");

  RunResult watch = Trainctl({"watch", id});
  EXPECT_EQ(watch.exit_code, 1);  // the stream ends; the job did not succeed
  EXPECT_NE(watch.out.find("pending -> cancelled"), std::string::npos) << watch.out;
  RunResult logs = Trainctl({"logs", id, "-f"});  // a finished job's logs end at once
  EXPECT_EQ(logs.exit_code, 0) << logs.err;

  RunResult ls_json = Trainctl({"ls", "-o", "json", "--state", "cancelled"});
  ASSERT_EQ(ls_json.exit_code, 0) << ls_json.err;
  EXPECT_EQ(nlohmann::json::parse(ls_json.out)["jobs"].size(), 1u);
  RunResult again = Trainctl({"cancel", id});
  EXPECT_EQ(again.exit_code, 0);
  RunResult missing = Trainctl({"describe", "job-999"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.err, "trainctl: job job-999 not found\n");
}

TEST_F(ControlPlaneTest, SubmitTheSeedsLaunchFlagsVerbatim) {
  StartCoordinator();
  std::vector<std::string> args = {"submit", "-o", "json"};
  for (const auto& f : SeedFlags()) args.push_back(f);
  RunResult submit = Trainctl(args, TRAINCTL_SOURCE_DIR);
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const auto job = nlohmann::json::parse(submit.out);
  EXPECT_EQ(job["spec"]["resources"]["slots_per_node"], 8);
  EXPECT_EQ(job["spec"]["training"]["gradient_accumulation_steps"], 4);
  const auto ds = nlohmann::json::parse(std::string(job["resolved_deepspeed_config_json"]));
  EXPECT_EQ(ds["train_batch_size"], 128);
  EXPECT_EQ(ds["zero_optimization"]["stage3_param_persistence_threshold"], 35840);
}

TEST_F(ControlPlaneTest, ValidateWorksOfflineAndListsEveryError) {
  address_ = "127.0.0.1:1";  // nothing listens: validate must not need it
  std::vector<std::string> args = {"validate"};
  for (const auto& f : SeedFlags()) args.push_back(f);
  RunResult ok = Trainctl(args, TRAINCTL_SOURCE_DIR);
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  const auto ds = nlohmann::json::parse(ok.out);
  EXPECT_EQ(ds["train_batch_size"], 128);
  EXPECT_EQ(ds["train_micro_batch_size_per_gpu"], 4);
  EXPECT_EQ(ds["zero_optimization"]["reduce_bucket_size"], 12845056);

  args.push_back("--num_gpus");
  args.push_back("0");
  args.push_back("--learning_rate");
  args.push_back("-1");
  RunResult bad = Trainctl(args, TRAINCTL_SOURCE_DIR);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_TRUE(bad.out.empty());
  EXPECT_NE(bad.err.find("trainctl: spec.resources.slots_per_node: must be >= 1, got 0\n"),
            std::string::npos)
      << bad.err;
  EXPECT_NE(bad.err.find("trainctl: spec.training.learning_rate: must be > 0, got -1\n"),
            std::string::npos)
      << bad.err;
}

TEST_F(ControlPlaneTest, UnreachableCoordinatorIsOneLineWithinFiveSeconds) {
  // A port nobody listens on: refused at once.
  RunResult refused = testing::Run({TRAINCTL_CLI_BIN, "ls", "--coordinator", "127.0.0.1:1"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_LT(refused.elapsed, absl::Seconds(5));
  EXPECT_TRUE(absl::StartsWith(refused.err, "trainctl: cannot reach coordinator at 127.0.0.1:1: "))
      << refused.err;
  EXPECT_EQ(std::count(refused.err.begin(), refused.err.end(), '\n'), 1) << refused.err;

  // A port that accepts TCP but never speaks HTTP/2: only the deadline can end the wait.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string silent = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  for (const std::vector<std::string>& verb :
       {std::vector<std::string>{"ls"}, {"watch", "job-1"}}) {
    std::vector<std::string> argv = {TRAINCTL_CLI_BIN};
    argv.insert(argv.end(), verb.begin(), verb.end());
    RunResult hung = testing::Run(argv, {{"TRAINCTL_COORDINATOR", silent}});
    EXPECT_EQ(hung.exit_code, 1) << verb[0];
    EXPECT_LT(hung.elapsed, absl::Seconds(5)) << verb[0];
    EXPECT_TRUE(absl::StartsWith(hung.err, "trainctl: cannot reach coordinator at " + silent))
        << hung.err;
  }
  close(fd);
}

TEST_F(ControlPlaneTest, HealthAndReflectionAreServed) {
  StartCoordinator();
  auto serving = testing::HealthServing(address_);
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
  auto services = testing::ReflectionListServices(address_);
  ASSERT_TRUE(services.ok()) << services.status();
  EXPECT_NE(services->find("trainctl.v1.JobService"), std::string::npos);
  EXPECT_NE(services->find("grpc.health.v1.Health"), std::string::npos);
}

TEST_F(ControlPlaneTest, RestartKeepsEveryJob) {
  StartCoordinator();
  const std::string spec = WriteSpec();
  std::map<std::string, nlohmann::json> before;  // id -> describe -o json (map order is free)
  for (int i = 0; i < 5; ++i) {
    RunResult r = Trainctl({"submit", spec, "--name", absl::StrCat("job", i), "-o", "json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    before[nlohmann::json::parse(r.out)["id"]] = nullptr;
  }
  ASSERT_EQ(Trainctl({"cancel", "job-2"}).exit_code, 0);
  for (auto& [id, json] : before)
    json = nlohmann::json::parse(Trainctl({"describe", id, "-o", "json"}).out);

  for (int signal : {SIGTERM, SIGKILL}) {
    coordinator_->Kill(signal);
    ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
    StartCoordinator();
    for (const auto& [id, json] : before) {
      RunResult r = Trainctl({"describe", id, "-o", "json"});
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(nlohmann::json::parse(r.out), json) << "after signal " << signal;
    }
    RunResult ls = Trainctl({"ls", "-o", "json"});
    EXPECT_EQ(nlohmann::json::parse(ls.out)["jobs"].size(), 5u);
  }
}

TEST_F(ControlPlaneTest, KillNineDuringConcurrentSubmitsLosesNoAcknowledgedJob) {
  KillNineDuringConcurrentSubmitsLosesNoAcknowledgedJob();
}

TEST_F(ControlPlaneTest, ASecondCoordinatorOnTheSameAddressOrDatabaseIsRefused) {
  StartCoordinator();
  ASSERT_EQ(Trainctl({"submit", WriteSpec()}).exit_code, 0);
  // Both would serve forever if they started: the deadline ends them, and the test fails.
  const std::vector<std::string> same_db = {TRAINCTL_COORDINATOR_BIN, "--listen", "127.0.0.1:0",
                                            "--db", db_};
  RunResult second = testing::Run(same_db, {}, absl::Seconds(10));
  EXPECT_EQ(second.exit_code, 1) << second.err;
  EXPECT_NE(second.err.find(absl::StrCat("database ", db_,
                                         " is in use by another trainctl-coordinator (pid ",
                                         coordinator_->pid(), " on ")),
            std::string::npos)
      << second.err;
  EXPECT_NE(second.err.find("serving " + address_), std::string::npos) << second.err;

  RunResult same_port = testing::Run(
      {TRAINCTL_COORDINATOR_BIN, "--listen", address_, "--db", dir_.path() + "/other.db"}, {},
      absl::Seconds(10));
  EXPECT_EQ(same_port.exit_code, 1) << same_port.err;
  EXPECT_NE(same_port.err.find("cannot listen on " + address_), std::string::npos) << same_port.err;

  // Only the first one answers, every time.
  for (int i = 0; i < 5; ++i) {
    RunResult ls = Trainctl({"ls", "-o", "json"});
    ASSERT_EQ(ls.exit_code, 0) << ls.err;
    EXPECT_EQ(nlohmann::json::parse(ls.out)["jobs"].size(), 1u);
  }

  // The lock dies with its holder, however it dies: the next coordinator starts at once.
  coordinator_->Kill(SIGKILL);
  ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
  StartCoordinator();
  RunResult ls = Trainctl({"ls", "-o", "json"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_EQ(nlohmann::json::parse(ls.out)["jobs"].size(), 1u);
}

// A spec the coordinator accepts (the seed's job), for raw gRPC clients to break one field of.
trainctl::v1::SubmitJobRequest ValidRequest(const std::string& request_id) {
  trainctl::v1::SubmitJobRequest request;
  auto* spec = request.mutable_spec();
  spec->set_kind(trainctl::v1::JOB_KIND_SFT);
  spec->set_model_name_or_path("Qwen/Qwen2-VL-7B-Instruct");
  spec->set_data_path("/data/d");
  spec->set_output_dir("/out/o");
  request.set_request_id(request_id);
  return request;
}

TEST_F(ControlPlaneTest, RawSubmitOfWhatNoSpecFileCanSayIsRefusedAndNothingIsStored) {
  StartCoordinator();
  cli::JobClient client(address_);
  trainctl::v1::SubmitJobRequest unknown_kind = ValidRequest("k");
  unknown_kind.mutable_spec()->set_kind(static_cast<trainctl::v1::JobKind>(99));
  auto r = client.Submit(unknown_kind);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_EQ(r.status().message(),
            "spec.kind: must be one of distill|sft|grpo|eval|pipeline|probe, got 99");

  trainctl::v1::SubmitJobRequest stage_kind = ValidRequest("s");
  stage_kind.mutable_spec()->set_kind(trainctl::v1::JOB_KIND_PIPELINE);
  stage_kind.mutable_spec()->add_stages()->set_kind(trainctl::v1::JOB_KIND_SFT);
  stage_kind.mutable_spec()->add_stages()->set_kind(static_cast<trainctl::v1::JobKind>(7));
  r = client.Submit(stage_kind);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find(
                "spec.stages[1].kind: must be one of distill|sft|grpo|eval|pipeline|probe, got 7"),
            absl::string_view::npos)
      << r.status();

  trainctl::v1::SubmitJobRequest unknown_field = ValidRequest("f");
  unknown_field.mutable_spec()
      ->mutable_training()
      ->GetReflection()
      ->MutableUnknownFields(unknown_field.mutable_spec()->mutable_training())
      ->AddVarint(777, 1);
  r = client.Submit(unknown_field);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("spec.training: unknown field number 777"),
            absl::string_view::npos)
      << r.status();

  // Not UTF-8: the request does not even parse as a JobSpec on the server (gRPC's own refusal).
  trainctl::v1::SubmitJobRequest latin1 = ValidRequest("u");
  (*latin1.mutable_spec()->mutable_labels())["owner"] = "caf\xe9";
  EXPECT_FALSE(client.Submit(latin1).ok());

  RunResult ls = Trainctl({"ls", "-o", "json"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_EQ(nlohmann::json::parse(ls.out)["jobs"].size(), 0u) << ls.out;
  EXPECT_EQ(client.Submit(ValidRequest("ok")).status(), absl::OkStatus());
}

// What a newer coordinator could answer: enum values this CLI's protos do not know.
class NewerCoordinator final : public trainctl::v1::JobService::Service {
 public:
  static trainctl::v1::Job FutureJob() {
    trainctl::v1::Job job;
    job.set_id("job-1");
    job.set_state(static_cast<trainctl::v1::JobState>(42));
    job.mutable_spec()->set_name("from-the-future");
    job.mutable_spec()->set_kind(static_cast<trainctl::v1::JobKind>(99));
    job.mutable_spec()->mutable_resources()->set_nodes(1);
    job.mutable_spec()->mutable_resources()->set_slots_per_node(1);
    return job;
  }
  grpc::Status GetJob(grpc::ServerContext*, const trainctl::v1::GetJobRequest*,
                      trainctl::v1::Job* job) override {
    *job = FutureJob();
    return grpc::Status::OK;
  }
  grpc::Status ListJobs(grpc::ServerContext*, const trainctl::v1::ListJobsRequest*,
                        trainctl::v1::ListJobsResponse* response) override {
    *response->add_jobs() = FutureJob();
    return grpc::Status::OK;
  }
  grpc::Status WatchJob(grpc::ServerContext*, const trainctl::v1::WatchJobRequest*,
                        grpc::ServerWriter<trainctl::v1::JobEvent>* writer) override {
    trainctl::v1::JobEvent event;
    event.set_seq(1);
    event.set_job_id("job-1");
    event.mutable_state_change()->set_from(trainctl::v1::JOB_STATE_RUNNING);
    event.mutable_state_change()->set_to(static_cast<trainctl::v1::JobState>(42));
    writer->Write(event);
    return grpc::Status::OK;
  }
};

TEST_F(ControlPlaneTest, CliShowsEnumValuesItDoesNotKnowInsteadOfCrashing) {
  NewerCoordinator service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  address_ = absl::StrCat("127.0.0.1:", port);

  RunResult ls = Trainctl({"ls"});
  EXPECT_EQ(ls.signal, 0);
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_NE(ls.out.find("unknown(99)"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("unknown(42)"), std::string::npos) << ls.out;
  RunResult describe = Trainctl({"describe", "job-1"});
  EXPECT_EQ(describe.signal, 0);
  ASSERT_EQ(describe.exit_code, 0) << describe.err;
  EXPECT_NE(describe.out.find("Kind:         unknown(99)"), std::string::npos) << describe.out;
  EXPECT_NE(describe.out.find("running -> unknown(42)"), std::string::npos) << describe.out;
  RunResult watch = Trainctl({"watch", "job-1"});
  EXPECT_EQ(watch.signal, 0);
  EXPECT_EQ(watch.exit_code, 1) << watch.err;  // the job did not succeed
  EXPECT_NE(watch.out.find("running -> unknown(42)"), std::string::npos) << watch.out;
  server->Shutdown();
}

TEST_F(ControlPlaneTest, UnknownFieldsAndWrongValuesAreReportedTogether) {
  address_ = "127.0.0.1:1";  // validate is offline; submit must not get as far as sending
  const std::string spec = dir_.Write("mixed.yaml", R"(kind: sft
model_name_or_path: Qwen/Qwen2-VL-7B-Instruct
data_path: /data
output_dir: [1]
training:
  lerning_rate: 1e-5
  adam_beta1: 1.5
resources: {nodes: 1, slots_per_node: 0}
)");
  const std::string expected =
      "trainctl: spec.output_dir: must be a string, got a list\n"
      "trainctl: spec.training.lerning_rate: unknown field (did you mean 'learning_rate'?)\n"
      "trainctl: spec.resources.slots_per_node: must be >= 1, got 0\n"
      "trainctl: spec.training.adam_beta1: must be in [0, 1), got 1.5\n";
  for (const char* verb : {"validate", "submit"}) {
    RunResult r = Trainctl({verb, spec});
    EXPECT_EQ(r.exit_code, 1) << verb;
    EXPECT_EQ(r.err, expected) << verb;
  }
  RunResult flags = Trainctl({"validate", spec, "--max_grad_norm", "big", "--lerning_rate", "1"});
  EXPECT_EQ(flags.exit_code, 1);
  for (const char* line :
       {"trainctl: spec.training.lerning_rate: unknown field",
        "trainctl: --max_grad_norm: must be a number", "trainctl: --lerning_rate: unknown flag",
        "trainctl: spec.training.adam_beta1: must be in"}) {
    EXPECT_NE(flags.err.find(line), std::string::npos) << line << "\n" << flags.err;
  }
}

TEST_F(ControlPlaneTest, YamlAliasBombAndHugeDocumentsAreRefusedNamingTheLimit) {
  // 9 levels of 9 aliases: 583 bytes that expand to 9^9 strings.
  std::string bomb =
      "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n";
  for (char level = 'b'; level <= 'i'; ++level) {
    const std::string prev = absl::StrCat("*", std::string(1, level - 1));
    absl::StrAppend(&bomb, std::string(1, level), ": &", std::string(1, level), " [",
                    absl::StrJoin(std::vector<std::string>(9, prev), ","), "]\n");
  }
  ASSERT_LT(bomb.size(), 600u);
  const std::string path = dir_.Write("bomb.yaml", bomb);
  // With its address space capped, a CLI that expands the aliases dies instead of taking the
  // machine's memory.
  RunResult r = testing::Run(
      {"/bin/sh", "-c", "ulimit -v 2000000 && exec \"$0\" validate \"$1\"", TRAINCTL_CLI_BIN, path},
      {}, absl::Seconds(60));
  EXPECT_EQ(r.signal, 0) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_LT(r.elapsed, absl::Seconds(5));
  EXPECT_TRUE(absl::StartsWith(r.err, "trainctl: " + path + ":")) << r.err;
  EXPECT_NE(r.err.find("invalid YAML: the document has more than 100000 nodes with its aliases "
                       "expanded (the limit)"),
            std::string::npos)
      << r.err;

  const std::string deep =
      dir_.Write("deep.yaml", "kind: " + std::string(200, '[') + std::string(200, ']') + "\n");
  RunResult d = Trainctl({"validate", deep});
  EXPECT_EQ(d.exit_code, 1) << d.err;
  EXPECT_NE(d.err.find("nested deeper than 64 levels (the limit)"), std::string::npos) << d.err;

  const std::string huge = dir_.Write("huge.yaml", std::string(2 << 20, '#'));
  RunResult h = Trainctl({"validate", huge});
  EXPECT_EQ(h.exit_code, 1);
  EXPECT_EQ(h.err, "trainctl: " + huge + ": 2097152 bytes, over the limit of 1048576 bytes\n");
}

TEST_F(ControlPlaneTest, OversizedSpecsAreRefusedAtSubmitNamingTheLimit) {
  StartCoordinator();
  cli::JobClient client(address_);
  trainctl::v1::SubmitJobRequest big_label = ValidRequest("label");
  (*big_label.mutable_spec()->mutable_labels())["note"] = std::string(3 << 20, 'x');
  auto r = client.Submit(big_label);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("spec.labels.note: 3145728 bytes, over the limit of 4096"),
            absl::string_view::npos)
      << r.status().message().substr(0, 500);
  EXPECT_NE(r.status().message().find("spec: 3145"), absl::string_view::npos);

  trainctl::v1::SubmitJobRequest many = ValidRequest("many");
  for (int i = 0; i < 200; ++i) (*many.mutable_spec()->mutable_env())[absl::StrCat("V", i)] = "1";
  (*many.mutable_spec()->mutable_node_selector())[std::string(200, 'k')] = "v";
  many.mutable_spec()->set_deepspeed_config_json(std::string(100 << 10, ' ') + "{}");
  r = client.Submit(many);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  for (const char* line :
       {"spec.env: 200 entries, over the limit of 128", "key is 200 bytes, over the limit of 128",
        "spec.deepspeed_config_json: 102402 bytes, over the limit of 65536"}) {
    EXPECT_NE(r.status().message().find(line), absl::string_view::npos) << line << "\n"
                                                                        << r.status().message();
  }

  // The CLI says the same before anything is stored.
  const std::string spec = dir_.Write("big.yaml", absl::StrCat(R"(kind: sft
model_name_or_path: m
data_path: d
output_dir: o
labels: {note: ")",
                                                               std::string(5000, 'x'), "\"}\n"));
  RunResult submit = Trainctl({"submit", spec});
  EXPECT_EQ(submit.exit_code, 1);
  EXPECT_EQ(submit.err, "trainctl: spec.labels.note: 5000 bytes, over the limit of 4096\n");
  RunResult ls = Trainctl({"ls", "-o", "json"});
  EXPECT_EQ(nlohmann::json::parse(ls.out)["jobs"].size(), 0u);
}

TEST_F(ControlPlaneTest, ListingsArePagedByBytesSoEveryClientCanReadThem) {
  StartCoordinator();
  cli::JobClient client(address_);
  // 20 jobs of ~250 KB each (within every limit): 5 MB, past gRPC's default 4 MiB a message.
  constexpr int kJobs = 20;
  for (int i = 0; i < kJobs; ++i) {
    trainctl::v1::SubmitJobRequest request = ValidRequest(absl::StrCat("big-", i));
    for (int l = 0; l < 60; ++l) {
      (*request.mutable_spec()->mutable_labels())[absl::StrCat("l", l)] =
          std::string(4000, 'a' + l % 26);
    }
    auto r = client.Submit(request);
    ASSERT_TRUE(r.ok()) << r.status().message().substr(0, 300);
  }
  // A client with gRPC's default limits reads every job, page by page.
  auto stub = trainctl::v1::JobService::NewStub(
      grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  trainctl::v1::ListJobsRequest request;
  int seen = 0, pages = 0;
  do {
    grpc::ClientContext context;
    trainctl::v1::ListJobsResponse page;
    grpc::Status s = stub->ListJobs(&context, request, &page);
    ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
    EXPECT_LE(page.ByteSizeLong(), size_t{4} << 20);
    seen += page.jobs_size();
    ++pages;
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  EXPECT_EQ(seen, kJobs);
  EXPECT_GT(pages, 1);

  RunResult ls = Trainctl({"ls"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_EQ(std::count(ls.out.begin(), ls.out.end(), '\n'), kJobs + 1) << ls.out.substr(0, 500);
}

}  // namespace
}  // namespace trainctl
