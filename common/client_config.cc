#include "common/client_config.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainctl {
namespace {

constexpr absl::string_view kKeys[] = {"coordinator", "tls_ca", "tls_cert", "tls_key",
                                       "token_file"};

}  // namespace

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
