#include "cli/job_client.h"

#include <algorithm>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/channel_connect.h"
#include "common/status_macros.h"

namespace trainctl::cli {
namespace {

// The address whose coordinator took the last connection in this process: the first one each
// client tries, so the commands of one process stay with the coordinator that leads.
absl::Mutex last_reached_mu(absl::kConstInit);
std::string& LastReached() ABSL_EXCLUSIVE_LOCKS_REQUIRED(last_reached_mu) {
  static std::string* const last = new std::string();
  return *last;
}

}  // namespace

using trainctl::v1::Job;

JobClient::JobClient(std::string address, absl::Duration connect_timeout)
    : JobClient(PlaintextConnection(std::move(address)), connect_timeout) {}

JobClient::JobClient(Connection connection, absl::Duration connect_timeout)
    : addresses_(std::move(connection.addresses)),
      token_(std::move(connection.token)),
      tls_without_cert_(connection.tls.enabled() && connection.tls.cert.empty()),
      connect_timeout_(connect_timeout) {
  grpc::ChannelArguments args;
  // Fail fast on refused connections rather than backing off for a minute.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(64 << 20);
  // One channel per address, each with the same credentials: TLS checks every coordinator's
  // certificate against its own address.
  for (const std::string& address : addresses_) {
    Coordinator c;
    c.channel = grpc::CreateCustomChannel(address, connection.credentials, args);
    c.stub = trainctl::v1::JobService::NewStub(c.channel);
    coordinators_.push_back(std::move(c));
  }
}

std::string JobClient::Why(const grpc::Status& status) const {
  // A server that demands a client certificate aborts the handshake; gRPC reports only the
  // closed socket. The client cannot tell that apart from other resets, hence "may".
  const std::string& message = status.error_message();
  const bool closed =
      absl::StrContains(message, "Socket closed") || absl::StrContains(message, "Connection reset");
  return absl::StrCat(
      message, tls_without_cert_ && closed
                   ? " (the server closed the TLS connection; this coordinator may require a "
                     "client certificate: give one with --tls_cert and --tls_key, or "
                     "TRAINCTL_TLS_CERT and TRAINCTL_TLS_KEY)"
                   : "");
}

absl::Status JobClient::Convert(const grpc::Status& status, size_t i) const {
  if (status.ok()) return absl::OkStatus();
  const auto code = status.error_code();
  if (code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach coordinator at ", addresses_[i], ": ", Why(status)));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), status.error_message());
}

void JobClient::Authorize(grpc::ClientContext* context) const {
  if (!token_.empty()) context->AddMetadata("authorization", "Bearer " + token_);
}

std::string JobClient::WhyFailed(size_t i) {
  grpc::ClientContext probe;
  probe.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  trainctl::v1::Job job;
  const grpc::Status s = coordinators_[i].stub->GetJob(&probe, trainctl::v1::GetJobRequest(), &job);
  // Anything else: it connected since (a coordinator that just took over); the next call uses it.
  if (s.error_code() != grpc::StatusCode::UNAVAILABLE) return "failed to connect";
  return Why(s);
}

absl::StatusOr<size_t> JobClient::Connect(absl::Time deadline) {
  size_t first = 0;
  {
    absl::MutexLock lock(&last_reached_mu);
    const auto it = std::find(addresses_.begin(), addresses_.end(), LastReached());
    if (it != addresses_.end()) first = static_cast<size_t>(it - addresses_.begin());
  }
  // The list rotated to start at `first`.
  std::vector<size_t> order;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (size_t k = 0; k < addresses_.size(); ++k) {
    order.push_back((first + k) % addresses_.size());
    channels.push_back(coordinators_[order.back()].channel);
  }
  const ChannelConnect connect = ConnectFirst(channels, deadline);
  if (connect.ready >= 0) {
    const size_t i = order[static_cast<size_t>(connect.ready)];
    absl::MutexLock lock(&last_reached_mu);
    LastReached() = addresses_[i];
    return i;
  }
  std::string message = "cannot reach coordinator at ";
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    const std::string why =
        connect.reach[k] == ChannelReach::kFailed
            ? WhyFailed(i)
            : absl::StrCat("no connection within ", absl::FormatDuration(connect_timeout_));
    absl::StrAppend(&message, k == 0 ? "" : "; nor at ", addresses_[i], ": ", why);
  }
  return absl::UnavailableError(message);
}

template <typename Request, typename Response>
absl::StatusOr<Response> JobClient::Unary(UnaryMethod<Request, Response> method,
                                          const Request& request) {
  const absl::Time deadline = absl::Now() + connect_timeout_;
  ASSIGN_OR_RETURN(const size_t i, Connect(deadline));
  grpc::ClientContext context;
  Authorize(&context);
  context.set_deadline(absl::ToChronoTime(deadline));
  Response response;
  const grpc::Status status = (coordinators_[i].stub.get()->*method)(&context, request, &response);
  if (auto s = Convert(status, i); !s.ok()) return s;
  return response;
}

absl::StatusOr<trainctl::v1::SubmitJobResponse> JobClient::Submit(
    const trainctl::v1::SubmitJobRequest& request) {
  return Unary(&trainctl::v1::JobService::Stub::SubmitJob, request);
}

absl::StatusOr<trainctl::v1::DiagnoseJobResponse> JobClient::Diagnose(const std::string& id) {
  trainctl::v1::DiagnoseJobRequest request;
  request.set_id(id);
  return Unary(&trainctl::v1::JobService::Stub::DiagnoseJob, request);
}

absl::StatusOr<trainctl::v1::GetMetricsResponse> JobClient::GetMetrics(
    const trainctl::v1::GetMetricsRequest& request) {
  return Unary(&trainctl::v1::JobService::Stub::GetMetrics, request);
}

absl::StatusOr<Job> JobClient::Get(const std::string& id) {
  trainctl::v1::GetJobRequest request;
  request.set_id(id);
  return Unary(&trainctl::v1::JobService::Stub::GetJob, request);
}

absl::StatusOr<trainctl::v1::ListJobsResponse> JobClient::List(
    const trainctl::v1::ListJobsRequest& request) {
  return Unary(&trainctl::v1::JobService::Stub::ListJobs, request);
}

absl::StatusOr<Job> JobClient::Cancel(const std::string& id, const std::string& reason) {
  trainctl::v1::CancelJobRequest request;
  request.set_id(id);
  request.set_reason(reason);
  return Unary(&trainctl::v1::JobService::Stub::CancelJob, request);
}

absl::StatusOr<trainctl::v1::ListNodesResponse> JobClient::ListNodes() {
  return Unary(&trainctl::v1::JobService::Stub::ListNodes, trainctl::v1::ListNodesRequest());
}

absl::StatusOr<trainctl::v1::ListNodesResponse> JobClient::ListNodes(
    const trainctl::v1::ListNodesRequest& request) {
  return Unary(&trainctl::v1::JobService::Stub::ListNodes, request);
}

absl::Status JobClient::Watch(const trainctl::v1::WatchJobRequest& request,
                              const std::function<void(const trainctl::v1::JobEvent&)>& on_event) {
  ASSIGN_OR_RETURN(const size_t i, Connect(absl::Now() + connect_timeout_));
  grpc::ClientContext context;
  Authorize(&context);
  auto reader = coordinators_[i].stub->WatchJob(&context, request);
  trainctl::v1::JobEvent event;
  while (reader->Read(&event)) on_event(event);
  return Convert(reader->Finish(), i);
}

absl::Status JobClient::Logs(const trainctl::v1::StreamLogsRequest& request,
                             const std::function<void(const trainctl::v1::LogLine&)>& on_line) {
  ASSIGN_OR_RETURN(const size_t i, Connect(absl::Now() + connect_timeout_));
  grpc::ClientContext context;
  Authorize(&context);
  auto reader = coordinators_[i].stub->StreamLogs(&context, request);
  trainctl::v1::LogLine line;
  while (reader->Read(&line)) on_line(line);
  return Convert(reader->Finish(), i);
}

}  // namespace trainctl::cli
