#include "common/credential_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"

namespace trainctl {

absl::StatusOr<std::string> ReadCredentialFile(const std::string& path) {
  constexpr size_t kMaxBytes = 1 << 20;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("open ", path));
  std::string text;
  char buffer[4096];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return absl::ErrnoToStatus(error, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
    if (text.size() > kMaxBytes) {
      close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(path, " is over ", kMaxBytes, " bytes: not a credential file"));
    }
  }
  close(fd);
  return text;
}

}  // namespace trainctl
