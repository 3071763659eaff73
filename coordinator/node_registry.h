// NodeRegistry: the coordinator's worker nodes, their sessions and their leases.
//
// A worker holds a lease on its node's name while it keeps talking: a node that sent nothing
// (heartbeats included) for `lease_timeout` is lost. Silence is timed from when a message
// *arrives* (MessageArrived, stamped on the gRPC thread), not from when the cluster's loop gets to
// it, and time the coordinator itself holds a worker's message (flow control: the stream reads the
// next one only when the last is released) never counts as silence. So a backed-up loop or store
// never costs a worker its lease.
//
// Who may take a name (MayRegister): a newcomer, the same worker process reconnecting (boot_id),
// or anyone once the holder's lease ran out; never a second process while the first lives.
//
// Threading: MessageArrived, MessageReleased and SessionEnded are thread-safe (gRPC threads);
// everything else belongs to the cluster's loop thread.
#ifndef TRAINCTL_COORDINATOR_NODE_REGISTRY_H_
#define TRAINCTL_COORDINATOR_NODE_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "coordinator/internal/ack_window.h"
#include "trainctl/v1/worker.pb.h"

namespace trainctl {

// The coordinator's end of one worker's stream. Thread-safe; Send never blocks (messages queue)
// and is a no-op once the stream has ended.
class WorkerChannel {
 public:
  virtual ~WorkerChannel() = default;
  virtual void Send(trainctl::v1::CoordinatorMessage message) = 0;
  // Ends the stream with `why` (not OK) as its status, after what was sent before.
  virtual void Close(const absl::Status& why) = 0;
};

// A worker message the loop applies itself (a task status, a warning) that waits until everything
// the same worker sent before it is stored, so a task's end is never recorded before its last
// lines. Its stream stays held (`done` not run) meanwhile.
struct ParkedMessage {
  int64_t session = 0;
  trainctl::v1::WorkerMessage message;
  std::function<void()> done;
};

struct WorkerNode {
  std::string name;
  std::string address;
  std::map<std::string, std::string> labels;
  int total_slots = 0;
  int gpus = 0;
  int64_t gpu_memory_bytes = 0;  // the smallest GPU's memory_total_bytes; 0 none or unknown
  int64_t session = 0;  // 0: no live stream
  std::shared_ptr<WorkerChannel> channel;
  absl::Time last_seen;  // as of the last message the loop handled; see NodeRegistry::LastSeen
  bool lost = false;
  std::string boot_id;
  // The highest seq (within boot_id) applied or handed to the event ingester: a message sent again
  // with a seq up to it is not applied twice.
  int64_t applied_seq = 0;
  internal::AckWindow acks;
  std::optional<ParkedMessage> parked;
  std::set<std::string> tasks;  // task ids placed here
  // Tasks this coordinator has ended or never knew that the worker still runs (being stopped):
  // their slots are not free until the worker says they ended.
  std::map<std::string, int> draining;
};

class NodeRegistry {
 public:
  // `lease_misses` (trainctl_node_lease_misses_total) may be null.
  NodeRegistry(absl::Duration lease_timeout, prometheus::Counter* lease_misses)
      : lease_timeout_(lease_timeout), lease_misses_(lease_misses) {}

  // Thread-safe. A message of `session` arrived at `now`; the session counts as heard from until it
  // is released.
  void MessageArrived(int64_t session, absl::Time now);
  // Thread-safe. The coordinator is done with the session's message at `now` (it reads the next).
  void MessageReleased(int64_t session, absl::Time now);
  // Thread-safe. The stream ended: its silence counts from its last message on.
  void SessionEnded(int64_t session);

  // Loop thread from here on.
  void AddSession(int64_t session, std::shared_ptr<WorkerChannel> channel);
  // The stream's channel, or null once it ended or was closed.
  std::shared_ptr<WorkerChannel> SessionChannel(int64_t session) const;
  // Forgets the stream (after Disconnect, or after closing it).
  void RemoveSession(int64_t session);

  // OK, or why `reg` may not take its node's name on `session` (INVALID_ARGUMENT for a bad
  // register, FAILED_PRECONDITION for a second register, ALREADY_EXISTS while another worker
  // process holds the lease). Closes the stream of a holder that is being replaced.
  absl::Status MayRegister(int64_t session, const trainctl::v1::RegisterWorker& reg,
                           absl::Time now);
  // Records the register (after MayRegister) and returns the node. A new boot_id starts its seqs
  // (and its acks) afresh. `*was_lost`: the node had been lost.
  WorkerNode& Register(int64_t session, const trainctl::v1::RegisterWorker& reg, absl::Time now,
                       bool* was_lost);

  WorkerNode* ForSession(int64_t session);
  WorkerNode* Find(const std::string& name);
  std::map<std::string, WorkerNode>& nodes() { return nodes_; }

  // When the node was last heard from (its last message's arrival, or the release of one the
  // coordinator held); `now` while the coordinator holds one of its messages.
  absl::Time LastSeen(const WorkerNode& node, absl::Time now) const;
  // Nodes not lost whose lease ran out at `now`, each counted as a lease miss, with how long they
  // were silent. The caller loses them (Cluster::ExpireLeases, GangRunner::NodeLost).
  std::vector<std::pair<std::string, absl::Duration>> ExpiredLeases(absl::Time now);

  // The node's stream is gone (closed by the coordinator or ended): it keeps its lease until it
  // runs out, and a message parked on that stream is released (the worker sends it again).
  void Detach(WorkerNode& node);

 private:
  struct Heard {
    absl::Time last;
    bool holding = false;  // the coordinator holds a message of this session
  };

  const absl::Duration lease_timeout_;
  prometheus::Counter* const lease_misses_;

  mutable absl::Mutex heard_mu_;
  std::map<int64_t, Heard> heard_ ABSL_GUARDED_BY(heard_mu_);

  std::map<int64_t, std::shared_ptr<WorkerChannel>> sessions_;
  std::map<std::string, WorkerNode> nodes_;
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_NODE_REGISTRY_H_
