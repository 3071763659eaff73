// The fixture of the tests that play hostile and unlucky workers against the real binaries
// (worker_robustness_test.cc, trust_test.cc): the real trainctl-coordinator and trainctl-worker on
// loopback, ranks replaced through --trainer by small shell scripts, and raw WorkerService
// sessions built from proto/, as any client on the network can open them.
#ifndef TRAINCTL_TESTS_INTEGRATION_ROBUSTNESS_FIXTURE_H_
#define TRAINCTL_TESTS_INTEGRATION_ROBUSTNESS_FIXTURE_H_

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/job_client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemons.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "trainctl/v1/worker.grpc.pb.h"

namespace trainctl::testing {

using std::string_literals::operator""s;

class RobustnessTest : public ::testing::Test, protected testing::Daemons {
 protected:
  std::string daemon_dir() const override { return dir_.path(); }

  ~RobustnessTest() override { StopDaemons(); }

  // A worker daemon (Daemons::StartWorker) with `slots` whose ranks run `trainer`, under
  // output_roots_; `extra` flags last.
  void StartWorker(const std::string& name, int slots, const std::string& trainer,
                   const std::vector<std::string>& extra = {}) {
    std::vector<std::string> flags = {"--slots", absl::StrCat(slots), "--kill_grace", "2s"};
    if (!output_roots_.empty()) flags.insert(flags.end(), {"--output_roots", output_roots_});
    flags.insert(flags.end(), extra.begin(), extra.end());
    Daemons::StartWorker(name, trainer, flags);
  }
  std::string WorkDir(const std::string& name) { return dir_.path() + "/work-" + name; }

  // An executable /bin/sh rank program.
  std::string Script(const std::string& name, const std::string& body) {
    const std::string path = dir_.Write(name, "#!/bin/sh\n" + body);
    chmod(path.c_str(), 0755);
    return path;
  }

  std::string NodeState(const std::string& name) {
    auto nodes = client_->ListNodes();
    if (!nodes.ok()) return "";
    for (const auto& n : nodes->nodes()) {
      if (n.name() == name) return n.state();
    }
    return "";
  }
  bool NodeReady(const std::string& name) { return NodeState(name) == "ready"; }

  // Submits a job whose ranks are the worker's --trainer; `extra` is merged into the spec.
  std::string Submit(const std::string& name, const nlohmann::json& extra = {}) {
    nlohmann::json spec = {{"kind", "sft"},
                           {"name", name},
                           {"model_name_or_path", "tiny"},
                           {"data_path", dir_.path() + "/data"},
                           {"output_dir", dir_.path() + "/out-" + name},
                           {"resources", {{"nodes", 1}, {"slots_per_node", 1}}}};
    if (extra.is_object()) spec.update(extra);
    RunResult r = testing::Run(
        {TRAINCTL_CLI_BIN, "submit", dir_.Write(name + ".json", spec.dump()), "-o", "json"},
        {{"TRAINCTL_COORDINATOR", address_}});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    return j.is_object() && j.contains("id") ? j["id"].get<std::string>() : "";
  }

  testing::TempDir dir_;
  std::string output_roots_ = dir_.path();  // --output_roots of the workers; "" = their default
};

// A raw WorkerService session, as any client on the network can open one. Every read gives up
// after 30 s, so a test never hangs on a silent coordinator.
class RawSession {
 public:
  explicit RawSession(const std::string& address)
      : stub_(trainctl::v1::WorkerService::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    stream_ = stub_->Session(&context_);
  }
  bool Send(const trainctl::v1::WorkerMessage& m) { return stream_->Write(m); }
  // The next message from the coordinator; false once the stream has ended (Finish says why).
  bool Next(trainctl::v1::CoordinatorMessage* m) { return stream_->Read(m); }
  // The next message that is not an Ack.
  bool NextNonAck(trainctl::v1::CoordinatorMessage* m) {
    while (Next(m)) {
      if (!m->has_ack()) return true;
    }
    return false;
  }
  grpc::Status Finish() {
    stream_->WritesDone();
    return stream_->Finish();
  }

 private:
  std::unique_ptr<trainctl::v1::WorkerService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<trainctl::v1::WorkerMessage, trainctl::v1::CoordinatorMessage>>
      stream_;
};

inline trainctl::v1::WorkerMessage Register(const std::string& name, int slots,
                                            const std::string& boot,
                                            const std::string& address = "127.0.0.1") {
  trainctl::v1::WorkerMessage m;
  trainctl::v1::RegisterWorker* reg = m.mutable_register_();
  reg->set_node_name(name);
  reg->set_advertise_addr(address);
  reg->mutable_resources()->set_cpu_slots(slots);
  reg->set_boot_id(boot);
  return m;
}

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_INTEGRATION_ROBUSTNESS_FIXTURE_H_
