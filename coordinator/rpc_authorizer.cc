#include "coordinator/rpc_authorizer.h"

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace trainctl {
namespace {

// THE table: who may call what. Reads are open to every role but worker; a worker's token serves
// only its session.
const std::map<std::string, std::vector<Role>, std::less<>>& Rules() {
  static const auto* rules = [] {
    const std::vector<Role> read = {Role::kAdmin, Role::kUser, Role::kViewer};
    const std::vector<Role> write = {Role::kAdmin, Role::kUser};
    return new std::map<std::string, std::vector<Role>, std::less<>>{
        {"JobService/SubmitJob", write},
        {"JobService/CancelJob", write},  // a user: its own jobs only (JobServiceImpl)
        {"JobService/GetJob", read},
        {"JobService/ListJobs", read},
        {"JobService/WatchJob", read},
        {"JobService/StreamLogs", read},
        {"JobService/ListNodes", read},
        {"JobService/GetMetrics", read},
        {"JobService/DiagnoseJob", read},
        {"WorkerService/Session", {Role::kAdmin, Role::kWorker}},
    };
  }();
  return *rules;
}

std::string RoleList(const std::vector<Role>& roles) {
  return absl::StrJoin(roles, ", ",
                       [](std::string* out, Role r) { absl::StrAppend(out, RoleName(r)); });
}

// The bearer token of the call, or why there is none.
absl::StatusOr<std::string> BearerToken(const grpc::ServerContextBase& context,
                                        absl::string_view method) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(absl::StrCat(
        method,
        " needs a bearer token and the call carried none (authorization metadata): trainctl "
        "reads it from $TRAINCTL_TOKEN or ~/.config/trainctl/token, a worker from --token_file"));
  }
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&value, "Bearer ") || absl::StripAsciiWhitespace(value).empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat("the authorization metadata of ", method, " is not 'Bearer <token>'"));
  }
  return std::string(absl::StripAsciiWhitespace(value));
}

}  // namespace

RpcAuthorizer::RpcAuthorizer(AuthorizerOptions options)
    : tokens_on_(options.tokens.has_value()), client_certificates_(options.client_certificates) {
  if (tokens_on_) tokens_ = std::make_shared<const TokenTable>(*std::move(options.tokens));
}

absl::Status RpcAuthorizer::ReplaceTokens(TokenTable tokens) {
  if (!tokens_on_) {
    return absl::FailedPreconditionError(
        "the coordinator started without --tokens_file: authentication is off until a restart "
        "with one");
  }
  // Declared before the lock, so the old table it holds after the swap is freed after the unlock.
  auto table = std::make_shared<const TokenTable>(std::move(tokens));
  absl::MutexLock lock(&mu_);
  tokens_.swap(table);
  return absl::OkStatus();
}

const std::vector<Role>* RpcAuthorizer::AllowedRoles(absl::string_view method) {
  auto it = Rules().find(method);
  return it == Rules().end() ? nullptr : &it->second;
}

std::vector<std::string> PeerCertificateNames(const grpc::ServerContextBase& context) {
  std::vector<std::string> names;
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return names;
  for (const char* property : {"x509_common_name", "x509_subject_alternative_name"}) {
    for (const grpc::string_ref& value : auth->FindPropertyValues(property)) {
      std::string name(value.data(), value.size());
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        names.push_back(std::move(name));
      }
    }
  }
  return names;
}

absl::StatusOr<Caller> RpcAuthorizer::Authorize(const grpc::ServerContextBase& context,
                                                absl::string_view method) const {
  const std::vector<Role>* allowed = AllowedRoles(method);
  if (allowed == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("the coordinator has no access rule for ", method));
  }
  Caller caller;
  caller.certificate_names = PeerCertificateNames(context);
  if (!caller.certificate_names.empty()) caller.subject = caller.certificate_names.front();
  const bool worker_session = absl::StartsWith(method, "WorkerService/");
  if (worker_session && client_certificates_ && caller.certificate_names.empty()) {
    return absl::UnauthenticatedError(
        "a worker session needs a client certificate signed by the coordinator's --tls_ca "
        "(the worker's --tls_cert and --tls_key)");
  }
  if (!tokens_on_) return caller;
  auto token = BearerToken(context, method);
  if (!token.ok()) return token.status();
  std::shared_ptr<const TokenTable> tokens;
  {
    absl::MutexLock lock(&mu_);
    tokens = tokens_;
  }
  auto holder = tokens->Authenticate(*token);
  if (!holder.ok()) return holder.status();
  caller.subject = holder->subject;
  caller.role = holder->role;
  caller.authenticated = true;
  if (std::find(allowed->begin(), allowed->end(), caller.role) == allowed->end()) {
    return absl::PermissionDeniedError(absl::StrCat("role ", RoleName(caller.role), " (",
                                                    caller.subject, ") may not call ", method,
                                                    "; roles allowed: ", RoleList(*allowed)));
  }
  return caller;
}

absl::Status RpcAuthorizer::CheckNodeName(const Caller& caller, absl::string_view node) const {
  if (!client_certificates_) return absl::OkStatus();
  for (const std::string& name : caller.certificate_names) {
    if (name == node) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("node '", node, "' does not match the worker's client certificate, which holds ",
                   caller.certificate_names.empty() ? std::string("no name")
                                                    : absl::StrJoin(caller.certificate_names, ", "),
                   ": a worker registers under its certificate's common name or a DNS name of it"));
}

}  // namespace trainctl
