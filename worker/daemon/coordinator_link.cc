#include "worker/daemon/coordinator_link.h"

#include <utility>

#include "absl/time/clock.h"
#include "common/access_tokens.h"
#include "common/logging.h"

namespace trainctl::worker {

CoordinatorLink::CoordinatorLink(CoordinatorLinkOptions options)
    : options_(std::move(options)), token_(options_.token) {}

CoordinatorLink::Attempt CoordinatorLink::Connect() {
  Attempt attempt;
  attempt.address = options_.coordinators[next_];
  next_ = (next_ + 1) % options_.coordinators.size();
  grpc::ChannelArguments args;
  // Notice a coordinator that vanished without closing the connection (a partition, a dead host).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  attempt.channel = grpc::CreateCustomChannel(
      attempt.address,
      options_.credentials != nullptr ? options_.credentials : grpc::InsecureChannelCredentials(),
      args);
  const ChannelConnect connect =
      ConnectFirst({attempt.channel}, absl::Now() + options_.connect_timeout);
  attempt.reach = connect.reach[0];
  return attempt;
}

bool CoordinatorLink::EndAttempt(bool registered) {
  // A session that was accepted and ended starts a new round: the other addresses are tried at
  // once (one of them may lead now), then the back-off comes.
  in_round_ = registered ? 1 : in_round_ + 1;
  if (in_round_ < options_.coordinators.size()) return false;
  in_round_ = 0;
  return true;
}

const std::string& CoordinatorLink::Token() {
  if (options_.token_file.empty()) return token_;
  absl::StatusOr<std::string> token = ReadTokenFile(options_.token_file);
  if (!token.ok()) {
    if (token.status().message() != token_file_error_) {
      token_file_error_ = std::string(token.status().message());
      TRAINCTL_LOG(WARNING) << "--token_file: " << token_file_error_
                            << "; the sessions keep the token read before";
    }
    return token_;
  }
  token_file_error_.clear();
  if (*token != token_) {
    if (!token_.empty()) {
      TRAINCTL_LOG(INFO) << "--token_file " << options_.token_file
                         << " holds a new token: this session uses it";
    }
    token_ = *std::move(token);
  }
  return token_;
}

}  // namespace trainctl::worker
