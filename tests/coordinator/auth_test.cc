// The coordinator's TLS and authorization on a real gRPC server on loopback: JobService and
// WorkerService (over a real Cluster and an in-memory store) behind server credentials with client
// certificates, and a tokens file with one holder per role. The PKI is made with the openssl
// command (tests/testing/test_pki.h); clients are trainctl's JobClient and raw worker sessions.
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/job_client.h"
#include "common/access_tokens.h"
#include "common/clock.h"
#include "common/credentials.h"
#include "coordinator/cluster.h"
#include "coordinator/in_memory_job_store.h"
#include "coordinator/job_service.h"
#include "coordinator/rpc_authorizer.h"
#include "coordinator/worker_service.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "tests/testing/grpc_probe.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/test_pki.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;
using testing::CertFiles;

// Each holder's token (the file keeps their hashes).
const std::map<std::string, std::string>& Tokens() {
  static const auto* tokens = new std::map<std::string, std::string>{{"admin", "tok-admin-0f3c"},
                                                                     {"alice", "tok-alice-77ab"},
                                                                     {"bob", "tok-bob-1d2e"},
                                                                     {"vera", "tok-vera-5a5a"},
                                                                     {"node-a", "tok-node-a-9e1"}};
  return *tokens;
}
// The holder who has each role in the matrix.
const std::map<std::string, std::string>& HolderOfRole() {
  static const auto* holders = new std::map<std::string, std::string>{
      {"admin", "admin"}, {"user", "alice"}, {"viewer", "vera"}, {"worker", "node-a"}};
  return *holders;
}

std::string TokensFile() {
  return absl::StrCat("# subject role sha256\n",                              //
                      "admin admin ", Sha256Hex(Tokens().at("admin")), "\n",  //
                      "alice user ", Sha256Hex(Tokens().at("alice")), "\n",   //
                      "bob user ", Sha256Hex(Tokens().at("bob")), "\n",       //
                      "vera viewer ", Sha256Hex(Tokens().at("vera")), "\n",   //
                      "node-a worker ", Sha256Hex(Tokens().at("node-a")), "\n");
}

v1::SubmitJobRequest TinyJob(const std::string& name) {
  v1::SubmitJobRequest request;
  v1::JobSpec* spec = request.mutable_spec();
  spec->set_name(name);
  spec->set_kind(v1::JOB_KIND_SFT);
  spec->set_model_name_or_path("tiny");
  spec->set_data_path("/data");
  spec->set_output_dir("/out");
  return request;
}

