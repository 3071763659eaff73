#include "cli/connection.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/access_tokens.h"
#include "common/client_config.h"
#include "common/status_macros.h"

namespace trainctl::cli {
namespace {

std::string Getenv(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// The config file's settings by key; none when the file does not exist.
absl::StatusOr<std::map<std::string, std::string>> ReadConfig(const std::string& home) {
  if (home.empty()) return std::map<std::string, std::string>();
  const std::string path = home + "/.config/trainctl/config";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::map<std::string, std::string>();
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  return ParseClientConfig(text, path, home);
}

}  // namespace

ClientEnvironment ClientEnvironment::FromProcess() {
  ClientEnvironment env;
  env.coordinator = Getenv("TRAINCTL_COORDINATOR");
  env.tls_ca = Getenv("TRAINCTL_TLS_CA");
  env.tls_cert = Getenv("TRAINCTL_TLS_CERT");
  env.tls_key = Getenv("TRAINCTL_TLS_KEY");
  env.token = Getenv("TRAINCTL_TOKEN");
  env.home = Getenv("HOME");
  return env;
}

absl::StatusOr<Connection> ResolveConnection(const std::map<std::string, std::string>& flags,
                                             const ClientEnvironment& env) {
  ASSIGN_OR_RETURN(auto config, ReadConfig(env.home));
  auto pick = [&](const std::string& flag, const std::string& from_env) -> std::string {
    if (auto it = flags.find(flag); it != flags.end() && !it->second.empty()) return it->second;
    if (!from_env.empty()) return from_env;
    auto it = config.find(flag);
    return it == config.end() ? "" : it->second;
  };
  Connection c;
  if (std::string list = pick("coordinator", env.coordinator); !list.empty()) {
    ASSIGN_OR_RETURN(c.addresses, CoordinatorTargets(list));
  }
  c.tls.ca = pick("tls_ca", env.tls_ca);
  c.tls.cert = pick("tls_cert", env.tls_cert);
  c.tls.key = pick("tls_key", env.tls_key);
  ASSIGN_OR_RETURN(c.credentials, MakeChannelCredentials(c.tls));
  if (!env.token.empty()) {
    c.token = std::string(absl::StripAsciiWhitespace(env.token));
  } else if (auto it = config.find("token_file"); it != config.end()) {
    ASSIGN_OR_RETURN(c.token, ReadTokenFile(it->second));
  } else if (!env.home.empty()) {
    const std::string path = env.home + "/.config/trainctl/token";
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      ASSIGN_OR_RETURN(c.token, ReadTokenFile(path));
    }
  }
  return c;
}

std::vector<OptionSpec> ConnectionOptions() {
  return {{"coordinator", "", true},
          {"tls_ca", "", true},
          {"tls_cert", "", true},
          {"tls_key", "", true}};
}

bool AddConnectionOptions(std::vector<OptionSpec>* options) {
  const bool remote = std::any_of(options->begin(), options->end(),
                                  [](const OptionSpec& o) { return o.name == "coordinator"; });
  if (!remote) return false;
  for (OptionSpec& o : ConnectionOptions()) {
    if (o.name != "coordinator") options->push_back(std::move(o));
  }
  return true;
}

Connection PlaintextConnection(std::string address) {
  Connection c;
  c.addresses = {std::move(address)};
  c.credentials = grpc::InsecureChannelCredentials();
  return c;
}

}  // namespace trainctl::cli
