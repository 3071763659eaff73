#include "tests/testing/notify_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainctl::testing {

absl::StatusOr<std::unique_ptr<NotifySocket>> NotifySocket::Bind(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InternalError(absl::StrCat("socket path too long: ", path));
  }
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int one = 1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return absl::InternalError(absl::StrCat("bind ", path, ": ", why));
  }
  return std::unique_ptr<NotifySocket>(new NotifySocket(path, fd));
}

NotifySocket::NotifySocket(std::string path, int fd) : path_(std::move(path)), fd_(fd) {
  reader_ = std::thread([this] { ReadLoop(); });
}

NotifySocket::~NotifySocket() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  reader_.join();
  close(fd_);
  unlink(path_.c_str());
}

void NotifySocket::ReadLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    char data[4096];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
    iovec iov{data, sizeof(data)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(fd_, &msg, MSG_DONTWAIT);
    if (n < 0) continue;
    const absl::Time now = absl::Now();
    pid_t sender = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
        ucred cred;
        std::memcpy(&cred, CMSG_DATA(c), sizeof(cred));
        sender = cred.pid;
      }
    }
    absl::MutexLock lock(&mu_);
    for (absl::string_view line :
         absl::StrSplit(absl::string_view(data, static_cast<size_t>(n)), '\n', absl::SkipEmpty())) {
      received_.push_back(NotifyAssignment{std::string(line), sender, now});
    }
  }
}

std::vector<NotifyAssignment> NotifySocket::Received() const {
  absl::MutexLock lock(&mu_);
  return received_;
}

int NotifySocket::WaitFor(const std::function<bool(const std::string&)>& match,
                          absl::Duration timeout, size_t from) const {
  const absl::Time deadline = absl::Now() + timeout;
  size_t next = from;
  absl::MutexLock lock(&mu_);
  while (true) {
    for (; next < received_.size(); ++next) {
      if (match(received_[next].text)) return static_cast<int>(next);
    }
    auto grew = [this, next]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return received_.size() > next; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&grew), deadline)) return -1;
  }
}

int NotifySocket::Count(const std::string& text, size_t from) const {
  absl::MutexLock lock(&mu_);
  int count = 0;
  for (size_t i = from; i < received_.size(); ++i) count += received_[i].text == text ? 1 : 0;
  return count;
}

std::string NotifySocket::Dump() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const NotifyAssignment& a : received_) {
    absl::StrAppend(&out, absl::FormatTime("%H:%M:%E3S", a.arrived, absl::UTCTimeZone()), " pid ",
                    a.sender, ": ", a.text, "\n");
  }
  return out;
}

}  // namespace trainctl::testing