JobServiceOptions AuthorizedBy(const RpcAuthorizer* authorizer) {
  JobServiceOptions options;
  options.authorizer = authorizer;
  return options;
}

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    jobs_.AddObserver(&notifier_);
    auto pki = testing::TestPki::Create(dir_.path());
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = std::make_unique<testing::TestPki>(*std::move(pki));
    auto server = pki_->Server();
    ASSERT_TRUE(server.ok()) << server.status();
    for (const char* name : {"node-a", "node-b"}) {
      auto cert = pki_->Client(name);
      ASSERT_TRUE(cert.ok()) << cert.status();
      certs_[name] = *cert;
    }
    auto expired = pki_->Client("node-a", /*expired=*/true);
    ASSERT_TRUE(expired.ok()) << expired.status();
    certs_["expired"] = *expired;

    AuthorizerOptions options;
    auto tokens = TokenTable::Parse(TokensFile(), "tokens");
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    options.tokens = *std::move(tokens);
    options.client_certificates = true;
    authorizer_ = std::make_unique<RpcAuthorizer>(std::move(options));
    job_service_ = std::make_unique<JobServiceImpl>(&jobs_, &notifier_, &executor_,
                                                    AuthorizedBy(authorizer_.get()));
    worker_service_ = std::make_unique<WorkerServiceImpl>(&cluster_, authorizer_.get());
    ASSERT_TRUE(cluster_.Start().ok());

    TlsOptions tls{server->cert, server->key, pki_->ca(), false};
    auto credentials = MakeServerCredentials(tls);
    ASSERT_TRUE(credentials.ok()) << credentials.status();
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *credentials, &port_);
    builder.RegisterService(job_service_.get());
    builder.RegisterService(worker_service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port_, 0);
    address_ = absl::StrCat("127.0.0.1:", port_);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    cluster_.Stop();
  }

  // TLS verifying the server against the test CA, presenting `cert` ("" none).
  std::shared_ptr<grpc::ChannelCredentials> Tls(const std::string& cert = "") {
    TlsOptions tls;
    tls.ca = pki_->ca();
    if (!cert.empty()) {
      tls.cert = certs_.at(cert).cert;
      tls.key = certs_.at(cert).key;
    }
    auto credentials = MakeChannelCredentials(tls);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return credentials.ok() ? *credentials : nullptr;
  }

  // A client of `holder` ("" no token) over TLS, presenting `cert` ("" none).
  std::unique_ptr<cli::JobClient> Client(const std::string& holder, const std::string& cert = "") {
    cli::Connection c;
    c.addresses = {address_};
    c.credentials = Tls(cert);
    if (!holder.empty()) c.token = Tokens().at(holder);
    return std::make_unique<cli::JobClient>(std::move(c));
  }

  // A worker session of `holder` ("" no token) presenting `cert` ("" none) that registers
  // `node`: OK once the coordinator answers `registered`, else the status it ended the stream
  // with.
  absl::Status Session(const std::string& holder, const std::string& cert,
                       const std::string& node) {
    auto channel = grpc::CreateChannel(address_, Tls(cert));
    auto stub = v1::WorkerService::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    if (!holder.empty()) context.AddMetadata("authorization", "Bearer " + Tokens().at(holder));
    auto stream = stub->Session(&context);
    v1::WorkerMessage hello;
    v1::RegisterWorker* reg = hello.mutable_register_();
    reg->set_node_name(node);
    reg->set_advertise_addr("127.0.0.1");
    reg->mutable_resources()->set_cpu_slots(1);
    // One boot id for all: each session is the same worker process reconnecting, so a live
    // session under the name does not refuse the next.
    reg->set_boot_id("auth-test-boot");
    stream->Write(hello);
    v1::CoordinatorMessage reply;
    const bool registered = stream->Read(&reply) && reply.has_registered();
    if (registered) context.TryCancel();
    const grpc::Status status = stream->Finish();
    if (registered) return absl::OkStatus();
    if (status.ok()) return absl::UnknownError("session ended without registering");
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::TestPki> pki_;
  std::map<std::string, CertFiles> certs_;
  std::unique_ptr<RpcAuthorizer> authorizer_;
  InMemoryJobStore store_;
  RealClock clock_;
  JobNotifier notifier_;
  JobManager jobs_{&store_, &clock_};
  ThreadPool executor_{2};
  std::unique_ptr<JobServiceImpl> job_service_;
  Cluster cluster_{&jobs_, &clock_, ClusterOptions()};
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  int port_ = 0;
  std::string address_;
  std::unique_ptr<grpc::Server> server_;
};

