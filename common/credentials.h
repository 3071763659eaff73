// TLS for trainctl's gRPC connections: the coordinator's server credentials and the channel
// credentials of the worker daemons and the CLI, built from PEM files named by --tls_cert,
// --tls_key and --tls_ca.
//
// The coordinator serves JobService (users, the CLI, scripts), WorkerService (worker daemons), the
// health service and reflection on ONE port. With --tls_ca it therefore asks every client for a
// certificate and verifies it against that CA when one is sent
// (GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY), but does not demand one at the handshake: CLI
// users and health probes without a client certificate can still connect and authenticate with a
// bearer token, while a worker session without a verified client certificate is refused by the
// coordinator's authorizer (coordinator/rpc_authorizer.h), which also checks that the worker's
// node name is one the certificate holds. `require_client_cert` makes the handshake itself demand a
// certificate from everyone (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY), for
// clusters where users hold certificates too. A certificate that does not verify (another CA,
// expired) fails the handshake either way: the client sees UNAVAILABLE.
#ifndef TRAINCTL_COMMON_CREDENTIALS_H_
#define TRAINCTL_COMMON_CREDENTIALS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainctl {

// Paths of PEM files; empty means not given.
struct TlsOptions {
  std::string cert;  // this side's certificate chain
  std::string key;   // its private key
  std::string ca;    // the CA that signs the peer's certificates
  // Server only: demand a client certificate at the handshake (see above).
  bool require_client_cert = false;

  // Whether any file is named (a server needs cert and key; a client needs at least one of them).
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// Insecure credentials when !tls.enabled(). Otherwise TLS with the files read and checked here, so
// a mistake is an INVALID_ARGUMENT naming the flag and the file rather than a failed handshake
// later: a file that cannot be read, holds no PEM block of the right kind (CERTIFICATE, PRIVATE
// KEY), a key that does not belong to the certificate, or a cert without a key (or the reverse).
// The server needs cert and key; `ca` turns on client certificates (see above).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls);

// The client's: `ca` verifies the coordinator's certificate (empty: the system's roots); cert and
// key, when given, are presented to the coordinator (a worker's identity).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsOptions& tls);

// The names a certificate holds, as the coordinator checks them: its subject's common name first
// (when it has one), then its other DNS subject alternative names. INVALID_ARGUMENT when `pem`
// holds no certificate.
absl::StatusOr<std::vector<std::string>> CertificateNames(const std::string& pem);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_CREDENTIALS_H_
