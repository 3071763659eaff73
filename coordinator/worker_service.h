// WorkerServiceImpl: the gRPC face of Cluster. One bidirectional Session stream per worker daemon
// (proto/trainctl/v1/worker.proto); each stream is a callback reactor that hands every message to
// the cluster's loop and reads the next one only when that message has been handled.
#ifndef TRAINCTL_COORDINATOR_WORKER_SERVICE_H_
#define TRAINCTL_COORDINATOR_WORKER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "coordinator/cluster.h"
#include "trainctl/v1/worker.grpc.pb.h"

namespace trainctl {

class WorkerServiceImpl final : public trainctl::v1::WorkerService::CallbackService {
 public:
  // Does not take ownership; `cluster` must outlive the server.
  explicit WorkerServiceImpl(Cluster* cluster) : cluster_(cluster) {}

  grpc::ServerBidiReactor<trainctl::v1::WorkerMessage, trainctl::v1::CoordinatorMessage>* Session(
      grpc::CallbackServerContext* context) override;

 private:
  Cluster* const cluster_;
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_WORKER_SERVICE_H_
