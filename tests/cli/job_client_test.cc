// JobClient over several coordinator addresses (cli/job_client.h): the call goes to the one that
// takes the connection, the one that answered last in the process first; an address that takes
// none is passed over, but a coordinator's own answer, UNAVAILABLE included, is final. In-process
// JobServices on loopback stand in for the coordinators.
#include "cli/job_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "trainctl/v1/job.grpc.pb.h"

namespace trainctl::cli {
namespace {

namespace v1 = trainctl::v1;

// Answers ListJobs with one job named after itself, or with UNAVAILABLE (as a coordinator whose
// store is down does); counts the calls.
class FakeCoordinator final : public v1::JobService::Service {
 public:
  FakeCoordinator(std::string name, bool store_down) : name_(std::move(name)), down_(store_down) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~FakeCoordinator() override { server_->Shutdown(); }

  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsResponse* response) override {
    ++calls_;
    if (down_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "job store: database is down");
    response->add_jobs()->set_id(name_);
    return grpc::Status::OK;
  }

  const std::string& address() const { return address_; }
  int calls() const { return calls_; }

 private:
  const std::string name_;
  const bool down_;
  std::atomic<int> calls_{0};
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

std::string Dead() { return absl::StrCat("127.0.0.1:", testing::FreeLoopbackPort()); }

// Which coordinator answered ListJobs through a client of `addresses`; the error otherwise.
std::string Answer(const std::vector<std::string>& addresses) {
  Connection connection = PlaintextConnection("");
  connection.addresses = addresses;
  JobClient client(connection, absl::Seconds(4));
  auto listed = client.List(v1::ListJobsRequest());
  if (!listed.ok()) return std::string(listed.status().ToString());
  return listed->jobs_size() == 1 ? listed->jobs(0).id() : "?";
}

TEST(JobClientTest, PassesOverAddressesThatTakeNoConnectionInEitherOrder) {
  FakeCoordinator live("live", false);
  EXPECT_EQ(Answer({Dead(), live.address()}), "live");
  EXPECT_EQ(Answer({live.address(), Dead()}), "live");
  EXPECT_EQ(Answer({Dead(), Dead(), live.address()}), "live");
  EXPECT_EQ(live.calls(), 3);
}

TEST(JobClientTest, TheCoordinatorThatAnsweredLastInTheProcessIsTriedFirst) {
  FakeCoordinator a("a", false), b("b", false);
  EXPECT_EQ(Answer({a.address(), b.address()}), "a");
  EXPECT_EQ(Answer({Dead(), b.address()}), "b");
  EXPECT_EQ(Answer({a.address(), b.address()}), "b") << "b answered last";
  EXPECT_EQ(Answer({a.address()}), "a");
  EXPECT_EQ(Answer({b.address(), a.address()}), "a") << "a answered last";
}

// The coordinator took the call and answered it: its answer stands; the next address never
// hears of the call.
TEST(JobClientTest, AnUnavailableAnsweredByACoordinatorIsReturnedAndNotRetriedElsewhere) {
  FakeCoordinator down("down", true), live("live", false);
  const std::string answer = Answer({down.address(), live.address()});
  EXPECT_TRUE(absl::StartsWith(answer, "UNAVAILABLE: ")) << answer;
  EXPECT_TRUE(absl::StrContains(answer, "job store: database is down")) << answer;
  EXPECT_EQ(down.calls(), 1);
  EXPECT_EQ(live.calls(), 0);
}

TEST(JobClientTest, NoneReachableIsOneErrorNamingEveryAddress) {
  const std::string first = Dead(), second = Dead();
  const absl::Time start = absl::Now();
  const std::string answer = Answer({first, second});
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "refused connections fail at once";
  EXPECT_TRUE(absl::StartsWith(answer, "UNAVAILABLE: cannot reach coordinator at " + first + ": "))
      << answer;
  EXPECT_TRUE(absl::StrContains(answer, "; nor at " + second + ": ")) << answer;
  EXPECT_TRUE(absl::StrContains(answer, "Connection refused")) << answer;
  EXPECT_EQ(answer.find('\n'), std::string::npos) << answer;
}

// Streams too go to the one that takes the connection.
TEST(JobClientTest, WatchConnectsToTheFirstAddressThatAccepts) {
  FakeCoordinator live("live", false);
  Connection connection = PlaintextConnection(Dead());
  connection.addresses.push_back(live.address());
  JobClient client(connection, absl::Seconds(4));
  v1::WatchJobRequest request;
  request.set_id("job-1");
  // The fake does not implement WatchJob: UNIMPLEMENTED is the live coordinator's own answer.
  const absl::Status watched = client.Watch(request, [](const v1::JobEvent&) {});
  EXPECT_EQ(watched.code(), absl::StatusCode::kUnimplemented) << watched;
}

}  // namespace
}  // namespace trainctl::cli
