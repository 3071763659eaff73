// RpcAuthorizer: who may call which of the coordinator's RPCs. Every JobService and WorkerService
// handler asks it first (JobServiceImpl::RunUnary and the stream handlers, WorkerServiceImpl::
// Session), with the method's name ("JobService/SubmitJob"); the method → roles table lives in
// rpc_authorizer.cc and nowhere else. A method missing from the table is refused, so a new RPC
// cannot be served without a rule (tests/coordinator/auth_test.cc checks the table covers every
// method the protos define).
//
// - No tokens file: every caller may call every method (trainctl before issue 15); the caller's
//   subject is its verified client certificate's common name, if it sent one.
// - A tokens file (common/access_tokens.h): a call needs `authorization: Bearer <token>` metadata
//   naming a listed token (else UNAUTHENTICATED saying what is missing or wrong) whose role the
//   method's rule allows (else PERMISSION_DENIED naming the role and the method).
// - Client certificates on (the server has --tls_ca): a worker session needs a verified client
//   certificate (else UNAUTHENTICATED), and the node it registers must be a name the certificate
//   holds (CheckNodeName).
// gRPC's health service and reflection are not trainctl's and are served without either check, so
// load balancers and probes reach them with no token.
//
// The tokens can be replaced while serving (ReplaceTokens: the coordinator reads its tokens file
// again on SIGHUP); everything else is fixed when built. Thread-safe.
#ifndef TRAINCTL_COORDINATOR_RPC_AUTHORIZER_H_
#define TRAINCTL_COORDINATOR_RPC_AUTHORIZER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/access_tokens.h"

namespace trainctl {

// The caller of one RPC, once authorized.
struct Caller {
  // The token's subject; without tokens, the client certificate's common name; else "".
  std::string subject;
  // What it may do; admin when tokens are off.
  Role role = Role::kAdmin;
  // Whether the role came from a token (false: authentication is off).
  bool authenticated = false;
  // A verified client certificate's common name then its subject alternative names; empty when
  // the caller sent none.
  std::vector<std::string> certificate_names;
};

struct AuthorizerOptions {
  std::optional<TokenTable> tokens;  // none: tokens are off
  bool client_certificates = false;  // the server verifies client certificates (--tls_ca)
};

class RpcAuthorizer {
 public:
  // Allows everything (no tokens, no client certificates).
  RpcAuthorizer() = default;
  explicit RpcAuthorizer(AuthorizerOptions options);

  // The caller of `method` ("JobService/SubmitJob") on `context`, or why it may not call it
  // (UNAUTHENTICATED, PERMISSION_DENIED; see above).
  absl::StatusOr<Caller> Authorize(const grpc::ServerContextBase& context,
                                   absl::string_view method) const;

  // OK when `node` (a worker's RegisterWorker.node_name) may be registered by `caller`: always
  // without client certificates; else when it is one of the certificate's names
  // (PERMISSION_DENIED naming the names the certificate holds).
  absl::Status CheckNodeName(const Caller& caller, absl::string_view node) const;

  // Whether `caller` may cancel jobs it does not own: admins may, users only their own (the
  // table lets no other role cancel); anyone may when tokens are off.
  static bool MayCancelAnyJob(const Caller& caller) {
    return !caller.authenticated || caller.role == Role::kAdmin;
  }

  bool tokens_on() const { return tokens_on_; }

  // Puts `tokens` in place of the current table, for the calls authorized from now on; calls and
  // streams already authorized (a worker's session, a watch) keep going under the old one.
  // FAILED_PRECONDITION when tokens are off: turning authentication on takes a restart, so a
  // reload can never be what opens or closes the coordinator.
  absl::Status ReplaceTokens(TokenTable tokens);

  // The roles that may call `method`, or nullptr when the table has no rule for it.
  static const std::vector<Role>* AllowedRoles(absl::string_view method);

 private:
  bool tokens_on_ = false;
  bool client_certificates_ = false;
  mutable absl::Mutex mu_;
  std::shared_ptr<const TokenTable> tokens_ ABSL_GUARDED_BY(mu_);
};

// A verified client certificate's common name then subject alternative names, from the call's
// auth context; empty without one (plaintext, or TLS without a client certificate).
std::vector<std::string> PeerCertificateNames(const grpc::ServerContextBase& context);

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_RPC_AUTHORIZER_H_
