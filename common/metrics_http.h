// Serves a metrics::Registry over HTTP with cpp-httplib (Debian's libcpp-httplib-dev): GET
// /metrics renders it with the exact Content-Type of the text format 0.0.4, GET /healthz answers
// "ok". Other paths are 404. One listener thread plus a pool of up to 64 connection threads;
// slow or idle peers are cut off (common/http_server.h).
#ifndef TRAINCTL_COMMON_METRICS_HTTP_H_
#define TRAINCTL_COMMON_METRICS_HTTP_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace trainctl::metrics {

class MetricsServer {
 public:
  // Listens on HOST:PORT (port 0 picks a free one; "[::1]:P" for IPv6). INVALID_ARGUMENT naming a
  // malformed address, UNAVAILABLE when it cannot bind. `registry` must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(Registry* registry,
                                                              const std::string& listen);
  ~MetricsServer();  // stops and joins
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  // HOST:PORT as bound (the port filled in).
  const std::string& address() const { return address_; }

 private:
  struct Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::string address_;
};

// A daemon's --metrics_listen: null when `listen` is empty; else the server started on it and
// logged, its address written to `ready_file` (WriteReadyFile in common/daemon.h). Errors name
// --metrics_listen or --metrics_ready_file.
absl::StatusOr<std::unique_ptr<MetricsServer>> StartDaemonMetrics(Registry* registry,
                                                                  const std::string& listen,
                                                                  const std::string& ready_file);

}  // namespace trainctl::metrics

#endif  // TRAINCTL_COMMON_METRICS_HTTP_H_
