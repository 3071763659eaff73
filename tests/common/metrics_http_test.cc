// MetricsServer on loopback, fetched with cpp-httplib's client and checked by the real promtool.
#include "common/metrics_http.h"

#include <httplib.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/promtool.h"
#include "tests/testing/raw_socket.h"

namespace trainctl::metrics {
namespace {

using ::testing::HasSubstr;
using ::trainctl::testing::HttpGet;
using ::trainctl::testing::PromtoolCheckMetrics;

// A registry with every type, labels, escaping, bad UTF-8, NaN and infinities, and a family
// without series.
void Populate(Registry& registry) {
  auto& submits = registry.AddCounter("trainctl_job_submissions_total", "Accepted submits.");
  submits.Add({{"kind", "sft"}}).Increment(3);
  submits.Add({{"kind", "grpo"}}).Increment();
  registry.AddCounter("trainctl_job_cancellations_total", "Accepted cancels.").Add({});
  auto& loss = registry.AddGauge("trainctl_job_loss", "Training loss \\ \"latest\"\nstep.");
  loss.Add({{"job", "j1"},
            {"name", "a \"quoted\\\" name\nwith newline \xff"},
            {"kind", "sft"},
            {"nodes", "2"}})
      .Set(std::numeric_limits<double>::quiet_NaN());
  loss.Add({{"job", "j2"}, {"name", "plain"}, {"kind", "grpo"}, {"nodes", "1"}}).Set(0.25);
  auto& eta = registry.AddGauge("trainctl_job_eta_seconds", "Time left.");
  eta.Add({{"job", "j1"}}).Set(std::numeric_limits<double>::infinity());
  eta.Add({{"job", "j2"}}).Set(-std::numeric_limits<double>::infinity());
  registry.AddGauge("trainctl_nodes", "Nodes by state.");  // no series yet
  auto& rpc = registry.AddHistogram("trainctl_rpc_duration_seconds", "Unary RPC latency.");
  rpc.Add({{"method", "SubmitJob"}, {"code", "OK"}}, LatencyBuckets()).Observe(0.002);
  rpc.Add({{"method", "ListJobs"}, {"code", "OK"}}, LatencyBuckets()).Observe(40);
  registry.AddHistogram("trainctl_scheduler_pass_duration_seconds", "One pass.")
      .Add({}, LatencyBuckets())
      .Observe(0.0001);
}

TEST(MetricsServer, ServesMetricsHealthzAnd404) {
  Registry registry;
  Populate(registry);
  auto server = MetricsServer::Start(&registry, "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  EXPECT_EQ((*server)->address(), "127.0.0.1:" + std::to_string(port));

  std::string content_type;
  int status = 0;
  const std::string body = HttpGet("127.0.0.1", port, "/metrics", &content_type, &status);
  EXPECT_EQ(status, 200) << body;
  EXPECT_EQ(content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(body, registry.Render());
  EXPECT_THAT(body, HasSubstr("trainctl_job_submissions_total{kind=\"sft\"} 3\n"));

  EXPECT_EQ(HttpGet("127.0.0.1", port, "/healthz", nullptr, &status), "ok\n");
  EXPECT_EQ(status, 200);
  HttpGet("127.0.0.1", port, "/nothing-here", nullptr, &status);
  EXPECT_EQ(status, 404);
  HttpGet("127.0.0.1", port, "/metrics/extra", nullptr, &status);
  EXPECT_EQ(status, 404);
}

TEST(MetricsServer, OutputPassesPromtool) {
  Registry registry;
  Populate(registry);
  auto server = MetricsServer::Start(&registry, "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  int status = 0;
  const std::string body = HttpGet("127.0.0.1", (*server)->port(), "/metrics", nullptr, &status);
  ASSERT_EQ(status, 200) << body;
  EXPECT_EQ(PromtoolCheckMetrics(body), "") << body;
}

TEST(MetricsServer, PromtoolHelperReportsComplaints) {
  // The checker is only worth something if it fails on bad input: a counter without _total
  // (lint) and a malformed line (parse error).
  EXPECT_THAT(PromtoolCheckMetrics("# HELP x_hits Hits.\n# TYPE x_hits counter\nx_hits 1\n"),
              HasSubstr("_total"));
  EXPECT_NE(PromtoolCheckMetrics("this is not { the format\n"), "");
}

TEST(MetricsServer, BadAddressesAreInvalidArgumentNamingThem) {
  Registry registry;
  for (const std::string listen : {"", "nocolon", "host:", "host:port", "127.0.0.1:65536",
                                   "127.0.0.1:-1", "::1:80", "[::1]80", "[]:80", "a b:80"}) {
    auto server = MetricsServer::Start(&registry, listen);
    ASSERT_FALSE(server.ok()) << listen;
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
    EXPECT_THAT(server.status().message(), HasSubstr("\"" + listen + "\""));
  }
}

TEST(MetricsServer, BindFailureIsUnavailableNamingTheAddress) {
  Registry registry;
  auto first = MetricsServer::Start(&registry, "127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = (*first)->address();
  auto second = MetricsServer::Start(&registry, taken);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr(taken));

  // Not an address of this machine (TEST-NET-1).
  auto foreign = MetricsServer::Start(&registry, "192.0.2.1:0");
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kUnavailable) << foreign.status();
  EXPECT_THAT(foreign.status().message(), HasSubstr("192.0.2.1:0"));
}

TEST(MetricsServer, Ipv6Loopback) {
  Registry registry;
  registry.AddGauge("trainctl_queue_depth", "Depth.").Add({}).Set(4);
  auto server = MetricsServer::Start(&registry, "[::1]:0");
  if (!server.ok() && server.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << "no IPv6 loopback here: " << server.status();
  }
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->address(), "[::1]:" + std::to_string((*server)->port()));
  int status = 0;
  EXPECT_THAT(HttpGet("::1", (*server)->port(), "/metrics", nullptr, &status),
              HasSubstr("trainctl_queue_depth 4\n"));
  EXPECT_EQ(status, 200);
}

TEST(MetricsServer, StopsPromptlyAndFreesThePort) {
  Registry registry;
  int port = 0;
  for (int i = 0; i < 20; ++i) {  // a destructor racing the accept loop's start must not hang
    auto server = MetricsServer::Start(&registry, "127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status();
    port = (*server)->port();
  }
  int status = 0;
  HttpGet("127.0.0.1", port, "/healthz", nullptr, &status);
  EXPECT_EQ(status, -1);  // nothing listens any more
  auto again = MetricsServer::Start(&registry, "127.0.0.1:" + std::to_string(port));
  EXPECT_TRUE(again.ok()) << again.status();
}

// 24 connections that sent one header byte and then nothing (a slow client, or a port scan)
// used to hold both of the server's threads until the 5 s read timeout: /healthz and /metrics
// went unanswered. They take a thread each from a larger pool now, so a scrape is answered at
// once (the client gives up after 2 s), and each is cut off 5 s after its first byte however
// slowly it dribbles.
TEST(MetricsServer, SlowClientsDoNotBlindHealthz) {
  Registry registry;
  registry.AddGauge("trainctl_queue_depth", "Depth.").Add({}).Set(4);
  auto server = MetricsServer::Start(&registry, "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  // Connecting takes no time either: cpp-httplib's listen backlog of 5 dropped the SYNs of a burst
  // (a second each to retransmit).
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<trainctl::testing::RawSocket>> slow;
  for (int i = 0; i < 24; ++i) {
    slow.push_back(std::make_unique<trainctl::testing::RawSocket>(port));
    ASSERT_TRUE(slow.back()->connected());
    ASSERT_TRUE(slow.back()->Send("G"));
  }
  for (const char* path : {"/healthz", "/metrics"}) {
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(2);
    client.set_read_timeout(2);
    auto res = client.Get(path);
    ASSERT_TRUE(res) << path << ": " << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 200) << path;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2)) << path;
  }
  // Still dribbling (a byte per second) does not keep a connection past the 5 s deadline.
  auto& dribbler = *slow.front();
  bool closed = false;
  for (int i = 0; i < 8 && !closed; ++i) {
    dribbler.Send("E");
    closed = dribbler.ClosedByPeer(1000);
  }
  EXPECT_TRUE(closed);
}

}  // namespace
}  // namespace trainctl::metrics
