#include "common/client_config.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainctl {
namespace {

constexpr absl::string_view kKeys[] = {"coordinator", "tls_ca", "tls_cert", "tls_key",
                                       "token_file"};

constexpr absl::string_view kSchemes[] = {
    "dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:"};

}  // namespace

absl::StatusOr<std::string> CoordinatorTarget(absl::string_view address) {
  auto bad = [address](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("coordinator address '", address, "': ", why));
  };
  if (address.empty()) return bad("empty; want HOST[:PORT]");
  if (absl::StrContains(address, "://")) return std::string(address);
  for (absl::string_view scheme : kSchemes) {
    if (absl::StartsWith(address, scheme)) return std::string(address);
  }
  absl::string_view host = address, port;
  if (address.front() == '[') {
    const auto close = address.find(']');
    if (close == absl::string_view::npos) return bad("'[' without its ']'");
    host = address.substr(0, close + 1);
    absl::string_view rest = address.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return bad("want [IPV6]:PORT");
    port = rest.empty() ? rest : rest.substr(1);
    if (rest.empty()) return absl::StrCat(host, ":", kDefaultCoordinatorPort);
  } else if (const auto colon = address.find(':'); colon == absl::string_view::npos) {
    return absl::StrCat(address, ":", kDefaultCoordinatorPort);
  } else if (address.find(':', colon + 1) != absl::string_view::npos) {
    return absl::StrCat("[", address, "]:", kDefaultCoordinatorPort);  // a bare IPv6 address
  } else {
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  if (host.empty()) return bad("no host before the port");
  int number = 0;
  if (!absl::SimpleAtoi(port, &number) || number < 1 || number > 65535) {
    return bad(absl::StrCat("the port must be a number in 1-65535, got '", port, "'"));
  }
  return std::string(address);
}

absl::StatusOr<std::vector<std::string>> CoordinatorTargets(absl::string_view list) {
  std::vector<std::string> targets;
  int n = 0;
  for (absl::string_view item : absl::StrSplit(list, ',')) {
    ++n;
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("coordinator list '", list, "': item ", n,
                                                     " is empty; want HOST[:PORT],HOST[:PORT]"));
    }
    absl::StatusOr<std::string> target = CoordinatorTarget(item);
    if (!target.ok()) return target.status();
    if (std::find(targets.begin(), targets.end(), *target) != targets.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("coordinator address '", item, "': given twice (as ", *target, ")"));
    }
    targets.push_back(*std::move(target));
  }
  return targets;
}

absl::StatusOr<std::map<std::string, std::string>> ParseClientConfig(absl::string_view text,
                                                                     absl::string_view origin,
                                                                     const std::string& home) {
  std::map<std::string, std::string> config;
  int n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++n;
    if (const auto hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const auto eq = line.find('=');
    const absl::string_view key =
        absl::StripAsciiWhitespace(line.substr(0, std::min(eq, line.size())));
    const bool known = std::find(std::begin(kKeys), std::end(kKeys), key) != std::end(kKeys);
    if (eq == absl::string_view::npos || !known) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ":", n,
                       ": want 'key = value' with key coordinator, tls_ca, tls_cert, tls_key or "
                       "token_file, got '",
                       line, "'"));
    }
    std::string value(absl::StripAsciiWhitespace(line.substr(eq + 1)));
    if (!home.empty() && absl::StartsWith(value, "~/")) value = home + value.substr(1);
    config[std::string(key)] = std::move(value);
  }
  return config;
}

}  // namespace trainctl
