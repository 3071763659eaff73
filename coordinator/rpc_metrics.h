// RPC latency for /metrics: a gRPC server interceptor that observes every unary call's duration in
// trainctl_rpc_duration_seconds{method, code}, from the call's arrival to its status being sent.
// `method` is the last part of the gRPC path ("SubmitJob"), `code` the status code's canonical
// name ("OK", "NOT_FOUND"). Streaming calls (WatchJob, StreamLogs, the workers' sessions) are not
// observed: their duration is how long someone watched, not how fast the server answered.
#ifndef TRAINCTL_COORDINATOR_RPC_METRICS_H_
#define TRAINCTL_COORDINATOR_RPC_METRICS_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "common/metrics.h"

namespace trainctl {

// Adds trainctl_rpc_duration_seconds to `registry` (not owned; must outlive every server built
// with the factory) and returns the factory to pass to
// grpc::ServerBuilder::experimental().SetInterceptorCreators.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRpcMetricsInterceptor(
    metrics::Registry* registry);

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_RPC_METRICS_H_
