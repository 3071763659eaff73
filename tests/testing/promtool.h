// Test helpers for /metrics endpoints: a real HTTP GET (cpp-httplib's client) and the real
// `promtool check metrics` (Debian's prometheus package). Header-only; a test using them links
// PkgConfig::HTTPLIB.
#ifndef TRAINCTL_TESTS_TESTING_PROMTOOL_H_
#define TRAINCTL_TESTS_TESTING_PROMTOOL_H_

#include <httplib.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

namespace trainctl::testing {

// GET http://HOST:PORT/PATH. Returns the body; fills `content_type` and `status` (the HTTP
// status, or -1 when no response came, the body then naming the transport error) when non-null.
// HOST may be an IPv6 literal without brackets ("::1").
inline std::string HttpGet(const std::string& host, int port, const std::string& path,
                           std::string* content_type = nullptr, int* status = nullptr) {
  httplib::Client client(host, port);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  httplib::Result result = client.Get(path.c_str());
  if (!result) {
    if (status != nullptr) *status = -1;
    if (content_type != nullptr) content_type->clear();
    return "transport error: " + httplib::to_string(result.error());
  }
  if (status != nullptr) *status = result->status;
  if (content_type != nullptr) *content_type = result->get_header_value("Content-Type");
  return result->body;
}

// Pipes `body` through `promtool check metrics`. Returns everything promtool printed (lint
// complaints, parse errors) plus a line naming a non-zero exit; empty when the body is clean.
inline std::string PromtoolCheckMetrics(const std::string& body) {
  char path[] = "/tmp/trainctl_promtool_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return "cannot create a temporary file for promtool";
  size_t written = 0;
  while (written < body.size()) {
    const ssize_t n = write(fd, body.data() + written, body.size() - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  close(fd);
  if (written != body.size()) {
    unlink(path);
    return "cannot write the temporary file for promtool";
  }
  const std::string command = std::string("promtool check metrics < ") + path + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    unlink(path);
    return "cannot run promtool (is the prometheus package installed?)";
  }
  std::string output;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  const int rc = pclose(pipe);
  unlink(path);
  if (rc != 0) {
    output += "promtool exited with status " +
              std::to_string(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1) + "\n";
  }
  return output;
}

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_TESTING_PROMTOOL_H_
