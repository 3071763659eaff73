// JobClient: trainctl's connection to the coordinator's JobService, one of the connection's
// addresses (an active coordinator and standbys that take no connection until they lead).
//
// Each call first connects (common/channel_connect.h): to every address at once, using the first
// to take the connection in the order of the list rotated to start at the address that answered
// last in this process. An address that takes none (refused, unresolvable, a failed handshake, or
// nothing by the deadline) was sent nothing, so passing over it never sends a call twice. Once an
// address took the connection, the call's outcome is returned as it is, an UNAVAILABLE from that
// coordinator (its store down) or a connection lost mid-call included: nothing is retried
// elsewhere. (Every JobService call could be retried anyway: SubmitJob carries a request_id, the
// others read, or cancel, which is idempotent.)
//
// Every call fails within `connect_timeout` when no coordinator can be reached, with an
// UNAVAILABLE status that names each address and why (and, for a TLS client without a
// certificate whose connection the server closed, that the coordinator may require a client
// certificate). Not thread-safe (one CLI command at a time).
#ifndef TRAINCTL_CLI_JOB_CLIENT_H_
#define TRAINCTL_CLI_JOB_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/connection.h"
#include "trainctl/v1/job.grpc.pb.h"

namespace trainctl::cli {

class JobClient {
 public:
  // Plaintext, no token, one coordinator.
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

  // The addresses, in the connection's order.
  const std::vector<std::string>& addresses() const { return addresses_; }

 private:
  struct Coordinator {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<trainctl::v1::JobService::Stub> stub;
  };

  template <typename Request, typename Response>
  using UnaryMethod = grpc::Status (trainctl::v1::JobService::Stub::*)(grpc::ClientContext*,
                                                                       const Request&, Response*);
  // One unary call; connecting and the call together within the connect deadline.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Unary(UnaryMethod<Request, Response> method, const Request& request);
  // The index of the coordinator that took the connection by `deadline` (remembered as the
  // process's first choice), else UNAVAILABLE naming each address and why.
  absl::StatusOr<size_t> Connect(absl::Time deadline);
  // Why coordinator `i`'s channel failed to connect: gRPC's last error, which a fail-fast call
  // on the failed channel returns at once.
  std::string WhyFailed(size_t i);
  // gRPC's message, with the client certificate hint where it may apply.
  std::string Why(const grpc::Status& status) const;
  absl::Status Convert(const grpc::Status& status, size_t i) const;
  // The token's metadata on `context`.
  void Authorize(grpc::ClientContext* context) const;

  std::vector<std::string> addresses_;
  std::vector<Coordinator> coordinators_;  // by address
  std::string token_;
  // TLS on without a client certificate: a connection the server closes at or just after the
  // handshake is then most likely a coordinator that demands one (--tls_require_client_cert), and
  // Convert says so.
  bool tls_without_cert_ = false;
  absl::Duration connect_timeout_;
};

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_JOB_CLIENT_H_
