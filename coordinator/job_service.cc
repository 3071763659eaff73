#include "coordinator/job_service.h"

#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "coordinator/internal/store_tail_writer.h"
#include "coordinator/job_state.h"

namespace trainctl {
namespace {

using trainctl::v1::JobEvent;
using trainctl::v1::LogLine;

constexpr int kStreamBatch = 256;

// What a service without an authorizer set uses: everything allowed.
const RpcAuthorizer kOpen;

absl::StatusOr<bool> JobOver(JobStore* store, const std::string& id) {
  ASSIGN_OR_RETURN(Job current, store->GetJob(id));
  return IsTerminal(current.state());
}

template <typename T>
grpc::ServerWriteReactor<T>* FailedStream(const absl::Status& status) {
  class Failed final : public grpc::ServerWriteReactor<T> {
   public:
    explicit Failed(const grpc::Status& s) { this->Finish(s); }
    void OnDone() override { delete this; }
  };
  return new Failed(ToGrpcStatus(status));
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

const RpcAuthorizer& JobServiceImpl::Auth() const {
  return options_.authorizer == nullptr ? kOpen : *options_.authorizer;
}

grpc::ServerUnaryReactor* JobServiceImpl::RunUnary(
    grpc::CallbackServerContext* context, absl::string_view method,
    std::function<absl::Status(const Caller&)> work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<Caller> caller = Auth().Authorize(*context, method);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  executor_->Schedule([reactor, work = std::move(work), caller = *std::move(caller)] {
    reactor->Finish(ToGrpcStatus(work(caller)));
  });
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const trainctl::v1::SubmitJobRequest* request,
                                                    trainctl::v1::SubmitJobResponse* response) {
  return RunUnary(context, "JobService/SubmitJob",
                  [this, request, response](const Caller& caller) -> absl::Status {
                    SubmitChecks checks;
                    checks.force = request->force();
                    checks.nodes = NodesForSubmit();
                    ASSIGN_OR_RETURN(SubmitResult result,
                                     jobs_->Submit(request->spec(), request->request_id(),
                                                   caller.subject, checks));
                    *response->mutable_job() = std::move(result.job);
                    response->set_created(result.created);
                    for (std::string& w : result.warnings) response->add_warnings(std::move(w));
                    return absl::OkStatus();
                  });
}

std::vector<trainctl::v1::Node> JobServiceImpl::NodesForSubmit() {
  if (!options_.node_lister) return {};  // the plan is then made for GPUs and not checked
  absl::MutexLock lock(&nodes_mu_);
  const absl::Time now = absl::Now();
  if (now - nodes_at_ > absl::Seconds(1)) {
    auto listed = options_.node_lister(trainctl::v1::ListNodesRequest());
    if (listed.ok()) {
      nodes_.assign(listed->nodes().begin(), listed->nodes().end());
      nodes_at_ = now;
    }
  }
  return nodes_;
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* context,
                                                 const trainctl::v1::GetJobRequest* request,
                                                 trainctl::v1::Job* response) {
  return RunUnary(context, "JobService/GetJob",
                  [this, request, response](const Caller&) -> absl::Status {
                    ASSIGN_OR_RETURN(*response, jobs_->Get(request->id()));
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* context,
                                                   const trainctl::v1::ListJobsRequest* request,
                                                   trainctl::v1::ListJobsResponse* response) {
  return RunUnary(context, "JobService/ListJobs",
                  [this, request, response](const Caller&) -> absl::Status {
                    JobFilter filter;
                    for (int state : request->states()) {
                      filter.states.push_back(static_cast<trainctl::v1::JobState>(state));
                    }
                    filter.page_size = request->page_size() == 0 ? 100 : request->page_size();
                    if (!request->page_token().empty() &&
                        (!absl::SimpleAtoi(request->page_token(), &filter.before_id) ||
                         filter.before_id <= 0)) {
                      return absl::InvalidArgumentError(
                          absl::StrCat("invalid page_token '", request->page_token(), "'"));
                    }
                    ASSIGN_OR_RETURN(JobPage page, jobs_->List(filter));
                    for (Job& job : page.jobs) *response->add_jobs() = std::move(job);
                    if (page.next_before_id > 0)
                      response->set_next_page_token(absl::StrCat(page.next_before_id));
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* JobServiceImpl::ListNodes(grpc::CallbackServerContext* context,
                                                    const trainctl::v1::ListNodesRequest* request,
                                                    trainctl::v1::ListNodesResponse* response) {
  return RunUnary(context, "JobService/ListNodes",
                  [this, request, response](const Caller&) -> absl::Status {
                    if (!options_.node_lister)
                      return absl::UnimplementedError("this coordinator runs no scheduler");
                    ASSIGN_OR_RETURN(*response, options_.node_lister(*request));
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetMetrics(grpc::CallbackServerContext* context,
                                                     const trainctl::v1::GetMetricsRequest* request,
                                                     trainctl::v1::GetMetricsResponse* response) {
  return RunUnary(
      context, "JobService/GetMetrics", [this, request, response](const Caller&) -> absl::Status {
        ASSIGN_OR_RETURN(
            *response,
            jobs_->GetMetrics(request->id(), {request->names().begin(), request->names().end()},
                              request->max_points()));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* JobServiceImpl::DiagnoseJob(
    grpc::CallbackServerContext* context, const trainctl::v1::DiagnoseJobRequest* request,
    trainctl::v1::DiagnoseJobResponse* response) {
  return RunUnary(context, "JobService/DiagnoseJob",
                  [this, request, response](const Caller&) -> absl::Status {
                    if (options_.diagnoser == nullptr)
                      return absl::UnimplementedError("this coordinator diagnoses no jobs");
                    ASSIGN_OR_RETURN(*response, options_.diagnoser->Diagnose(request->id()));
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const trainctl::v1::CancelJobRequest* request,
                                                    trainctl::v1::Job* response) {
  return RunUnary(context, "JobService/CancelJob",
                  [this, request, response](const Caller& caller) -> absl::Status {
                    std::optional<std::string> only_owner;
                    if (!RpcAuthorizer::MayCancelAnyJob(caller)) only_owner = caller.subject;
                    ASSIGN_OR_RETURN(*response,
                                     jobs_->Cancel(request->id(), request->reason(), only_owner));
                    return absl::OkStatus();
                  });
}

grpc::ServerWriteReactor<JobEvent>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* context, const trainctl::v1::WatchJobRequest* request) {
  if (auto caller = Auth().Authorize(*context, "JobService/WatchJob"); !caller.ok()) {
    return FailedStream<JobEvent>(caller.status());
  }
  auto job = jobs_->Get(request->id());
  if (!job.ok()) return FailedStream<JobEvent>(job.status());
  JobStore* store = jobs_->store();
  const std::string id = job->id();
  StoreTailWriter<JobEvent>::Source source;
  source.follow = !request->replay_only();
  source.fetch = [store, id](int64_t after) { return store->ListEvents(id, after, kStreamBatch); };
  source.job_over = [store, id] { return JobOver(store, id); };
  return new StoreTailWriter<JobEvent>(notifier_, id, request->after_seq(), std::move(source));
}

grpc::ServerWriteReactor<LogLine>* JobServiceImpl::StreamLogs(
    grpc::CallbackServerContext* context, const trainctl::v1::StreamLogsRequest* request) {
  if (auto caller = Auth().Authorize(*context, "JobService/StreamLogs"); !caller.ok()) {
    return FailedStream<LogLine>(caller.status());
  }
  auto job = jobs_->Get(request->id());
  if (!job.ok()) return FailedStream<LogLine>(job.status());
  JobStore* store = jobs_->store();
  const std::string id = job->id();
  int64_t after = request->after_seq();
  if (request->tail() > 0) {
    // Start just before the last `tail` lines.
    LogQuery query;
    query.after_seq = after;
    query.tail = request->tail();
    auto last = store->ListLogs(id, query);
    if (!last.ok()) return FailedStream<LogLine>(last.status());
    if (!last->empty()) after = last->front().seq() - 1;
  }
  StoreTailWriter<LogLine>::Source source;
  source.follow = request->follow();
  source.fetch = [store, id](int64_t after_seq) {
    LogQuery query;
    query.after_seq = after_seq;
    query.limit = kStreamBatch;
    return store->ListLogs(id, query);
  };
  source.job_over = [store, id] { return JobOver(store, id); };
  return new StoreTailWriter<LogLine>(notifier_, id, after, std::move(source));
}

}  // namespace trainctl
