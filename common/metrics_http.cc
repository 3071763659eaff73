#include "common/metrics_http.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/daemon.h"
#include "common/http_server.h"
#include "common/logging.h"

namespace trainctl::metrics {
namespace {

struct HostPort {
  std::string host;  // without brackets
  int port = 0;
  bool ipv6 = false;
};

// "HOST:PORT", "[V6]:PORT" or ":PORT" (every IPv4 interface).
absl::StatusOr<HostPort> ParseListen(absl::string_view listen) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad metrics listen address \"", listen, "\": ", why));
  };
  HostPort out;
  absl::string_view port;
  if (!listen.empty() && listen.front() == '[') {
    const size_t close = listen.find(']');
    if (close == absl::string_view::npos || close + 1 >= listen.size() ||
        listen[close + 1] != ':') {
      return bad("want [V6]:PORT");
    }
    out.host = std::string(listen.substr(1, close - 1));
    out.ipv6 = true;
    port = listen.substr(close + 2);
    if (out.host.empty()) return bad("empty IPv6 host");
  } else {
    const size_t colon = listen.rfind(':');
    if (colon == absl::string_view::npos) return bad("want HOST:PORT");
    out.host = std::string(listen.substr(0, colon));
    port = listen.substr(colon + 1);
    if (out.host.find(':') != std::string::npos) return bad("an IPv6 host needs brackets");
    if (out.host.empty()) out.host = "0.0.0.0";
  }
  for (char c : out.host) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) || absl::ascii_iscntrl(c)) {
      return bad("the host has a space or control character");
    }
  }
  if (port.empty() || port.size() > 5 || !absl::SimpleAtoi(port, &out.port) || port[0] == '+' ||
      port[0] == '-' || out.port < 0 || out.port > 65535) {
    return bad("the port is not a number in 0..65535");
  }
  return out;
}

// Scrapes come every few seconds from one or two Prometheus servers; a request must arrive whole
// within 5 s of its first byte, and a few slow or stuck sockets take a thread each from a pool of
// up to 64, started as needed (common/http_server.h), so /metrics and /healthz still answer.
http::ServerLimits MetricsLimits() {
  http::ServerLimits limits;
  limits.max_threads = 64;
  limits.request_read_timeout = absl::Seconds(5);
  limits.idle_timeout = absl::Seconds(5);
  limits.write_timeout = absl::Seconds(5);
  return limits;
}

}  // namespace

struct MetricsServer::Impl {
  http::BoundedServer http{MetricsLimits()};
  std::thread thread;
  std::atomic<bool> loop_ended{false};
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() {
  impl_->http.Shutdown();
  if (impl_->thread.joinable()) impl_->thread.join();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(Registry* registry,
                                                                    const std::string& listen) {
  absl::StatusOr<HostPort> parsed = ParseListen(listen);
  if (!parsed.ok()) return parsed.status();

  auto impl = std::make_unique<Impl>();
  httplib::Server& http = impl->http;
  http.set_payload_max_length(64 * 1024);  // GETs have no body worth reading
  // cpp-httplib's default sets SO_REUSEPORT, which lets a second daemon bind the same port and
  // take half the scrapes; SO_REUSEADDR alone still allows a restart while old sockets linger.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http.Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->Render(), kContentType);
  });
  http.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain; charset=utf-8");
  });

  int port = parsed->port;
  if (port == 0) {
    port = http.bind_to_any_port(parsed->host);
  } else if (!http.bind_to_port(parsed->host, port)) {
    port = -1;
  }
  if (port <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for metrics on ", listen,
                                               " (address in use, or not a local address)"));
  }
  impl->http.RaiseBacklog();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    raw->http.listen_after_bind();
    raw->loop_ended = true;
  });
  // stop() does nothing until the accept loop runs, so the destructor could not end it before.
  // The socket already listens, so connections made meanwhile wait in the backlog.
  while (!http.is_running() && !raw->loop_ended)
    std::this_thread::sleep_for(std::chrono::microseconds(100));

  std::unique_ptr<MetricsServer> server(new MetricsServer(std::move(impl)));
  server->port_ = port;
  server->address_ = parsed->ipv6 ? absl::StrCat("[", parsed->host, "]:", port)
                                  : absl::StrCat(parsed->host, ":", port);
  return server;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> StartDaemonMetrics(Registry* registry,
                                                                  const std::string& listen,
                                                                  const std::string& ready_file) {
  if (listen.empty()) return std::unique_ptr<MetricsServer>();
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start(registry, listen);
  if (!server.ok()) {
    return absl::Status(server.status().code(),
                        absl::StrCat("--metrics_listen: ", server.status().message()));
  }
  TRAINCTL_LOG(INFO) << "metrics on http://" << (*server)->address() << "/metrics";
  if (absl::Status s = WriteReadyFile(ready_file, (*server)->address()); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--metrics_ready_file: ", s.message()));
  }
  return server;
}

}  // namespace trainctl::metrics
