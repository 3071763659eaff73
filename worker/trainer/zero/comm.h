// The collectives the ZeRO engine needs, over one LibTorch c10d process group: NCCL in CUDA builds,
// Gloo on CPUs. Ranks rendezvous through a TCPStore from the torchrun-style launch environment
// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE: common/rank_env.h, read by the trainer's main).
//
// Every collective is asynchronous and returns a Handle; Wait() finishes it. Where a backend lacks
// a collective (Gloo has no reduce_scatter and no _allgather_base on LibTorch 1.13) the same result
// comes from another: reduce-scatter as all-reduce + slice, flat all-gather as a list all-gather
// into the rows of the flat buffer. Gloo's own alltoall_base serves all-to-all.
//
// Sub-groups (Subgroup) are Comms over a part of the world, for sequence parallelism
// (DeepSpeed-Ulysses, sequence_all_to_all.h): their own process group, rendezvoused through the
// parent's store.
//
// Failure: each collective is bounded by the timeout given at creation. When one fails (a peer's
// connection closed, or the timeout passed), Wait() throws CollectiveError naming the collective,
// what it carried, this rank, and the peer that is gone: every rank publishes a heartbeat to the
// store, and the ranks whose heartbeat stopped are named. The process group cannot be used after
// that; the trainer exits.
#ifndef TRAINCTL_WORKER_TRAINER_ZERO_COMM_H_
#define TRAINCTL_WORKER_TRAINER_ZERO_COMM_H_

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rank_env.h"
#include "worker/trainer/model/status_guard.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace trainctl::zero {

// A collective that failed: a peer is gone or the timeout passed. Guarded (model/status_guard.h)
// turns it into UNAVAILABLE.
class CollectiveError : public model::PeerFailure {
 public:
  using model::PeerFailure::PeerFailure;
};

struct CommOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // Bounds the rendezvous and every collective.
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  torch::Device device{torch::kCPU};  // CUDA: NCCL; CPU: Gloo
  // With world_size 1, still form a process group and run every collective through it (checks a
  // backend on one device); off, a lone rank's collectives are local copies.
  bool group_when_alone = false;
  // Gloo's interface: by name (GLOO_SOCKET_IFNAME) when set, else this node's address (the one
  // the worker advertises), else loopback when the rendezvous host is loopback, else this host's
  // name.
  std::string gloo_ifname;
  std::string node_addr;
};

// A rank's options from its launch environment (common/rank_env.h), timeout and device left at
// their defaults.
CommOptions RankCommOptions(const RankEnv& env);

class Comm;

// A collective in flight. Move-only; Wait() exactly once (a destroyed, unwaited handle waits).
class Handle {
 public:
  Handle() = default;
  Handle(Handle&&) noexcept;
  Handle& operator=(Handle&&) noexcept;
  ~Handle();

  // Blocks until the collective is done and its result is in place. Throws CollectiveError.
  // An NCCL collective on device tensors is stream-ordered instead: Wait() makes the current
  // CUDA stream wait for it and returns at once (no host synchronisation); a hung collective is
  // then ended by the NCCL watchdog after the group's timeout, which tears the process down.
  // The one way to finish a collective: code that returns a Status waits inside
  // model::Guarded, which turns CollectiveError into UNAVAILABLE.
  void Wait();
  bool pending() const { return comm_ != nullptr; }

 private:
  friend class Comm;
  const Comm* comm_ = nullptr;
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> finish_;  // copies a fallback's result into place
  std::string what_;
  std::chrono::steady_clock::time_point started_;
  bool stream_ordered_ = false;  // NCCL on device tensors: the wait does not block the host
};

class Comm {
 public:
  // Joins the group: with world_size 1 (unless group_when_alone) no process group exists and
  // collectives are local copies.
  // UNAVAILABLE naming the rendezvous address when the peers do not all arrive within the timeout.
  static absl::StatusOr<std::unique_ptr<Comm>> Create(const CommOptions& options);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // A Comm over part of the world, for the ranks in `ranks` (world ranks of this Comm, in the
  // order that gives their rank in the group). Collective over this Comm: every rank calls it,
  // the same number of times and in the same order, each passing the ranks of its own group;
  // the groups partition the world (e.g. {0, 1} on ranks 0 and 1, {2, 3} on ranks 2 and 3).
  // rank()/world_size() of the result are this rank's position in `ranks` and its size. A group
  // of one rank has no process group (its collectives are local copies, as Create's with world
  // size 1); a larger one has its own Gloo (CPU) or NCCL (CUDA) process group, with this Comm's
  // device, interface and timeout, rendezvoused through this Comm's store under a prefix made of
  // `name`, the group's first rank and the call's sequence number. A sub-group sends no
  // heartbeats: its failures name its peers by world rank from this Comm's heartbeats, so it must
  // not outlive this Comm (it holds references to the stores, which stay valid, but nobody beats
  // any more). failed() is shared by a Comm and every sub-group made from it; bytes_sent() and
  // wait_seconds() are each Comm's own.
  // INVALID_ARGUMENT when `ranks` is empty, repeats a rank, names one outside the world or leaves
  // this rank out; UNAVAILABLE naming the group when its rendezvous fails or times out.
  absl::StatusOr<std::unique_ptr<Comm>> Subgroup(const std::vector<int>& ranks,
                                                 const std::string& name);

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const std::string& backend() const { return backend_; }

