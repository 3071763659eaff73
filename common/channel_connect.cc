#include "common/channel_connect.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace trainctl {

ChannelConnect ConnectFirst(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                            absl::Time deadline) {
  ChannelConnect result;
  result.reach.assign(channels.size(), ChannelReach::kSilent);
  std::vector<bool> decided(channels.size(), false);
  size_t pending = channels.size();
  while (pending > 0) {
    // One look at every channel still connecting; GetState(true) starts an idle one.
    int waiting_on = -1;
    grpc_connectivity_state waiting_state = GRPC_CHANNEL_IDLE;
    for (size_t i = 0; i < channels.size(); ++i) {
      if (decided[i]) continue;
      const grpc_connectivity_state state = channels[i]->GetState(/*try_to_connect=*/true);
      if (state == GRPC_CHANNEL_READY) {
        result.ready = static_cast<int>(i);
        result.reach[i] = ChannelReach::kReady;
        for (size_t j = 0; j < channels.size(); ++j) {
          if (!decided[j] && j != i) result.reach[j] = ChannelReach::kUntried;
        }
        return result;
      }
      if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) {
        decided[i] = true;
        result.reach[i] = ChannelReach::kFailed;
        --pending;
      } else if (waiting_on < 0) {
        waiting_on = static_cast<int>(i);
        waiting_state = state;
      }
    }
    if (pending == 0 || absl::Now() >= deadline) break;
    // Wakes at once when the first channel still connecting moves, and looks at the others every
    // few milliseconds.
    channels[waiting_on]->WaitForStateChange(
        waiting_state, absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Milliseconds(5))));
  }
  return result;
}

}  // namespace trainctl
