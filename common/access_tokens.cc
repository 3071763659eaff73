#include "common/access_tokens.h"

#include <openssl/evp.h>

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/credential_file.h"

namespace trainctl {

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kUser:
      return "user";
    case Role::kViewer:
      return "viewer";
    case Role::kWorker:
      return "worker";
  }
  return "unknown";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role role : {Role::kAdmin, Role::kUser, Role::kViewer, Role::kWorker}) {
    if (name == RoleName(role)) return role;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown role '", name, "' (admin, user, viewer or worker)"));
}

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(data.data(), data.size(), digest, &size, EVP_sha256(), nullptr);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), size));
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text, absl::string_view origin) {
  TokenTable table;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (const auto hash = line.find('#'); hash != absl::string_view::npos)
      line = line.substr(0, hash);
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    const std::string where = absl::StrCat(origin, ":", line_number, ": ");
    if (fields.size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "want 'SUBJECT ROLE SHA256-HEX', got ", fields.size(), " fields"));
    }
    auto role = ParseRole(fields[1]);
    if (!role.ok()) return absl::InvalidArgumentError(absl::StrCat(where, role.status().message()));
    std::string digest = absl::AsciiStrToLower(fields[2]);
    if (digest.size() != 64 || digest.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       "the third field must be the token's SHA-256 as 64 hex digits (printf %s "
                       "\"$TOKEN\" | sha256sum), never the token itself"));
    }
    TokenHolder holder{std::string(fields[0]), *role};
    if (!table.by_hash_.emplace(std::move(digest), std::move(holder)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "this token hash is listed twice (one token, one subject)"));
    }
  }
  return table;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  absl::StatusOr<std::string> text = ReadCredentialFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokens_file: cannot read ", path,
                     " (missing or not readable): ", text.status().message()));
  }
  auto table = Parse(*text, path);
  if (!table.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--tokens_file: ", table.status().message()));
  }
  if (table->size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokens_file: ", path, " holds no token (omit the flag to turn authentication off)"));
  }
  return table;
}

absl::StatusOr<TokenHolder> TokenTable::Authenticate(absl::string_view token) const {
  auto it = by_hash_.find(Sha256Hex(token));
  if (it == by_hash_.end()) {
    return absl::UnauthenticatedError(
        "the bearer token is not one the coordinator's tokens file lists (wrong or revoked "
        "token)");
  }
  return it->second;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadCredentialFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the token file ", path,
                     " (missing or not readable): ", text.status().message()));
  }
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    absl::string_view token = absl::StripAsciiWhitespace(line);
    if (!token.empty()) return std::string(token);
  }
  return absl::InvalidArgumentError(absl::StrCat("the token file ", path, " is empty"));
}

}  // namespace trainctl
