// Reading a credential (a token file, a PEM key or certificate) so that no other process gets it
// by inheritance: the file is opened O_CLOEXEC and closed before returning, so a fork/exec that
// another thread makes meanwhile (a rank, nvidia-smi) does not inherit the open file.
#ifndef TRAINCTL_COMMON_CREDENTIAL_FILE_H_
#define TRAINCTL_COMMON_CREDENTIAL_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace trainctl {

// The whole file. The errno's code (NOT_FOUND, PERMISSION_DENIED, ...) with the path when it cannot
// be opened or read; INVALID_ARGUMENT for a file over 1 MiB (no credential is that large).
absl::StatusOr<std::string> ReadCredentialFile(const std::string& path);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_CREDENTIAL_FILE_H_
