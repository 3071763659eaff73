// trainctl's client config file, $HOME/.config/trainctl/config (cli/connection.h says where each
// setting may come from and which wins): `key = value` lines with the keys coordinator, tls_ca,
// tls_cert, tls_key and token_file; '#' starts a comment, blank lines are skipped, a key given
// twice keeps its last value, and a value starting with ~/ is under `home`.
#ifndef TRAINCTL_COMMON_CLIENT_CONFIG_H_
#define TRAINCTL_COMMON_CLIENT_CONFIG_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainctl {

// The settings of a config file's `text` by key. INVALID_ARGUMENT naming `origin` and the line for
// a line that is not `key = value` with a known key.
absl::StatusOr<std::map<std::string, std::string>> ParseClientConfig(absl::string_view text,
                                                                     absl::string_view origin,
                                                                     const std::string& home);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_CLIENT_CONFIG_H_
