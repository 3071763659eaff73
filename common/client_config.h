// trainctl's client config file, $HOME/.config/trainctl/config (cli/connection.h says where each
// setting may come from and which wins): `key = value` lines with the keys coordinator, tls_ca,
// tls_cert, tls_key and token_file; '#' starts a comment, blank lines are skipped, a key given
// twice keeps its last value, and a value starting with ~/ is under `home`.
#ifndef TRAINCTL_COMMON_CLIENT_CONFIG_H_
#define TRAINCTL_COMMON_CLIENT_CONFIG_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainctl {

// The settings of a config file's `text` by key. INVALID_ARGUMENT naming `origin` and the line for
// a line that is not `key = value` with a known key.
absl::StatusOr<std::map<std::string, std::string>> ParseClientConfig(absl::string_view text,
                                                                     absl::string_view origin,
                                                                     const std::string& home);

// The coordinator's port when an address names none (the README's and the daemons' default).
inline constexpr int kDefaultCoordinatorPort = 50051;

// `address` as a gRPC target: `host` and `[v6]` (and a bare IPv6 address) get
// kDefaultCoordinatorPort, which gRPC's resolver would otherwise take to be 443; `host:port` must
// have a port in 1-65535; a target with a scheme (dns:, unix:, ipv4:, ipv6:, vsock:, or `x://`)
// passes as it is. INVALID_ARGUMENT naming the address otherwise.
absl::StatusOr<std::string> CoordinatorTarget(absl::string_view address);

// A comma-separated list of coordinator addresses (active and standbys, e.g.
// `10.0.0.1:50051,10.0.0.2`), each as CoordinatorTarget makes it, in the list's order; whitespace
// around an item is ignored. INVALID_ARGUMENT naming the item for an empty item, an address
// CoordinatorTarget refuses, or one that names the same target as an earlier item.
absl::StatusOr<std::vector<std::string>> CoordinatorTargets(absl::string_view list);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_CLIENT_CONFIG_H_