// Every method either gets past authorization (any status but UNAUTHENTICATED and
// PERMISSION_DENIED) or is PERMISSION_DENIED, by role, as the table says.
TEST_F(AuthTest, RoleByMethodMatrix) {
  const std::vector<std::string> methods = {"SubmitJob", "GetJob",     "ListJobs",
                                            "CancelJob", "WatchJob",   "StreamLogs",
                                            "ListNodes", "GetMetrics", "Session"};
  const std::map<std::string, std::set<std::string>> allowed = {
      {"admin", {methods.begin(), methods.end()}},
      {"user",
       {"SubmitJob", "GetJob", "ListJobs", "CancelJob", "WatchJob", "StreamLogs", "ListNodes",
        "GetMetrics"}},
      {"viewer", {"GetJob", "ListJobs", "WatchJob", "StreamLogs", "ListNodes", "GetMetrics"}},
      {"worker", {"Session"}},
  };
  for (const auto& [role, holder] : HolderOfRole()) {
    auto client = Client(holder);
    // A job of the caller's own where it may submit, so that a user's cancel is of its own job.
    auto own = Client(role == "user" ? holder : "admin")->Submit(TinyJob(role));
    ASSERT_TRUE(own.ok()) << own.status();
    const std::string id = own->job().id();
    for (const std::string& method : methods) {
      absl::Status status;
      if (method == "SubmitJob") {
        status = client->Submit(TinyJob("m")).status();
      } else if (method == "GetJob") {
        status = client->Get(id).status();
      } else if (method == "ListJobs") {
        status = client->List(v1::ListJobsRequest()).status();
      } else if (method == "CancelJob") {
        status = client->Cancel(id, "matrix").status();
      } else if (method == "WatchJob") {
        v1::WatchJobRequest request;
        request.set_id(id);
        request.set_replay_only(true);
        status = client->Watch(request, [](const v1::JobEvent&) {});
      } else if (method == "StreamLogs") {
        v1::StreamLogsRequest request;
        request.set_id(id);
        status = client->Logs(request, [](const v1::LogLine&) {});
      } else if (method == "ListNodes") {
        status = client->ListNodes().status();
      } else if (method == "GetMetrics") {
        v1::GetMetricsRequest request;
        request.set_id(id);
        status = client->GetMetrics(request).status();
      } else {
        // With a certificate for node-a, so only the role decides.
        status = Session(holder, "node-a", "node-a");
      }
      SCOPED_TRACE(absl::StrCat(role, " ", method, ": ", status.ToString()));
      if (allowed.at(role).count(method) > 0) {
        EXPECT_NE(status.code(), absl::StatusCode::kPermissionDenied);
        EXPECT_NE(status.code(), absl::StatusCode::kUnauthenticated);
        // Past authorization: a fresh job has no metrics, this server lists no nodes.
        if (method != "GetMetrics" && method != "ListNodes") {
          EXPECT_TRUE(status.ok());
        }
      } else {
        EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
        EXPECT_TRUE(absl::StrContains(status.message(), "role " + role));
        EXPECT_TRUE(absl::StrContains(status.message(), method));
      }
    }
  }
}

TEST_F(AuthTest, EveryMethodOfTheProtosHasARule) {
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  for (const char* name : {"trainctl.v1.JobService", "trainctl.v1.WorkerService"}) {
    const google::protobuf::ServiceDescriptor* service = pool->FindServiceByName(name);
    ASSERT_NE(service, nullptr) << name;
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string method = absl::StrCat(service->name(), "/", service->method(i)->name());
      EXPECT_NE(RpcAuthorizer::AllowedRoles(method), nullptr) << method << " has no access rule";
    }
  }
  EXPECT_EQ(RpcAuthorizer::AllowedRoles("JobService/NoSuchMethod"), nullptr);
}

TEST_F(AuthTest, AUserCancelsOnlyItsOwnJobsAndJobsRecordTheirOwner) {
  auto alice = Client("alice");
  auto bob = Client("bob");
  auto submitted = alice->Submit(TinyJob("alices"));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->job().id();
  EXPECT_EQ(submitted->job().owner(), "alice");
  auto cancelled = bob->Cancel(id, "not mine");
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kPermissionDenied) << cancelled.status();
  EXPECT_TRUE(absl::StrContains(cancelled.status().message(), "belongs to alice"))
      << cancelled.status();
  auto job = bob->Get(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->owner(), "alice");
  EXPECT_EQ(job->state(), v1::JOB_STATE_PENDING) << "bob's cancel changed nothing";
  EXPECT_TRUE(alice->Cancel(id, "mine").ok());
  // An admin cancels anyone's.
  auto other = alice->Submit(TinyJob("alices-2"));
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(Client("admin")->Cancel(other->job().id(), "admin").ok());
}

// Issue 24: a request_id is its submitter's. bob resubmitting with alice's key used to get alice's
// job back and no job of his own.
TEST_F(AuthTest, RequestIdsAreScopedToTheirSubmitter) {
  v1::SubmitJobRequest request = TinyJob("keyed");
  request.set_request_id("retry-42");
  auto alices = Client("alice")->Submit(request);
  ASSERT_TRUE(alices.ok()) << alices.status();
  auto again = Client("alice")->Submit(request);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->job().id(), alices->job().id()) << "alice's retry is idempotent";
  auto bobs = Client("bob")->Submit(request);
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  EXPECT_NE(bobs->job().id(), alices->job().id());
  EXPECT_EQ(bobs->job().owner(), "bob");
  auto bob_again = Client("bob")->Submit(request);
  ASSERT_TRUE(bob_again.ok()) << bob_again.status();
  EXPECT_EQ(bob_again->job().id(), bobs->job().id());
}

