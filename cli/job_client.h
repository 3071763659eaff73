// JobClient: trainctl's connection to the coordinator's JobService. Every call fails within
// `connect_timeout` when the coordinator cannot be reached, with an UNAVAILABLE status that names
// the address (and, for a TLS client without a certificate whose connection the server closed,
// that the coordinator may require a client certificate). Not thread-safe (one CLI command at a
// time).
#ifndef TRAINCTL_CLI_JOB_CLIENT_H_
#define TRAINCTL_CLI_JOB_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/connection.h"
#include "trainctl/v1/job.grpc.pb.h"

namespace trainctl::cli {

class JobClient {
 public:
  // Plaintext, no token.
  explicit JobClient(std::string address, absl::Duration connect_timeout = absl::Seconds(4));
  // With the connection's credentials; its token (if any) goes with every call.
  explicit JobClient(Connection connection, absl::Duration connect_timeout = absl::Seconds(4));

  absl::StatusOr<trainctl::v1::SubmitJobResponse> Submit(
      const trainctl::v1::SubmitJobRequest& request);
  absl::StatusOr<trainctl::v1::Job> Get(const std::string& id);
  absl::StatusOr<trainctl::v1::ListJobsResponse> List(const trainctl::v1::ListJobsRequest& request);
  absl::StatusOr<trainctl::v1::Job> Cancel(const std::string& id, const std::string& reason);
  absl::StatusOr<trainctl::v1::ListNodesResponse> ListNodes();
  absl::StatusOr<trainctl::v1::ListNodesResponse> ListNodes(
      const trainctl::v1::ListNodesRequest& request);
  absl::StatusOr<trainctl::v1::GetMetricsResponse> GetMetrics(
      const trainctl::v1::GetMetricsRequest& request);
  absl::StatusOr<trainctl::v1::DiagnoseJobResponse> Diagnose(const std::string& id);
  // Stream until the server ends it; `on_event` runs for each record. Returns the stream's status.
  absl::Status Watch(const trainctl::v1::WatchJobRequest& request,
                     const std::function<void(const trainctl::v1::JobEvent&)>& on_event);
  absl::Status Logs(const trainctl::v1::StreamLogsRequest& request,
                    const std::function<void(const trainctl::v1::LogLine&)>& on_line);

  const std::string& address() const { return address_; }

 private:
  template <typename Request, typename Response>
  using UnaryMethod = grpc::Status (trainctl::v1::JobService::Stub::*)(grpc::ClientContext*,
                                                                       const Request&, Response*);
  // One unary call with the connect deadline.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Unary(UnaryMethod<Request, Response> method, const Request& request);
  // Waits for a connection (streams have no deadline once connected).
  absl::Status Connect();
  absl::Status Convert(const grpc::Status& status) const;
  // The token's metadata on `context`.
  void Authorize(grpc::ClientContext* context) const;

  std::string address_;
  std::string token_;
  // TLS on without a client certificate: a connection the server closes at or just after the
  // handshake is then most likely a coordinator that demands one (--tls_require_client_cert), and
  // Convert says so.
  bool tls_without_cert_ = false;
  absl::Duration connect_timeout_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<trainctl::v1::JobService::Stub> stub_;
};

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_JOB_CLIENT_H_
