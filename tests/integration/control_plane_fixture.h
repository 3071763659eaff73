// The control plane as users run it: the real trainctl-coordinator binary on a loopback port over
// a real database, driven by the real trainctl binary (and, for load, by concurrent gRPC clients).
// Shared by control_plane_test.cc (SQLite) and postgres_control_plane_test.cc (PostgreSQL).
#ifndef TRAINCTL_TESTS_INTEGRATION_CONTROL_PLANE_FIXTURE_H_
#define TRAINCTL_TESTS_INTEGRATION_CONTROL_PLANE_FIXTURE_H_

#include <signal.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cli/job_client.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace trainctl::testing {

class ControlPlaneTest : public ::testing::Test {
 protected:
  // Starts the coordinator on a fresh port over the test's database; waits until it serves.
  void StartCoordinator() {
    const std::string ready = dir_.path() + "/ready";
    std::filesystem::remove(ready);
    coordinator_ =
        std::make_unique<Subprocess>(Argv({"--listen", "127.0.0.1:0", "--db", db_, "--ready_file",
                                           ready, "--log_level", "warning"}),
                                     dir_.path() + "/coordinator.log");
    ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(ready); }, absl::Seconds(30)))
        << testing::ReadFileOrEmpty(dir_.path() + "/coordinator.log");
    address_ = std::string(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(ready)));
  }

  // The coordinator's command line: `flags`, then extra_flags_.
  std::vector<std::string> Argv(std::vector<std::string> flags) const {
    flags.insert(flags.begin(), TRAINCTL_COORDINATOR_BIN);
    flags.insert(flags.end(), extra_flags_.begin(), extra_flags_.end());
    return flags;
  }

  RunResult Trainctl(std::vector<std::string> args, const std::string& cwd = "") {
    args.insert(args.begin(), TRAINCTL_CLI_BIN);
    return testing::Run(args, {{"TRAINCTL_COORDINATOR", address_}}, absl::Seconds(60), cwd);
  }

  std::string WriteSpec() {
    std::filesystem::copy_file(testing::kSeedDeepSpeedPath, dir_.path() + "/ds.json");
    return dir_.Write("job.yaml", R"(name: qwen2vl-r1
kind: sft
model_name_or_path: Qwen/Qwen2-VL-7B-Instruct
data_path: ./data/processed_multimodal
deepspeed: ds.json
output_dir: ./checkpoints/qwen2vl_r1
training:
  per_device_train_batch_size: 4
  gradient_accumulation_steps: 4
  learning_rate: 2e-5
  bf16: true
  tf32: true
  logging_steps: 10
  save_strategy: epoch
resources: {nodes: 1, slots_per_node: 8}
env: {NCCL_DEBUG: INFO, NCCL_IB_DISABLE: 0}
priority: 5
)");
  }

  // Submits from 8 concurrent clients, kill -9s the coordinator once 60 are acknowledged, starts
  // it again over the same database: every acknowledged job is there as acknowledged, and retrying
  // every submit with its request id completes the set without duplicating anything.
  void KillNineDuringConcurrentSubmitsLosesNoAcknowledgedJob() {
    StartCoordinator();
    constexpr int kClients = 8, kSubmits = 200;
    const std::string ds = testing::SeedDeepSpeedText();
    auto request_for = [&](int i) {
      trainctl::v1::SubmitJobRequest request;
      auto* spec = request.mutable_spec();
      spec->set_name(absl::StrCat("load-", i));
      spec->set_kind(trainctl::v1::JOB_KIND_SFT);
      spec->set_model_name_or_path("Qwen/Qwen2-VL-7B-Instruct");
      spec->set_data_path(absl::StrCat("/data/shard-", i));
      spec->set_output_dir(absl::StrCat("/out/", i));
      spec->set_deepspeed_config_json(ds);
      spec->mutable_training()->set_per_device_train_batch_size(4);
      spec->mutable_training()->set_gradient_accumulation_steps(4);
      spec->mutable_training()->set_bf16(true);
      spec->mutable_resources()->set_slots_per_node(8);
      (*spec->mutable_env())["TRAINCTL_TEST_SEQ"] = absl::StrCat(i);
      request.set_request_id(absl::StrCat("kill9-", i));
      return request;
    };

    std::mutex mu;
    std::map<int, trainctl::v1::Job> acked;  // submit index -> the job the coordinator acknowledged
    std::atomic<int> next{0}, acks{0};
    const std::string address = address_;
    std::vector<std::thread> clients;
    for (int c = 0; c < kClients; ++c) {
      clients.emplace_back([&] {
        cli::JobClient client(address, absl::Seconds(2));
        for (int i = next++; i < kSubmits; i = next++) {
          auto r = client.Submit(request_for(i));
          if (!r.ok()) continue;  // not acknowledged: may or may not exist
          ++acks;
          std::lock_guard<std::mutex> lock(mu);
          acked[i] = r->job();
        }
      });
    }
    ASSERT_TRUE(WaitFor([&] { return acks.load() >= 60; }, absl::Seconds(60)));
    coordinator_->Kill(SIGKILL);  // mid-flight: other submits are in the air
    ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
    for (auto& t : clients) t.join();
    ASSERT_GE(acked.size(), 60u);
    ASSERT_LT(acked.size(), static_cast<size_t>(kSubmits))
        << "the kill came too late to test anything";

    StartCoordinator();
    cli::JobClient client(address_);
    for (const auto& [i, job] : acked) {
      auto stored = client.Get(job.id());
      ASSERT_TRUE(stored.ok()) << "acknowledged job " << job.id() << " lost: " << stored.status();
      // The scheduler may have noted since why the job waits (no worker here): not the submit's.
      trainctl::v1::Job as_acked = *stored;
      as_acked.clear_message();
      as_acked.clear_update_time();
      trainctl::v1::Job expected = job;
      expected.clear_message();
      expected.clear_update_time();
      EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(as_acked, expected))
          << job.id();
    }
    // Retrying every submit with its request id completes the set without duplicating anything.
    for (int i = 0; i < kSubmits; ++i) {
      auto r = client.Submit(request_for(i));
      ASSERT_TRUE(r.ok()) << r.status();
      if (acked.count(i)) {
        EXPECT_FALSE(r->created());
        EXPECT_EQ(r->job().id(), acked[i].id());
      }
    }
    trainctl::v1::ListJobsRequest list;
    list.set_page_size(1000);
    auto all = client.List(list);
    ASSERT_TRUE(all.ok());
    EXPECT_EQ(all->jobs_size(), kSubmits);
  }

  testing::TempDir dir_;
  std::string db_ = dir_.path() + "/var/trainctl.db";  // a derived fixture may name another
  std::vector<std::string> extra_flags_;               // every coordinator's, last
  std::unique_ptr<Subprocess> coordinator_;
  std::string address_;
};

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_INTEGRATION_CONTROL_PLANE_FIXTURE_H_
