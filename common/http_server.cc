#include "common/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"

namespace trainctl::http {
namespace {

// The socket of the connection this thread is serving, for PeerClosed.
thread_local socket_t current_socket = INVALID_SOCKET;

// Starts a thread per task while fewer than `max` exist and none is idle; tasks beyond wait.
class GrowingPool : public httplib::TaskQueue {
 public:
  explicit GrowingPool(int max) : max_(static_cast<size_t>(std::max(1, max))) {}
  ~GrowingPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mu_);
    jobs_.push_back(std::move(fn));
    if (idle_ == 0 && threads_.size() < max_) {
      threads_.emplace_back([this] { Work(); });
    } else {
      cv_.notify_one();
    }
  }

  void shutdown() override {
    std::vector<std::thread> threads;
    {
      std::unique_lock<std::mutex> lock(mu_);
      stopping_ = true;
      threads.swap(threads_);
    }
    cv_.notify_all();
    for (std::thread& t : threads) t.join();
  }

 private:
  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;  // stopping, nothing left
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  const size_t max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

void Address(socket_t sock, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  const int rc = peer ? getpeername(sock, reinterpret_cast<sockaddr*>(&addr), &len)
                      : getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len);
  if (rc != 0) return;
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    port = ntohs(in6->sin6_port);
  }
  ip = text;
}

// A socket stream whose reads end at the request's deadline (or at shutdown) and whose writes end
// at the write timeout, polling in short slices; buffered, as cpp-httplib reads lines a byte at a
// time.
class DeadlineStream : public httplib::Stream {
 public:
  DeadlineStream(socket_t sock, const std::atomic<bool>* stopping, absl::Duration write_timeout)
      : sock_(sock), stopping_(stopping), write_timeout_(write_timeout) {}

  // Waits up to `idle` for the next request's first byte. False on timeout, EOF or shutdown.
  bool WaitForRequest(absl::Duration idle) {
    if (pos_ < len_) return true;
    return Poll(POLLIN, absl::Now() + idle, /*stop_on_shutdown=*/true) && Fill() > 0;
  }
  void StartRequest(absl::Time read_deadline) { read_deadline_ = read_deadline; }

  bool is_readable() const override {
    return pos_ < len_ || Poll(POLLIN, read_deadline_, /*stop_on_shutdown=*/true);
  }
  bool is_writable() const override {
    return Poll(POLLOUT, absl::Now() + write_timeout_, /*stop_on_shutdown=*/false);
  }

  ssize_t read(char* ptr, size_t size) override {
    if (pos_ == len_) {
      if (!Poll(POLLIN, read_deadline_, /*stop_on_shutdown=*/true)) return -1;
      const ssize_t n = Fill();
      if (n <= 0) return n;
    }
    const size_t n = std::min(size, len_ - pos_);
    std::memcpy(ptr, buffer_ + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    const absl::Time deadline = absl::Now() + write_timeout_;
    for (;;) {
      const ssize_t n = ::send(sock_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) return n;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
      if (!Poll(POLLOUT, deadline, /*stop_on_shutdown=*/false)) return -1;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Address(sock_, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Address(sock_, false, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  // Whether `events` (or a hang-up or error, which the next call then reports) came before the
  // deadline; with stop_on_shutdown, false as soon as the server shuts down.
  bool Poll(short events, absl::Time deadline, bool stop_on_shutdown) const {
    for (;;) {
      if (stop_on_shutdown && stopping_->load()) return false;
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return false;
      pollfd p{sock_, events, 0};
      const int ms = static_cast<int>(
          std::min<int64_t>(50, std::max<int64_t>(1, absl::ToInt64Milliseconds(left))));
      const int rc = ::poll(&p, 1, ms);
      if (rc > 0) return true;
      if (rc < 0 && errno != EINTR) return false;
    }
  }

  ssize_t Fill() {
    for (;;) {
      const ssize_t n = ::recv(sock_, buffer_, sizeof(buffer_), MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!Poll(POLLIN, read_deadline_, /*stop_on_shutdown=*/true)) return -1;
        continue;
      }
      pos_ = 0;
      len_ = n > 0 ? static_cast<size_t>(n) : 0;
      return n;
    }
  }

  const socket_t sock_;
  const std::atomic<bool>* const stopping_;
  const absl::Duration write_timeout_;
  absl::Time read_deadline_ = absl::InfiniteFuture();
  char buffer_[16 * 1024];
  size_t pos_ = 0;
  size_t len_ = 0;
};

}  // namespace

BoundedServer::BoundedServer(ServerLimits limits) : limits_(limits) {
  const int threads = limits_.max_threads;
  new_task_queue = [threads] { return new GrowingPool(threads); };
}

void BoundedServer::Shutdown() {
  stopping_ = true;
  stop();
}

bool BoundedServer::RaiseBacklog(int backlog) {
  const socket_t sock = svr_sock_;
  return sock != INVALID_SOCKET && ::listen(sock, backlog) == 0;
}

bool BoundedServer::PeerClosed() {
  if (current_socket == INVALID_SOCKET) return false;
  pollfd p{current_socket, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  // Readable without a hang-up: pipelined bytes of a next request, or EOF on old kernels.
  char byte;
  return ::recv(current_socket, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

bool BoundedServer::process_and_close_socket(socket_t sock) {
  ++active_;
  current_socket = sock;
  DeadlineStream stream(sock, &stopping_, limits_.write_timeout);
  bool ok = true;
  for (int left = std::max(1, limits_.max_requests_per_connection); left > 0; --left) {
    // A request already buffered (pipelined) is answered even while shutting down.
    if (!stream.WaitForRequest(stopping_ ? absl::ZeroDuration() : limits_.idle_timeout)) break;
    stream.StartRequest(absl::Now() + limits_.request_read_timeout);
    bool connection_closed = false;
    ok = process_request(stream, /*close_connection=*/left == 1 || stopping_, connection_closed,
                         [](httplib::Request&) {});
    if (!ok || connection_closed || stopping_) break;
  }
  current_socket = INVALID_SOCKET;
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  --active_;
  return ok;
}

}  // namespace trainctl::http
