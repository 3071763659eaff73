#include "coordinator/job_state.h"

#include <set>
#include <utility>

#include "gtest/gtest.h"

namespace trainctl {
namespace {

using trainctl::v1::JobState;

constexpr JobState kAll[] = {
    trainctl::v1::JOB_STATE_UNSPECIFIED, trainctl::v1::JOB_STATE_PENDING,
    trainctl::v1::JOB_STATE_SCHEDULED,   trainctl::v1::JOB_STATE_RUNNING,
    trainctl::v1::JOB_STATE_SUCCEEDED,   trainctl::v1::JOB_STATE_FAILED,
    trainctl::v1::JOB_STATE_CANCELLED,   trainctl::v1::JOB_STATE_RESTARTING,
};

// The whole legal table, written out independently of the implementation.
const std::set<std::pair<JobState, JobState>>& Legal() {
  using namespace trainctl::v1;  // NOLINT: the table reads better with bare names
  static const auto* legal = new std::set<std::pair<JobState, JobState>>{
      {JOB_STATE_PENDING, JOB_STATE_SCHEDULED},    {JOB_STATE_PENDING, JOB_STATE_CANCELLED},
      {JOB_STATE_PENDING, JOB_STATE_FAILED},       {JOB_STATE_SCHEDULED, JOB_STATE_RUNNING},
      {JOB_STATE_SCHEDULED, JOB_STATE_RESTARTING}, {JOB_STATE_SCHEDULED, JOB_STATE_FAILED},
      {JOB_STATE_SCHEDULED, JOB_STATE_CANCELLED},  {JOB_STATE_RUNNING, JOB_STATE_SUCCEEDED},
      {JOB_STATE_RUNNING, JOB_STATE_FAILED},       {JOB_STATE_RUNNING, JOB_STATE_CANCELLED},
      {JOB_STATE_RUNNING, JOB_STATE_RESTARTING},   {JOB_STATE_RUNNING, JOB_STATE_PENDING},
      {JOB_STATE_RESTARTING, JOB_STATE_SCHEDULED}, {JOB_STATE_RESTARTING, JOB_STATE_FAILED},
      {JOB_STATE_RESTARTING, JOB_STATE_CANCELLED},
  };
  return *legal;
}

TEST(JobStateTest, EveryPairFollowsTheTable) {
  int legal_count = 0;
  for (JobState from : kAll) {
    for (JobState to : kAll) {
      const absl::Status s = CheckTransition(from, to);
      const bool expected = Legal().count({from, to}) > 0;
      EXPECT_EQ(s.ok(), expected) << JobStateName(from) << " -> " << JobStateName(to);
      if (!s.ok()) {
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_NE(s.message().find(JobStateName(to)), absl::string_view::npos) << s.message();
      }
      legal_count += s.ok();
    }
  }
  EXPECT_EQ(legal_count, 15);
}

TEST(JobStateTest, TerminalStatesAreFinal) {
  for (JobState s : {trainctl::v1::JOB_STATE_SUCCEEDED, trainctl::v1::JOB_STATE_FAILED,
                     trainctl::v1::JOB_STATE_CANCELLED}) {
    EXPECT_TRUE(IsTerminal(s));
    for (JobState to : kAll) EXPECT_FALSE(CheckTransition(s, to).ok());
  }
  EXPECT_FALSE(IsTerminal(trainctl::v1::JOB_STATE_RESTARTING));
  EXPECT_FALSE(IsTerminal(trainctl::v1::JOB_STATE_RUNNING));
}

TEST(JobStateTest, MessagesNameBothStates) {
  EXPECT_EQ(
      CheckTransition(trainctl::v1::JOB_STATE_SCHEDULED, trainctl::v1::JOB_STATE_PENDING).message(),
      "illegal job state transition scheduled -> pending");
  EXPECT_EQ(
      CheckTransition(trainctl::v1::JOB_STATE_SUCCEEDED, trainctl::v1::JOB_STATE_RUNNING).message(),
      "job already succeeded; cannot move to running");
}

}  // namespace
}  // namespace trainctl
