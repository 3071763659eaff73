#include "coordinator/rpc_metrics.h"

#include <chrono>
#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/descriptor.h"

namespace trainctl {
namespace {

using grpc::experimental::InterceptionHookPoints;

// "/trainctl.v1.JobService/SubmitJob" -> "SubmitJob" for a method this binary's protos define;
// "other" for any other path, so a client cannot mint label values (one series each) at will.
std::string MethodLabel(const char* path) {
  absl::string_view p = path == nullptr ? "" : path;
  if (!absl::ConsumePrefix(&p, "/")) return "other";
  const auto slash = p.find('/');
  if (slash == absl::string_view::npos) return "other";
  const std::string full = absl::StrCat(p.substr(0, slash), ".", p.substr(slash + 1));
  const auto* method = google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(full);
  return method == nullptr ? "other" : method->name();
}

// The histogram of each (method, code), made once. prometheus-cpp's Family::Add builds a child
// before it looks the labels up, so calling it per RPC would allocate a histogram per RPC.
class DurationSeries {
 public:
  explicit DurationSeries(prometheus::Family<prometheus::Histogram>* family) : family_(family) {}

  prometheus::Histogram& Get(const std::string& method, absl::StatusCode code) {
    absl::MutexLock lock(&mu_);
    auto [it, added] = series_.try_emplace({method, code}, nullptr);
    if (added) {
      it->second = &family_->Add({{"method", method}, {"code", absl::StatusCodeToString(code)}},
                                 metrics::LatencyBuckets());
    }
    return *it->second;
  }

 private:
  prometheus::Family<prometheus::Histogram>* const family_;
  absl::Mutex mu_;
  std::map<std::pair<std::string, absl::StatusCode>, prometheus::Histogram*> series_
      ABSL_GUARDED_BY(mu_);
};

class RpcTimer final : public grpc::experimental::Interceptor {
 public:
  RpcTimer(DurationSeries* durations, absl::string_view method)
      : durations_(durations), method_(method), start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start_;
      const auto code = static_cast<absl::StatusCode>(methods->GetSendStatus().error_code());
      durations_->Get(method_, code).Observe(took.count());
    }
    methods->Proceed();
  }

 private:
  DurationSeries* const durations_;
  const std::string method_;
  const std::chrono::steady_clock::time_point start_;
};

class RpcTimerFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcTimerFactory(prometheus::Family<prometheus::Histogram>* durations)
      : durations_(durations) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    if (info->type() != grpc::experimental::ServerRpcInfo::Type::UNARY) return nullptr;
    return new RpcTimer(&durations_, MethodLabel(info->method()));
  }

 private:
  DurationSeries durations_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRpcMetricsInterceptor(
    metrics::Registry* registry) {
  auto& durations = registry->AddHistogram("trainctl_rpc_duration_seconds",
                                           "Unary RPC latency by method and gRPC status code.");
  return std::make_unique<RpcTimerFactory>(&durations);
}

}  // namespace trainctl
