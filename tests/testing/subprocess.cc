#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace trainctl::testing {
namespace {

pid_t Spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
            int out_fd, int err_fd, const std::string& cwd = "") {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('='));
    if (!env.count(key)) env_strings.push_back(entry);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env_strings) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);

  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, STDIN_FILENO);
    if (!cwd.empty() && chdir(cwd.c_str()) != 0) {
      dprintf(err_fd, "chdir %s: %s\n", cwd.c_str(), strerror(errno));
      _exit(127);
    }
    execve(cargv[0], cargv.data(), cenv.data());
    dprintf(err_fd, "execve %s: %s\n", cargv[0], strerror(errno));
    _exit(127);
  }
  return pid;
}

bool Reap(pid_t pid, int* status, bool block) {
  while (true) {
    const pid_t r = waitpid(pid, status, block ? 0 : WNOHANG);
    if (r == pid) return true;
    if (r == 0) return false;
    if (errno != EINTR) return true;  // already reaped
  }
}

int ExitCode(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

}  // namespace

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

RunResult Run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
              absl::Duration timeout, const std::string& cwd) {
  char out_path[] = "/tmp/trainctl-run-out-XXXXXX";
  char err_path[] = "/tmp/trainctl-run-err-XXXXXX";
  const int out_fd = mkstemp(out_path);
  const int err_fd = mkstemp(err_path);
  const absl::Time start = absl::Now();
  const pid_t pid = Spawn(argv, env, out_fd, err_fd, cwd);
  RunResult result;
  int status = 0;
  if (!WaitFor([&] { return Reap(pid, &status, false); }, timeout)) {
    kill(pid, SIGKILL);
    Reap(pid, &status, true);
  }
  result.elapsed = absl::Now() - start;
  result.exit_code = ExitCode(status);
  result.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  close(out_fd);
  close(err_fd);
  result.out = ReadFileOrEmpty(out_path);
  result.err = ReadFileOrEmpty(err_path);
  unlink(out_path);
  unlink(err_path);
  return result;
}

Subprocess::Subprocess(const std::vector<std::string>& argv, const std::string& log_path) {
  const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  pid_ = Spawn(argv, {}, fd, fd);
  close(fd);
}

Subprocess::~Subprocess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status;
    Reap(pid_, &status, true);
  }
}

void Subprocess::Kill(int signal) {
  if (pid_ > 0) kill(pid_, signal);
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("not running");
  int status = 0;
  if (!WaitFor([&] { return Reap(pid_, &status, false); }, timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("pid ", pid_, " still running"));
  }
  pid_ = -1;
  return ExitCode(status);
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  return ok ? ntohs(addr.sin_port) : 0;
}

}  // namespace trainctl::testing
