// WorkerServiceImpl: the gRPC face of Cluster. One bidirectional Session stream per worker daemon
// (proto/trainctl/v1/worker.proto); each stream is a callback reactor that hands every message to
// the cluster's loop and reads the next one only when that message has been handled. A session
// is authorized first (coordinator/rpc_authorizer.h), and each register in it must name a node the
// worker's client certificate holds, else the stream ends with PERMISSION_DENIED.
#ifndef TRAINCTL_COORDINATOR_WORKER_SERVICE_H_
#define TRAINCTL_COORDINATOR_WORKER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "coordinator/cluster.h"
#include "coordinator/rpc_authorizer.h"
#include "trainctl/v1/worker.grpc.pb.h"

namespace trainctl {

class WorkerServiceImpl final : public trainctl::v1::WorkerService::CallbackService {
 public:
  // Does not take ownership; `cluster` and `authorizer` (who may open sessions; null: everyone
  // may) must outlive the server.
  explicit WorkerServiceImpl(Cluster* cluster, const RpcAuthorizer* authorizer = nullptr)
      : cluster_(cluster), authorizer_(authorizer) {}

  grpc::ServerBidiReactor<trainctl::v1::WorkerMessage, trainctl::v1::CoordinatorMessage>* Session(
      grpc::CallbackServerContext* context) override;

 private:
  Cluster* const cluster_;
  const RpcAuthorizer* const authorizer_;
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_WORKER_SERVICE_H_