  // out[world * shard.numel()] = every rank's shard, rank order. Same dtype and device.
  Handle AllGather(const torch::Tensor& shard, const torch::Tensor& out, const std::string& what);
  // out[S] = sum over ranks of in[rank * S, (rank + 1) * S). `in` ([world * S]) may be
  // overwritten.
  Handle ReduceScatter(const torch::Tensor& in, const torch::Tensor& out, const std::string& what);
  // In place: t = sum over ranks of t.
  Handle AllReduce(const torch::Tensor& t, const std::string& what);
  // In place: t = root's t.
  Handle Broadcast(const torch::Tensor& t, int root, const std::string& what);
  // Equal splits along dim 0: in ([world * c, ...]) chunk j goes to rank j; out (the same number
  // of elements, contiguous, its dim 0 a multiple of world) chunk i is what rank i sent here.
  // Same dtype and device; `in` must not be modified until the handle is waited for.
  Handle AllToAll(const torch::Tensor& in, const torch::Tensor& out, const std::string& what);
  void Barrier(const std::string& what);

  // Bytes this rank has sent, counted as a ring algorithm sends them: (W-1)/W of the buffer for an
  // all-gather, reduce-scatter or all-to-all, twice that for an all-reduce (what a fallback issues
  // is counted).
  uint64_t bytes_sent() const { return bytes_sent_.load(); }
  // Seconds the host has spent blocked in Handle::Wait: the collectives' time that compute did not
  // hide (stream-ordered NCCL waits return at once and count nothing).
  double wait_seconds() const { return static_cast<double>(wait_ns_.load()) * 1e-9; }

  // True once any collective on this Comm, its parent or a sub-group of either has failed. A
  // failed collective can leave the process group's threads waiting on a dead peer, and
  // destroying the group would wait for them: owners about to exit leak a failed Comm, and each
  // of its sub-groups, instead (see ReleaseIfFailed).
  bool failed() const { return failed_->load(); }

  // Blocking all-reduce (sum) of `t` in place; UNAVAILABLE naming `what` when it fails.
  absl::Status AllReduceSum(const torch::Tensor& t, const std::string& what);

 private:
  friend class Handle;
  Comm() = default;
  Handle Start(c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish, std::string what,
               uint64_t bytes) const;
  // Throws CollectiveError for `what`, explaining `cause` with which peers are gone.
  [[noreturn]] void Fail(const std::string& what, const std::string& cause,
                         std::chrono::steady_clock::time_point started) const;
  std::string DiagnosePeers() const;
  void HeartbeatLoop();
  // Forms this Comm's process group (options_'s rank, size and device) over `store`. Throws what
  // c10d throws; FAILED_PRECONDITION when the build lacks the backend.
  absl::Status JoinGroup(const c10::intrusive_ptr<c10d::Store>& store);
  // The world rank of this Comm's rank `r` (r itself unless this is a sub-group).
  int WorldRank(int r) const;

  struct Impl;
  CommOptions options_;
  std::string backend_ = "local";
  std::unique_ptr<Impl> impl_;
  mutable std::atomic<uint64_t> bytes_sent_{0};
  mutable std::atomic<uint64_t> wait_ns_{0};
  // Shared with the parent and the sub-groups: a dead peer breaks them all.
  std::shared_ptr<std::atomic<bool>> failed_ = std::make_shared<std::atomic<bool>>(false);
  uint64_t subgroups_made_ = 0;  // names each sub-group's rendezvous uniquely
};

// Destroys `comm` unless a collective on it failed, in which case it is leaked (the process is
// about to exit; see Comm::failed).
void ReleaseIfFailed(std::unique_ptr<Comm>& comm);

}  // namespace trainctl::zero

#endif  // TRAINCTL_WORKER_TRAINER_ZERO_COMM_H_