TEST_F(AuthTest, AWorkerTokenCannotSubmit) {
  auto status = Client("node-a", "node-a")->Submit(TinyJob("w")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "role worker (node-a)")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "JobService/SubmitJob")) << status;
}

TEST_F(AuthTest, MissingOrWrongTokenIsUnauthenticatedSayingWhatIsMissing) {
  auto none = Client("")->List(v1::ListJobsRequest()).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kUnauthenticated) << none;
  EXPECT_TRUE(absl::StrContains(none.message(), "needs a bearer token")) << none;
  EXPECT_TRUE(absl::StrContains(none.message(), "TRAINCTL_TOKEN")) << none;

  cli::Connection wrong;
  wrong.addresses = {address_};
  wrong.credentials = Tls();
  wrong.token = "not-a-listed-token";
  auto bad = cli::JobClient(wrong).List(v1::ListJobsRequest()).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kUnauthenticated) << bad;
  EXPECT_TRUE(absl::StrContains(bad.message(), "not one the coordinator's tokens file lists"));

  // Streams too, and a session without a token.
  v1::WatchJobRequest watch;
  watch.set_id("job-1");
  auto stream = Client("")->Watch(watch, [](const v1::JobEvent&) {});
  EXPECT_EQ(stream.code(), absl::StatusCode::kUnauthenticated) << stream;
  auto session = Session("", "node-a", "node-a");
  EXPECT_EQ(session.code(), absl::StatusCode::kUnauthenticated) << session;
}

