#include "cli/job_client.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace trainctl::cli {

using trainctl::v1::Job;

JobClient::JobClient(std::string address, absl::Duration connect_timeout)
    : JobClient(PlaintextConnection(std::move(address)), connect_timeout) {}

JobClient::JobClient(Connection connection, absl::Duration connect_timeout)
    : address_(std::move(connection.address)),
      token_(std::move(connection.token)),
      tls_without_cert_(connection.tls.enabled() && connection.tls.cert.empty()),
      connect_timeout_(connect_timeout) {
  grpc::ChannelArguments args;
  // Fail fast on refused connections rather than backing off for a minute.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(64 << 20);
  channel_ = grpc::CreateCustomChannel(address_, connection.credentials, args);
  stub_ = trainctl::v1::JobService::NewStub(channel_);
}

absl::Status JobClient::Convert(const grpc::Status& status) const {
  if (status.ok()) return absl::OkStatus();
  const auto code = status.error_code();
  if (code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED) {
    // A server that demands a client certificate aborts the handshake; gRPC reports only the
    // closed socket. The client cannot tell that apart from other resets, hence "may".
    const std::string& message = status.error_message();
    const bool closed = absl::StrContains(message, "Socket closed") ||
                        absl::StrContains(message, "Connection reset");
    return absl::UnavailableError(absl::StrCat(
        "cannot reach coordinator at ", address_, ": ", message,
        tls_without_cert_ && closed
            ? " (the server closed the TLS connection; this coordinator may require a client "
              "certificate: give one with --tls_cert and --tls_key, or TRAINCTL_TLS_CERT and "
              "TRAINCTL_TLS_KEY)"
            : ""));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), status.error_message());
}

void JobClient::Authorize(grpc::ClientContext* context) const {
  if (!token_.empty()) context->AddMetadata("authorization", "Bearer " + token_);
}

absl::Status JobClient::Connect() {
  if (channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + connect_timeout_))) {
    return absl::OkStatus();
  }
  if (tls_without_cert_) {
    // The channel's last error says more than the timeout (a server that demands a client
    // certificate closes the socket): a fail-fast call on the failed channel returns it at once.
    grpc::ClientContext probe;
    probe.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    trainctl::v1::Job job;
    const grpc::Status s = stub_->GetJob(&probe, trainctl::v1::GetJobRequest(), &job);
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) return Convert(s);
  }
  return absl::UnavailableError(absl::StrCat("cannot reach coordinator at ", address_,
                                             ": no connection within ",
                                             absl::FormatDuration(connect_timeout_)));
}

template <typename Request, typename Response>
absl::StatusOr<Response> JobClient::Unary(UnaryMethod<Request, Response> method,
                                          const Request& request) {
  grpc::ClientContext context;
  Authorize(&context);
  context.set_deadline(absl::ToChronoTime(absl::Now() + connect_timeout_));
  Response response;
  if (auto s = Convert((stub_.get()->*method)(&context, request, &response)); !s.ok()) return s;
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
  if (auto s = Connect(); !s.ok()) return s;
  grpc::ClientContext context;
  Authorize(&context);
  auto reader = stub_->WatchJob(&context, request);
  trainctl::v1::JobEvent event;
  while (reader->Read(&event)) on_event(event);
  return Convert(reader->Finish());
}

absl::Status JobClient::Logs(const trainctl::v1::StreamLogsRequest& request,
                             const std::function<void(const trainctl::v1::LogLine&)>& on_line) {
  if (auto s = Connect(); !s.ok()) return s;
  grpc::ClientContext context;
  Authorize(&context);
  auto reader = stub_->StreamLogs(&context, request);
  trainctl::v1::LogLine line;
  while (reader->Read(&line)) on_line(line);
  return Convert(reader->Finish());
}

}  // namespace trainctl::cli
