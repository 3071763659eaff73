// JobServiceImpl: the gRPC face of JobManager. Translates protos and statuses, nothing more.
// Unary handlers run on `executor` (they block on SQLite); streams are StoreTailWriter reactors.
// Every handler first asks the authorizer (coordinator/rpc_authorizer.h) whether its caller may
// call it; a submitted job records the caller's subject as its owner, and a user may cancel only
// the jobs it owns.
#ifndef TRAINCTL_COORDINATOR_JOB_SERVICE_H_
#define TRAINCTL_COORDINATOR_JOB_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/thread_pool.h"
#include "coordinator/job_diagnoser.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_notifier.h"
#include "coordinator/rpc_authorizer.h"
#include "trainctl/v1/job.grpc.pb.h"

namespace trainctl {

// absl and gRPC share canonical codes; this keeps the message.
grpc::Status ToGrpcStatus(const absl::Status& status);

// What ListNodes answers (NodeInventory::List).
using NodeLister = std::function<absl::StatusOr<trainctl::v1::ListNodesResponse>(
    const trainctl::v1::ListNodesRequest&)>;

// What a JobServiceImpl answers with besides the jobs. Pointers are not owned and must outlive the
// server.
struct JobServiceOptions {
  // Who may call what. Null: everyone may call everything.
  const RpcAuthorizer* authorizer = nullptr;
  // Empty: ListNodes is UNIMPLEMENTED (a coordinator with no scheduler).
  NodeLister node_lister;
  // What DiagnoseJob answers with. Null: UNIMPLEMENTED.
  const JobDiagnoser* diagnoser = nullptr;
};

class JobServiceImpl final : public trainctl::v1::JobService::CallbackService {
 public:
  // Does not take ownership; all three must outlive the server. The watch and log streams follow
  // `notifier`, which must observe `jobs` (JobManager::AddObserver).
  JobServiceImpl(JobManager* jobs, JobNotifier* notifier, ThreadPool* executor,
                 JobServiceOptions options = {})
      : jobs_(jobs), notifier_(notifier), executor_(executor), options_(std::move(options)) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const trainctl::v1::SubmitJobRequest* request,
                                      trainctl::v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const trainctl::v1::GetJobRequest* request,
                                   trainctl::v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const trainctl::v1::ListJobsRequest* request,
                                     trainctl::v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const trainctl::v1::CancelJobRequest* request,
                                      trainctl::v1::Job* response) override;
  grpc::ServerWriteReactor<trainctl::v1::JobEvent>* WatchJob(
      grpc::CallbackServerContext* context, const trainctl::v1::WatchJobRequest* request) override;
  grpc::ServerWriteReactor<trainctl::v1::LogLine>* StreamLogs(
      grpc::CallbackServerContext* context,
      const trainctl::v1::StreamLogsRequest* request) override;
  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* context,
                                      const trainctl::v1::ListNodesRequest* request,
                                      trainctl::v1::ListNodesResponse* response) override;
  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext* context,
                                       const trainctl::v1::GetMetricsRequest* request,
                                       trainctl::v1::GetMetricsResponse* response) override;
  grpc::ServerUnaryReactor* DiagnoseJob(grpc::CallbackServerContext* context,
                                        const trainctl::v1::DiagnoseJobRequest* request,
                                        trainctl::v1::DiagnoseJobResponse* response) override;

 private:
  // Authorizes the call to `method` ("JobService/GetJob"), then runs `work` with its caller on
  // the executor, and finishes the returned reactor with the first failure or `work`'s status.
  grpc::ServerUnaryReactor* RunUnary(grpc::CallbackServerContext* context, absl::string_view method,
                                     std::function<absl::Status(const Caller&)> work);

  const RpcAuthorizer& Auth() const;
  // The nodes SubmitJob checks a memory plan against (ListNodes' answer, at most a second old:
  // a burst of submits does not each wait on the cluster's loop); empty without a node lister.
  std::vector<trainctl::v1::Node> NodesForSubmit();

  JobManager* const jobs_;
  JobNotifier* const notifier_;
  ThreadPool* const executor_;
  const JobServiceOptions options_;
  absl::Mutex nodes_mu_;
  std::vector<trainctl::v1::Node> nodes_ ABSL_GUARDED_BY(nodes_mu_);
  absl::Time nodes_at_ ABSL_GUARDED_BY(nodes_mu_) = absl::InfinitePast();
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_JOB_SERVICE_H_
