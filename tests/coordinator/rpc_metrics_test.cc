// The RPC latency interceptor on a real gRPC server (JobService on loopback, in-memory store),
// called through trainctl's client and a raw generic call to a method no proto defines.
#include "coordinator/rpc_metrics.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "cli/job_client.h"
#include "common/clock.h"
#include "coordinator/in_memory_job_store.h"
#include "coordinator/job_service.h"
#include "gtest/gtest.h"
#include "tests/testing/exposition.h"

namespace trainctl {
namespace {

using testing::SampleValue;

class RpcMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    jobs_.AddObserver(&notifier_);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(MakeRpcMetricsInterceptor(&registry_));
    builder.experimental().SetInterceptorCreators(std::move(creators));
    server_ = builder.BuildAndStart();
    ASSERT_NE(port_, 0);
    client_ = std::make_unique<cli::JobClient>(absl::StrCat("127.0.0.1:", port_));
  }
  void TearDown() override { server_->Shutdown(); }

  metrics::Registry registry_;
  InMemoryJobStore store_;
  RealClock clock_;
  JobNotifier notifier_;
  JobManager jobs_{&store_, &clock_};
  ThreadPool executor_{2};
  JobServiceImpl service_{&jobs_, &notifier_, &executor_};
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<cli::JobClient> client_;
};

TEST_F(RpcMetricsTest, UnaryCallsAreTimedByMethodAndCodeStreamsAreNot) {
  trainctl::v1::SubmitJobRequest submit;
  submit.mutable_spec()->set_name("a");
  submit.mutable_spec()->set_kind(trainctl::v1::JOB_KIND_SFT);
  submit.mutable_spec()->set_model_name_or_path("tiny");
  submit.mutable_spec()->set_data_path("/data");
  submit.mutable_spec()->set_output_dir("/out");
  auto created = client_->Submit(submit);
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_TRUE(client_->Submit(submit).ok());
  submit.mutable_spec()->clear_output_dir();
  EXPECT_EQ(client_->Submit(submit).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Get("job-404").status().code(), absl::StatusCode::kNotFound);
  trainctl::v1::WatchJobRequest watch;
  watch.set_id(created->job().id());
  watch.set_replay_only(true);
  ASSERT_TRUE(client_->Watch(watch, [](const trainctl::v1::JobEvent&) {}).ok());

  // A path no proto of this binary defines is counted under "other", not under its own name.
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  grpc::ClientContext context;
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;  // an empty message
  grpc::Status status;
  absl::Notification done;
  generic.UnaryCall(&context, "/trainctl.v1.JobService/Nope", grpc::StubOptions(), &request,
                    &response, [&](grpc::Status s) {
                      status = std::move(s);
                      done.Notify();
                    });
  done.WaitForNotification();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);

  const std::string text = registry_.Render();
  EXPECT_EQ(
      SampleValue(text, "trainctl_rpc_duration_seconds_count{code=\"OK\",method=\"SubmitJob\"}"),
      "2")
      << text;
  EXPECT_EQ(SampleValue(text, "trainctl_rpc_duration_seconds_count{code=\"" +
                                  std::string("INVALID_ARGUMENT") + "\",method=\"SubmitJob\"}"),
            "1");
  EXPECT_EQ(SampleValue(
                text, "trainctl_rpc_duration_seconds_count{code=\"NOT_FOUND\",method=\"GetJob\"}"),
            "1");
  EXPECT_EQ(SampleValue(text,
                        "trainctl_rpc_duration_seconds_bucket{code=\"OK\",method=\"SubmitJob\","
                        "le=\"+Inf\"}"),
            "2");
  EXPECT_FALSE(absl::StrContains(text, "WatchJob")) << text;
  EXPECT_FALSE(absl::StrContains(text, "Nope")) << text;
}

}  // namespace
}  // namespace trainctl
