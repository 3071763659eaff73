// Where trainctl finds its coordinator and its credentials, read in this one place. For each
// setting the first that names it wins:
//   1. the command line: --coordinator, --tls_ca, --tls_cert, --tls_key (before or after the verb)
//   2. the environment: TRAINCTL_COORDINATOR, TRAINCTL_TLS_CA, TRAINCTL_TLS_CERT,
//      TRAINCTL_TLS_KEY, TRAINCTL_TOKEN (the token itself)
//   3. the config file $HOME/.config/trainctl/config: `key = value` lines (coordinator, tls_ca,
//      tls_cert, tls_key, token_file), '#' comments; a leading ~/ in a path is $HOME
//   4. defaults: 127.0.0.1:50051, plaintext, and the token in $HOME/.config/trainctl/token when
//      that file exists (none otherwise)
// The coordinator setting is one address or a comma-separated list of them (an active coordinator
// and its standbys: JobClient calls the one that takes the connection); an address without a port
// gets 50051 (common/client_config.h: CoordinatorTargets).
// TLS is on when a CA, certificate or key is named; the token goes with every call as
// `authorization: Bearer <token>` metadata.
#ifndef TRAINCTL_CLI_CONNECTION_H_
#define TRAINCTL_CLI_CONNECTION_H_

#include <grpcpp/security/credentials.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/credentials.h"
#include "common/verb_args.h"

namespace trainctl::cli {

// The process environment trainctl reads (step 2, and HOME for steps 3-4); tests build their own.
struct ClientEnvironment {
  std::string coordinator;  // TRAINCTL_COORDINATOR
  std::string tls_ca;       // TRAINCTL_TLS_CA
  std::string tls_cert;     // TRAINCTL_TLS_CERT
  std::string tls_key;      // TRAINCTL_TLS_KEY
  std::string token;        // TRAINCTL_TOKEN
  std::string home;         // HOME; empty: no config file, no token file

  // From this process's environment variables.
  static ClientEnvironment FromProcess();
};

// How to reach the coordinator.
struct Connection {
  // gRPC targets, in the order given; never empty once resolved. The same credentials and token
  // go to each (TLS checks each coordinator's certificate against its own address).
  std::vector<std::string> addresses = {"127.0.0.1:50051"};
  TlsOptions tls;
  std::string token;                                      // empty: none sent
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // never null once resolved
};

// The settings by the order above, from `flags` (long names without dashes; others ignored) and
// `env`. INVALID_ARGUMENT naming the address for a coordinator list CoordinatorTargets refuses,
// naming the file and line for a config file line that is not `key =
// value` with a known key, and naming the flag and file for a certificate, key or token file that
// cannot be read or is not PEM (common/credentials.h).
absl::StatusOr<Connection> ResolveConnection(const std::map<std::string, std::string>& flags,
                                             const ClientEnvironment& env);

// The connection options every verb that talks to the coordinator takes (step 1), before or
// after the verb: coordinator, tls_ca, tls_cert, tls_key.
std::vector<OptionSpec> ConnectionOptions();
// Whether a verb with `options` talks to the coordinator (takes --coordinator); if so, adds the
// other connection options to them.
bool AddConnectionOptions(std::vector<OptionSpec>* options);

// Insecure, no token, the one coordinator at `address`: what tests and older callers use.
Connection PlaintextConnection(std::string address);

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_CONNECTION_H_
