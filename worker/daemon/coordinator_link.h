// CoordinatorLink: where the worker's sessions go. The coordinators' addresses (one leads; the
// standbys take no connection until they do) are tried in turn, one per session attempt, each on a
// fresh channel with the worker's credentials (so TLS checks each coordinator's certificate
// against its own address) and the token, read again from its file before every attempt. Used by
// Worker::Run()'s thread only; not thread-safe.
#ifndef TRAINCTL_WORKER_DAEMON_COORDINATOR_LINK_H_
#define TRAINCTL_WORKER_DAEMON_COORDINATOR_LINK_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/channel_connect.h"

namespace trainctl::worker {

struct CoordinatorLinkOptions {
  std::vector<std::string> coordinators;                  // gRPC targets; never empty
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: plaintext
  std::string token;                                      // empty: none
  std::string token_file;  // when set, read again before every attempt (WorkerOptions)
  // How long an attempt waits for a coordinator that neither connects nor refuses (a host that
  // drops packets) before the next address gets its turn.
  absl::Duration connect_timeout = absl::Seconds(2);
};

class CoordinatorLink {
 public:
  explicit CoordinatorLink(CoordinatorLinkOptions options);

  struct Attempt {
    std::string address;
    // A fresh channel to `address`: a channel that failed to connect waits out its own back-off
    // before trying again, which would stretch the worker's (and a coordinator's recovery grace)
    // for nothing.
    std::shared_ptr<grpc::Channel> channel;
    // kReady, kFailed (a call on the channel now fails at once, saying why) or kSilent.
    ChannelReach reach = ChannelReach::kSilent;
  };
  // The next address in turn (the first at the start) and its channel, once it connected, failed
  // to, or connect_timeout passed.
  Attempt Connect();
  // After the attempt's session ended (`registered`: the coordinator had accepted it): whether to
  // wait out the back-off before the next attempt. True when the attempt completes a round, one
  // attempt at each address counting from the last session accepted; with one address, always.
  bool EndAttempt(bool registered);

  // The token for the next session: the token file read again when set (a read that fails keeps
  // the token read before, and is logged once).
  const std::string& Token();

 private:
  const CoordinatorLinkOptions options_;
  size_t next_ = 0;               // the index of the next address to try
  size_t in_round_ = 0;           // attempts in the current round
  std::string token_;             // the token last read
  std::string token_file_error_;  // the last read's error, logged once
};

}  // namespace trainctl::worker

#endif  // TRAINCTL_WORKER_DAEMON_COORDINATOR_LINK_H_
