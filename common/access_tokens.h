// Bearer tokens and their roles. The coordinator's --tokens_file holds one line per token:
//
//   # subject  role    sha256 of the token, hex
//   alice      user    2bd806c97f0e00af1a1fc3328fa763a9269723c8db8fac4f93af71db186d6e90
//   node-1     worker  81b637d8fcd2c6da6359e6963113a1170de795e4b725b84d1e0b4cfd9ec58ce9
//
// Only hashes are stored: `printf %s "$TOKEN" | sha256sum` makes one. '#' starts a comment; blank
// lines are skipped. Clients send the token itself as `authorization: Bearer <token>` metadata.
// No gRPC here: the coordinator's authorizer (coordinator/rpc_authorizer.h) uses these.
#ifndef TRAINCTL_COMMON_ACCESS_TOKENS_H_
#define TRAINCTL_COMMON_ACCESS_TOKENS_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainctl {

// What a caller may do (the method table is in coordinator/rpc_authorizer.cc):
//   admin   everything
//   user    submit, cancel its own jobs, read
//   viewer  read
//   worker  the worker service only
enum class Role { kAdmin, kUser, kViewer, kWorker };

absl::string_view RoleName(Role role);
// INVALID_ARGUMENT listing the roles for anything else.
absl::StatusOr<Role> ParseRole(absl::string_view name);

// Lowercase hex SHA-256 of `data` (OpenSSL's libcrypto).
std::string Sha256Hex(absl::string_view data);

struct TokenHolder {
  std::string subject;  // who: recorded as the owner of the jobs it submits
  Role role = Role::kViewer;
};

// The tokens file, parsed. Immutable once built, so thread-safe.
class TokenTable {
 public:
  // Parses a tokens file's `text`; INVALID_ARGUMENT naming `origin` and the line for a line that
  // is not `subject role hash`, an unknown role, a hash that is not 64 hex digits, or a hash
  // listed twice.
  static absl::StatusOr<TokenTable> Parse(absl::string_view text, absl::string_view origin);
  // Reads and parses `path`; INVALID_ARGUMENT naming it when it cannot be read or holds no token.
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  // The holder of `token` (its hash is looked up); UNAUTHENTICATED when no line holds it.
  absl::StatusOr<TokenHolder> Authenticate(absl::string_view token) const;

  size_t size() const { return by_hash_.size(); }

 private:
  std::map<std::string, TokenHolder> by_hash_;
};

// A client's token file (~/.config/trainctl/token, the worker's --token_file): the token on its
// first non-empty line, surrounding whitespace removed. INVALID_ARGUMENT naming the path when it
// cannot be read or is empty.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_ACCESS_TOKENS_H_
