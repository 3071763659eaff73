// Reaching a coordinator among several (one active, standbys that take no connection until they
// lead: docs/deploy.md): clients connect before they call, so an address that took no connection
// can be passed over knowing that no call of theirs ever reached it.
#ifndef TRAINCTL_COMMON_CHANNEL_CONNECT_H_
#define TRAINCTL_COMMON_CHANNEL_CONNECT_H_

#include <grpcpp/channel.h>

#include <memory>
#include <vector>

#include "absl/time/time.h"

namespace trainctl {

// How a channel's attempt to connect went.
enum class ChannelReach {
  kReady,    // connected
  kFailed,   // the attempt failed: refused, no such host, the handshake failed or was closed
  kSilent,   // still connecting when the deadline came (a host that drops packets)
  kUntried,  // another channel connected first; this one was not waited for
};

struct ChannelConnect {
  int ready = -1;                   // the index of the channel to use; -1: none connected
  std::vector<ChannelReach> reach;  // by index
};

// Starts every channel connecting at once (none is sent a call) and waits until one is READY, or
// every one has failed, or `deadline` passes. When several are READY at the same look, the first
// in `channels`' order wins, so the caller orders them by preference. A channel already in
// TRANSIENT_FAILURE (it failed before and is waiting out gRPC's back-off) counts as failed at once.
// Thread-safe as gRPC channels are.
ChannelConnect ConnectFirst(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                            absl::Time deadline);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_CHANNEL_CONNECT_H_
