// JobDiagnoser over a real store's events, and trainctl_job_findings following a running job.
#include "coordinator/diagnosis_metrics.h"

#include <string>

#include "coordinator/in_memory_job_store.h"
#include "coordinator/job_diagnoser.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

class DiagnosisMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Job job;
    job.mutable_spec()->set_name("sft-7b");
    job.mutable_spec()->mutable_resources()->set_slots_per_node(2);
    job.set_state(v1::JOB_STATE_PENDING);
    auto created = store_.CreateJob(job, "", {});
    ASSERT_TRUE(created.ok()) << created.status();
    id_ = created->job.id();
  }

  // Appends events (text-format JobEvent payloads) and sets the job's state and nodes.
  void Append(const std::vector<std::string>& events, v1::JobState state) {
    auto updated = store_.UpdateJob(
        id_,
        [&](Job* job, std::vector<JobEvent>* added) {
          job->set_state(state);
          job->clear_nodes();
          job->add_nodes("node-a");
          job->add_nodes("node-b");
          for (const std::string& text : events) {
            JobEvent e;
            if (!google::protobuf::TextFormat::ParseFromString(text, &e)) {
              return absl::InvalidArgumentError(text);
            }
            added->push_back(std::move(e));
          }
          return absl::OkStatus();
        },
        nullptr);
    ASSERT_TRUE(updated.ok()) << updated.status();
  }

  static absl::StatusOr<std::optional<v1::NodeTopology>> Topology(const std::string& node) {
    if (node == "node-b") return std::nullopt;  // its worker never sent one
    v1::NodeTopology t;
    v1::RdmaPort* port = t.add_rdma_ports();
    port->set_device("mlx5_0");
    port->set_port(1);
    port->set_state("ACTIVE");
    port->set_rate_gbps(400);
    return t;
  }

  InMemoryJobStore store_;
  std::string id_;
  JobDiagnoser diagnoser_{&store_, &DiagnosisMetricsTest::Topology};
};

TEST_F(DiagnosisMetricsTest, DiagnosisReadsTheLatestAttemptsReports) {
  Append({"state_change { from: JOB_STATE_SCHEDULED to: JOB_STATE_RUNNING }",
          "nccl { rank: 3 host: 'node-b' ib_disabled: true }"},
         v1::JOB_STATE_RUNNING);
  Append({"state_change { from: JOB_STATE_RUNNING to: JOB_STATE_RUNNING attempt: 1 }",
          "nccl { rank: 0 host: 'node-a' ib_disabled: true nnodes: 2 }",
          "bandwidth { backend: 'gloo' world_size: 4 }"},
         v1::JOB_STATE_RUNNING);
  auto d = diagnoser_.Diagnose(id_);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->nodes_size(), 2);
  EXPECT_EQ(d->nodes(0).node(), "node-a");
  EXPECT_EQ(d->nodes(1).probe_errors(0), "the node's worker has sent no topology");
  ASSERT_EQ(d->nccl_size(), 1);  // rank 3's report was the first attempt's
  EXPECT_EQ(d->nccl(0).rank(), 0);
  EXPECT_EQ(d->bandwidth().world_size(), 4);
  ASSERT_EQ(d->findings_size(), 1);
  EXPECT_EQ(d->findings(0).rule(), "ib_disabled_with_active_ports");
  EXPECT_EQ(d->findings(0).node(), "node-a");
  EXPECT_EQ(diagnoser_.Diagnose("999").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DiagnosisMetricsTest, FindingsFollowTheRunningJob) {
  metrics::Registry registry;
  DiagnosisMetrics metrics(&registry, &store_, &diagnoser_);
  const std::string series = "trainctl_job_findings{job=\"" + id_ +
                             "\",name=\"sft-7b\",rule=\"ib_disabled_with_active_ports\","
                             "severity=\"critical\"} 1";
  Append({"state_change { from: JOB_STATE_SCHEDULED to: JOB_STATE_RUNNING }"},
         v1::JOB_STATE_RUNNING);
  EXPECT_EQ(registry.Render().find("trainctl_job_findings{"), std::string::npos);
  Append({"nccl { rank: 1 host: 'node-a' ib_disabled: true nnodes: 2 }"}, v1::JOB_STATE_RUNNING);
  EXPECT_NE(registry.Render().find(series), std::string::npos) << registry.Render();
  // A new attempt whose reports are clean clears it; the job's end drops its series.
  Append({"state_change { from: JOB_STATE_RUNNING to: JOB_STATE_RUNNING attempt: 1 }",
          "nccl { rank: 1 host: 'node-a' nnodes: 2 }"},
         v1::JOB_STATE_RUNNING);
  EXPECT_EQ(registry.Render().find(series), std::string::npos);
  Append({"nccl { rank: 0 host: 'node-a' ib_disabled: true nnodes: 2 }"}, v1::JOB_STATE_RUNNING);
  EXPECT_NE(registry.Render().find(series), std::string::npos);
  Append({}, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(registry.Render().find("trainctl_job_findings{"), std::string::npos);
}

}  // namespace
}  // namespace trainctl