// What SIGHUP does in the coordinator (coordinator_main.cc): the next call sees the new table.
TEST_F(AuthTest, ReplacedTokensDecideTheCallsThatFollow) {
  ASSERT_TRUE(Client("bob")->List(v1::ListJobsRequest()).ok());
  ASSERT_TRUE(Client("alice")->Submit(TinyJob("before")).ok());
  // bob revoked, alice now a viewer, the rest unchanged.
  auto tokens =
      TokenTable::Parse(absl::StrCat("admin admin ", Sha256Hex(Tokens().at("admin")), "\n",  //
                                     "alice viewer ", Sha256Hex(Tokens().at("alice")), "\n"),
                        "tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_TRUE(authorizer_->ReplaceTokens(*std::move(tokens)).ok());
  auto bob = Client("bob")->List(v1::ListJobsRequest()).status();
  EXPECT_EQ(bob.code(), absl::StatusCode::kUnauthenticated) << bob;
  auto alice = Client("alice")->Submit(TinyJob("after")).status();
  EXPECT_EQ(alice.code(), absl::StatusCode::kPermissionDenied) << alice;
  EXPECT_TRUE(absl::StrContains(alice.message(), "role viewer (alice)")) << alice;
  EXPECT_TRUE(Client("alice")->List(v1::ListJobsRequest()).ok());
  EXPECT_TRUE(Client("admin")->Submit(TinyJob("admin")).ok());
}

TEST_F(AuthTest, HealthNeedsNoTokenNorClientCertificate) {
  auto serving = testing::HealthServing(address_, Tls());
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
}

TEST_F(AuthTest, PlaintextClientAgainstTheTlsServerFailsFastWithUnavailable) {
  cli::JobClient plaintext(address_, absl::Seconds(5));
  const absl::Time start = absl::Now();
  auto status = plaintext.List(v1::ListJobsRequest()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(6)) << "bounded by the client's deadline";
}

TEST_F(AuthTest, AnExpiredClientCertificateIsRejectedAtTheHandshake) {
  auto expired = Client("admin", "expired")->List(v1::ListJobsRequest()).status();
  EXPECT_EQ(expired.code(), absl::StatusCode::kUnavailable) << expired;
  EXPECT_TRUE(Client("admin", "node-a")->List(v1::ListJobsRequest()).ok())
      << "the same holder with a valid certificate gets in";
  EXPECT_EQ(Session("node-a", "expired", "node-a").code(), absl::StatusCode::kUnavailable);
}

TEST_F(AuthTest, AWorkerRegistersOnlyUnderItsCertificatesName) {
  EXPECT_TRUE(Session("node-a", "node-a", "node-a").ok());
  auto impostor = Session("node-a", "node-b", "node-a");
  EXPECT_EQ(impostor.code(), absl::StatusCode::kPermissionDenied) << impostor;
  EXPECT_TRUE(absl::StrContains(impostor.message(), "node 'node-a'")) << impostor;
  EXPECT_TRUE(absl::StrContains(impostor.message(), "holds node-b")) << impostor;
  // No certificate at all: refused before it can register anything.
  auto anonymous = Session("node-a", "", "node-a");
  EXPECT_EQ(anonymous.code(), absl::StatusCode::kUnauthenticated) << anonymous;
  EXPECT_TRUE(absl::StrContains(anonymous.message(), "client certificate")) << anonymous;
}

// --tls_require_client_cert: the handshake itself refuses a client without a certificate (health
// probes included); one signed by the CA passes.
TEST_F(AuthTest, RequiredClientCertificatesAreDemandedAtTheHandshake) {
  auto server = pki_->Server();
  ASSERT_TRUE(server.ok()) << server.status();
  auto credentials = MakeServerCredentials({server->cert, server->key, pki_->ca(), true});
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  JobServiceImpl service(&jobs_, &notifier_, &executor_, AuthorizedBy(authorizer_.get()));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", *credentials, &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> strict = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto without = testing::HealthServing(address, Tls());
  EXPECT_EQ(without.status().code(), absl::StatusCode::kUnavailable) << without.status();
  auto with = testing::HealthServing(address, Tls("node-a"));
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_TRUE(*with);
  // The CLI with TLS on but no certificate hears only that the socket closed: it says why that
  // likely is, and what to give.
  cli::Connection c;
  c.addresses = {address};
  c.tls.ca = pki_->ca();
  c.credentials = Tls();
  auto refused = cli::JobClient(std::move(c)).List(v1::ListJobsRequest()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_TRUE(
      absl::StrContains(refused.message(), "this coordinator may require a client certificate"))
      << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "--tls_cert")) << refused;
  {
    cli::Connection streaming;
    streaming.addresses = {address};
    streaming.tls.ca = pki_->ca();
    streaming.credentials = Tls();
    v1::StreamLogsRequest logs;
    logs.set_id("job-1");
    auto stream = cli::JobClient(std::move(streaming)).Logs(logs, [](const v1::LogLine&) {});
    EXPECT_TRUE(
        absl::StrContains(stream.message(), "this coordinator may require a client certificate"))
        << stream;
  }
  strict->Shutdown();
  // Nothing listening: the same client is not told about certificates.
  cli::Connection gone;
  gone.addresses = {address};
  gone.tls.ca = pki_->ca();
  gone.credentials = Tls();
  auto unreachable = cli::JobClient(std::move(gone)).List(v1::ListJobsRequest()).status();
  EXPECT_EQ(unreachable.code(), absl::StatusCode::kUnavailable) << unreachable;
  EXPECT_FALSE(absl::StrContains(unreachable.message(), "client certificate")) << unreachable;
}

// Without a tokens file nor client certificates, everything is allowed as before issue 15.
TEST(AuthOffTest, EverythingIsAllowedAndJobsHaveNoOwner) {
  InMemoryJobStore store;
  RealClock clock;
  JobNotifier notifier;
  JobManager jobs(&store, &clock);
  jobs.AddObserver(&notifier);
  ThreadPool executor(1);
  RpcAuthorizer open;
  JobServiceImpl service(&jobs, &notifier, &executor, AuthorizedBy(&open));
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  cli::JobClient client(absl::StrCat("127.0.0.1:", port));
  auto submitted = client.Submit(TinyJob("open"));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_EQ(submitted->job().owner(), "");
  EXPECT_TRUE(client.Cancel(submitted->job().id(), "").ok());
  server->Shutdown();
  // A reload cannot turn authentication on: that takes a restart with --tokens_file.
  auto tokens = TokenTable::Parse(absl::StrCat("admin admin ", Sha256Hex("t"), "\n"), "tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(open.ReplaceTokens(*std::move(tokens)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(open.tokens_on());
}

}  // namespace
}  // namespace trainctl
