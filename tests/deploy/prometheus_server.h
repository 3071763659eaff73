// A real Prometheus server for tests: Debian's `prometheus` binary on 127.0.0.1 with its database
// in a test's temporary directory, and the HTTP API calls tests make of it.
#ifndef TRAINCTL_TESTS_DEPLOY_PROMETHEUS_SERVER_H_
#define TRAINCTL_TESTS_DEPLOY_PROMETHEUS_SERVER_H_

#include <httplib.h>
#include <signal.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace trainctl::testing {

class PrometheusServer {
 public:
  // Starts `binary` with `config` (a file), its TSDB under `dir`/tsdb and its log in
  // `dir`/prometheus.log, and waits up to `timeout` for /-/ready. UNAVAILABLE with the log's tail
  // when it does not become ready.
  static absl::StatusOr<std::unique_ptr<PrometheusServer>> Start(const std::string& binary,
                                                                 const std::string& config,
                                                                 const std::string& dir,
                                                                 absl::Duration timeout) {
    if (!std::filesystem::exists(binary)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no Prometheus at '", binary,
          "': install Debian's prometheus package (scripts/setup.sh) and re-run cmake"));
    }
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
    const int port = FreeLoopbackPort();
    if (port == 0) return absl::UnavailableError("no free loopback port for Prometheus");
    auto server = std::unique_ptr<PrometheusServer>(new PrometheusServer(port, dir));
    server->process_ = std::make_unique<Subprocess>(
        std::vector<std::string>{
            binary, "--config.file=" + config, "--storage.tsdb.path=" + dir + "/tsdb",
            absl::StrCat("--web.listen-address=127.0.0.1:", port), "--log.level=info"},
        server->log_path());
    const bool ready = WaitFor(
        [&] {
          httplib::Client client("127.0.0.1", port);
          auto r = client.Get("/-/ready");
          return r && r->status == 200;
        },
        timeout);
    if (!ready) {
      return absl::UnavailableError(
          absl::StrCat("Prometheus did not become ready on port ", port, ":\n", server->Log()));
    }
    return server;
  }

  ~PrometheusServer() {
    if (process_ && process_->running()) {
      process_->Kill(SIGTERM);
      (void)process_->Wait(absl::Seconds(10));
    }
  }

  int port() const { return port_; }
  std::string log_path() const { return dir_ + "/prometheus.log"; }
  // The last 8 KB of its log.
  std::string Log() const {
    std::string log = ReadFileOrEmpty(log_path());
    return log.size() > 8192 ? log.substr(log.size() - 8192) : log;
  }

  // POSTs `params` to `path` (GET when `params` is empty) and returns the decoded JSON body,
  // whatever the HTTP status (Prometheus answers errors as {"status":"error","error":...}).
  // UNAVAILABLE when there is no answer or it is not JSON.
  absl::StatusOr<nlohmann::json> Api(const std::string& path, const httplib::Params& params = {}) {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(10, 0);
    auto r = params.empty() ? client.Get(path) : client.Post(path, params);
    if (!r) {
      return absl::UnavailableError(
          absl::StrCat(path, ": no answer (", httplib::to_string(r.error()), ")"));
    }
    auto body = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
    if (!body.is_object()) {
      return absl::UnavailableError(
          absl::StrCat(path, ": HTTP ", r->status, ", not JSON: ", r->body.substr(0, 500)));
    }
    return body;
  }

  // The result vector of an instant query (an error status names the query and Prometheus's
  // error).
  absl::StatusOr<nlohmann::json> Query(const std::string& expr) {
    auto body = Api("/api/v1/query", {{"query", expr}});
    if (!body.ok()) return body.status();
    if ((*body)["status"] != "success") {
      return absl::InvalidArgumentError(absl::StrCat(expr, ": ", body->dump()));
    }
    return (*body)["data"]["result"];
  }

  // A range query over the last `range` at `step`: the result matrix.
  absl::StatusOr<nlohmann::json> QueryRange(const std::string& expr, absl::Duration range,
                                            absl::Duration step) {
    const double end = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    auto body = Api("/api/v1/query_range",
                    {{"query", expr},
                     {"start", absl::StrFormat("%.3f", end - absl::ToDoubleSeconds(range))},
                     {"end", absl::StrFormat("%.3f", end)},
                     {"step", absl::StrFormat("%.3f", absl::ToDoubleSeconds(step))}});
    if (!body.ok()) return body.status();
    if ((*body)["status"] != "success") {
      return absl::InvalidArgumentError(absl::StrCat(expr, ": ", body->dump()));
    }
    return (*body)["data"]["result"];
  }

  // Every alert Prometheus holds now (pending and firing), as /api/v1/alerts lists them.
  nlohmann::json Alerts() {
    auto body = Api("/api/v1/alerts");
    if (!body.ok() || (*body)["status"] != "success") return nlohmann::json::array();
    return (*body)["data"]["alerts"];
  }

 private:
  PrometheusServer(int port, std::string dir) : port_(port), dir_(std::move(dir)) {}

  const int port_;
  const std::string dir_;
  std::unique_ptr<Subprocess> process_;
};

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_DEPLOY_PROMETHEUS_SERVER_H_
