#include "worker/trainer/zero/comm.h"

#include <torch/version.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

// Debian's LibTorch ships Gloo's headers; the CUDA wheels of PyTorch do not (their c10d Gloo
// header cannot be compiled outside PyTorch's tree), so a CUDA build may have NCCL alone.
#if __has_include(<gloo/config.h>)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#define TRAINCTL_HAVE_GLOO 1
#endif

#if defined(USE_C10D_NCCL) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define TRAINCTL_HAVE_NCCL 1
#endif

#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainctl::zero {
namespace {

// LibTorch 2.x split ProcessGroup into a dispatcher and per-backend Backends; the collectives
// this file calls have the same names and arguments on both.
#if TORCH_VERSION_MAJOR >= 2
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

constexpr char kHeartbeatPrefix[] = "trainctl/heartbeat/";
constexpr auto kHeartbeatEvery = std::chrono::milliseconds(300);

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

CommOptions RankCommOptions(const RankEnv& env) {
  CommOptions options;
  options.rank = env.rank;
  options.world_size = env.world_size;
  options.master_addr = env.master_addr;
  options.master_port = env.master_port;
  options.group_when_alone = env.single_rank_group;
  options.gloo_ifname = env.gloo_socket_ifname;
  options.node_addr = env.node_addr;
  return options;
}

struct Comm::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<BackendBase> group;
  bool native_reduce_scatter = false;  // NCCL: _reduce_scatter_base / _allgather_base
  // A sub-group's name and the world rank of each of its ranks; empty for the world.
  std::string group_name;
  std::vector<int> world_ranks;

  // Heartbeats go through a second store client, so a collective stuck on the first never delays
  // them. A sub-group shares its parent's client and has no heartbeat thread.
  c10::intrusive_ptr<c10d::Store> heartbeat_store;
  std::thread heartbeat;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
};

absl::StatusOr<std::unique_ptr<Comm>> Comm::Create(const CommOptions& options) {
  std::unique_ptr<Comm> comm(new Comm());
  comm->options_ = options;
  comm->impl_ = std::make_unique<Impl>();
  if (options.world_size == 1 && !options.group_when_alone) return comm;

  Impl& impl = *comm->impl_;
  const std::string where = absl::StrCat(options.master_addr, ":", options.master_port);
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(options.master_port);
    store_options.isServer = options.rank == 0;
    store_options.numWorkers = static_cast<size_t>(options.world_size);
    store_options.waitWorkers = true;
    store_options.timeout = options.timeout;
    impl.store = c10::make_intrusive<c10d::TCPStore>(options.master_addr, store_options);
    c10d::TCPStoreOptions heartbeat_options = store_options;
    heartbeat_options.isServer = false;
    heartbeat_options.numWorkers = c10::nullopt;
    heartbeat_options.waitWorkers = false;
    heartbeat_options.timeout = std::chrono::seconds(5);
    impl.heartbeat_store =
        c10::make_intrusive<c10d::TCPStore>(options.master_addr, heartbeat_options);

    if (absl::Status joined = comm->JoinGroup(impl.store); !joined.ok()) return joined;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", options.rank, " of ", options.world_size,
                                               ": rendezvous at ", where, " failed: ", e.what()));
  }
  Comm* raw = comm.get();
  impl.heartbeat = std::thread([raw] { raw->HeartbeatLoop(); });
  return comm;
}

absl::Status Comm::JoinGroup(const c10::intrusive_ptr<c10d::Store>& store) {
  if (options_.device.is_cuda()) {
#ifdef TRAINCTL_HAVE_NCCL
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = options_.timeout;
    impl_->group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, options_.rank,
                                                               options_.world_size, nccl_options);
    impl_->native_reduce_scatter = true;
    backend_ = "nccl";
#else
    return absl::FailedPreconditionError(
        "this trainer was built against a LibTorch without NCCL; CUDA ranks need it");
#endif
  } else {
#ifdef TRAINCTL_HAVE_GLOO
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(options_.timeout);
    // The interface by name, as PyTorch's GLOO_SOCKET_IFNAME; else the node's advertised address.
    if (!options_.gloo_ifname.empty()) {
      gloo_options->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForInterface(options_.gloo_ifname));
    } else if (!options_.node_addr.empty()) {
      gloo_options->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForHostname(options_.node_addr));
    } else if (options_.master_addr == "127.0.0.1" || options_.master_addr == "localhost") {
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    } else {
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    gloo_options->threads = 2;
    impl_->group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, options_.rank,
                                                               options_.world_size, gloo_options);
    backend_ = "gloo";
#else
    return absl::FailedPreconditionError(
        "this trainer was built against a LibTorch without Gloo (PyTorch's CUDA wheels ship no "
        "Gloo headers); CPU ranks need a build against a LibTorch that has it");
#endif
  }
  return absl::OkStatus();
}

int Comm::WorldRank(int r) const {
  return impl_->world_ranks.empty() ? r : impl_->world_ranks[static_cast<size_t>(r)];
}

absl::StatusOr<std::unique_ptr<Comm>> Comm::Subgroup(const std::vector<int>& ranks,
                                                     const std::string& name) {
  const std::string group = absl::StrCat("group ", name, " [", absl::StrJoin(ranks, ", "), "]");
  int position = -1;
  std::set<int> seen;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world_size() || !seen.insert(ranks[i]).second) {
      return absl::InvalidArgumentError(absl::StrCat(group, ": ranks must be distinct and in [0, ",
                                                     world_size(), "); got ", ranks[i]));
    }
    if (ranks[i] == rank()) position = static_cast<int>(i);
  }
  if (position < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(group, " leaves out rank ", rank(), ", which called for it"));
  }
  const uint64_t sequence = subgroups_made_++;
  std::unique_ptr<Comm> sub(new Comm());
  sub->options_ = options_;
  sub->options_.rank = position;
  sub->options_.world_size = static_cast<int>(ranks.size());
  sub->options_.group_when_alone = false;
  sub->failed_ = failed_;
  sub->impl_ = std::make_unique<Impl>();
  Impl& impl = *sub->impl_;
  impl.group_name = name;
  for (int r : ranks) impl.world_ranks.push_back(WorldRank(r));
  impl.heartbeat_store = impl_->heartbeat_store;
  if (ranks.size() == 1) return sub;
  try {
    // Distinct prefixes keep each group's rendezvous keys apart in the shared store.
    impl.store = c10::make_intrusive<c10d::PrefixStore>(
        absl::StrCat("trainctl/group/", name, "/", ranks.front(), "/", sequence), impl_->store);
    if (absl::Status joined = sub->JoinGroup(impl.store); !joined.ok()) return joined;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", rank(), " of ", world_size(), ": ", group,
                                               ": rendezvous failed: ", e.what()));
  }
  return sub;
}

Comm::~Comm() {
  if (impl_ && impl_->heartbeat.joinable()) {
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      impl_->stop = true;
    }
    impl_->cv.notify_all();
    impl_->heartbeat.join();
  }
}

void Comm::HeartbeatLoop() {
  const std::string key = absl::StrCat(kHeartbeatPrefix, options_.rank);
  std::unique_lock<std::mutex> lock(impl_->mu);
  while (!impl_->stop) {
    try {
      impl_->heartbeat_store->add(key, 1);
    } catch (const std::exception&) {
      return;  // the store is gone (rank 0 exited); collectives will say so
    }
    impl_->cv.wait_for(lock, kHeartbeatEvery, [this] { return impl_->stop; });
  }
}

std::string Comm::DiagnosePeers() const {
  // Two readings of every peer's heartbeat counter, five beats apart: a counter that did not move
  // belongs to a rank that is gone (or stopped). The first waits a beat, so that a beat a peer
  // sent just before it died (still queued at the store when its collective failed here) is
  // counted before it, not between the two.
  // Heartbeats are keyed by world rank; a sub-group reads its members' through its parent's.
  auto read = [&](std::map<int, int64_t>* out) {
    for (int r = 0; r < options_.world_size; ++r) {
      if (r == options_.rank) continue;
      const int world = WorldRank(r);
      (*out)[world] = impl_->heartbeat_store->add(absl::StrCat(kHeartbeatPrefix, world), 0);
    }
  };
  std::map<int, int64_t> before, after;
  try {
    std::this_thread::sleep_for(kHeartbeatEvery);
    read(&before);
    std::this_thread::sleep_for(kHeartbeatEvery * 5);
    read(&after);
  } catch (const std::exception&) {
    return absl::StrCat("peer rank 0 is gone (its rendezvous store at ", options_.master_addr, ":",
                        options_.master_port, " does not answer)");
  }
  std::vector<std::string> dead;
  for (const auto& [r, count] : after) {
    if (count == before[r]) dead.push_back(absl::StrCat(r));
  }
  if (dead.empty()) return "every peer is still alive";
  const char* noun = impl_->world_ranks.empty() ? "rank" : "world rank";
  return absl::StrCat("peer ", noun, dead.size() == 1 ? " " : "s ", absl::StrJoin(dead, ", "),
                      dead.size() == 1 ? " is" : " are", " gone (no heartbeat for ",
                      Seconds(kHeartbeatEvery * 5), " s)");
}

void Comm::Fail(const std::string& what, const std::string& cause,
                std::chrono::steady_clock::time_point started) const {
  const double after = Seconds(std::chrono::steady_clock::now() - started);
  *failed_ = true;
  const std::string in_group = impl_->world_ranks.empty()
                                   ? ""
                                   : absl::StrCat(" of group ", impl_->group_name, " (world rank ",
                                                  WorldRank(options_.rank), ")");
  throw CollectiveError(absl::StrCat("collective ", what, " failed on rank ", options_.rank, " of ",
                                     options_.world_size, in_group, " after ", after,
                                     " s: ", DiagnosePeers(), "; ", backend_, ": ", cause));
}

Handle::Handle(Handle&& other) noexcept { *this = std::move(other); }

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    if (pending()) {
      try {
        Wait();
      } catch (...) {
      }
    }
    comm_ = std::exchange(other.comm_, nullptr);
    work_ = std::move(other.work_);
    finish_ = std::move(other.finish_);
    what_ = std::move(other.what_);
    started_ = other.started_;
    stream_ordered_ = other.stream_ordered_;
  }
  return *this;
}

Handle::~Handle() {
  if (pending()) {
    try {
      Wait();
    } catch (...) {
    }
  }
}

absl::Status Comm::AllReduceSum(const torch::Tensor& t, const std::string& what) {
  return model::Guarded("", [&] { AllReduce(t, what).Wait(); });
}

void ReleaseIfFailed(std::unique_ptr<Comm>& comm) {
  if (comm && comm->failed()) (void)comm.release();
}

void Handle::Wait() {
  if (comm_ == nullptr) return;
  const Comm* comm = std::exchange(comm_, nullptr);
  if (work_) {
    const auto waiting = std::chrono::steady_clock::now();
    bool ok = false;
    std::string cause;
    try {
      // With a timeout, ProcessGroupNCCL's wait blocks the host until the collective is done
      // (polling every millisecond): every gather and reduce-scatter of a step would then drain
      // the GPU's queue. Without one it only orders the current stream after the collective.
      ok = stream_ordered_ ? work_->wait() : work_->wait(comm->options_.timeout);
      if (!ok) cause = "timed out";
    } catch (const std::exception& e) {
      cause = e.what();
      // Gloo's messages start with a source location in brackets, and c10's end with a
      // backtrace; keep the sentence between.
      if (!cause.empty() && cause.front() == '[') {
        const auto close = cause.find("] ");
        if (close != std::string::npos) cause = cause.substr(close + 2);
      }
      if (const auto trace = cause.find("\nException raised from"); trace != std::string::npos) {
        cause.resize(trace);
      }
    }
    work_.reset();
    comm->wait_ns_ += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::steady_clock::now() - waiting)
                                                .count());
    if (!ok) comm->Fail(what_, cause, started_);
  }
  if (finish_) std::exchange(finish_, nullptr)();
}

Handle Comm::Start(c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish,
                   std::string what, uint64_t bytes) const {
  bytes_sent_ += bytes;
  Handle h;
  h.comm_ = this;
  h.work_ = std::move(work);
  h.finish_ = std::move(finish);
  h.what_ = std::move(what);
  h.started_ = std::chrono::steady_clock::now();
  return h;
}

namespace {

// Gloo on LibTorch 1.13 has no bfloat16 (and we treat half the same way, for one code path).
bool GlooLacks(torch::ScalarType type) { return type == torch::kBFloat16 || type == torch::kHalf; }

uint64_t RingBytes(const torch::Tensor& t, int world) {
  return static_cast<uint64_t>(t.numel()) * t.element_size() * (world - 1) / world;
}

}  // namespace

Handle Comm::AllGather(const torch::Tensor& shard, const torch::Tensor& out,
                       const std::string& what) {
  const int64_t n = shard.numel();
  TORCH_CHECK(out.numel() == n * world_size() && out.is_contiguous() &&
                  out.scalar_type() == shard.scalar_type(),
              "AllGather: out must be a contiguous [world * ", n, "] ", shard.scalar_type(),
              " tensor, got ", out.sizes(), " ", out.scalar_type());
  const std::string label = "all_gather " + what;
  if (!impl_->group) {
    out.view({-1}).copy_(shard.view({-1}));
    return Start({}, nullptr, label, 0);
  }
  std::vector<at::Tensor> inputs = {shard.contiguous().view({-1})};
  torch::Tensor target = out;
  if (!impl_->native_reduce_scatter && GlooLacks(shard.scalar_type())) {
    // A gather copies bits: 16-bit floats travel as bytes, which Gloo has.
    inputs[0] = inputs[0].view(torch::kUInt8);
    target = out.view({-1}).view(torch::kUInt8);
  }
  if (impl_->native_reduce_scatter && (!out.is_cuda() || !shard.is_cuda())) {
    // NCCL gathers device memory only: host tensors (a checkpoint's or an export's slices) go
    // through the device.
    at::Tensor send = inputs[0].to(options_.device);
    at::Tensor recv = torch::empty({out.numel()}, send.options());
    return Start(
        impl_->group->_allgather_base(recv, send),
        [out, send, recv] { out.view({-1}).copy_(recv); }, label, RingBytes(out, world_size()));
  }
  if (impl_->native_reduce_scatter) {
    at::Tensor flat = out.view({-1});
    Handle h = Start(impl_->group->_allgather_base(flat, inputs[0]), nullptr, label,
                     RingBytes(out, world_size()));
    h.stream_ordered_ = out.is_cuda();
    return h;
  }
  std::vector<std::vector<at::Tensor>> outputs(1);
  const at::Tensor rows = target.view({world_size(), -1});
  for (int r = 0; r < world_size(); ++r) outputs[0].push_back(rows[r]);
  auto work = impl_->group->allgather(outputs, inputs);
  // Keep the input alive until the collective is done.
  return Start(
      std::move(work), [inputs] {}, label, RingBytes(out, world_size()));
}

Handle Comm::ReduceScatter(const torch::Tensor& in, const torch::Tensor& out,
                           const std::string& what) {
  const int64_t s = out.numel();
  TORCH_CHECK(in.numel() == s * world_size() && in.is_contiguous() && out.is_contiguous() &&
                  in.scalar_type() == out.scalar_type(),
              "ReduceScatter: in must be a contiguous [world * ", s, "] ", out.scalar_type(),
              " tensor, got ", in.sizes(), " ", in.scalar_type());
  const std::string label = "reduce_scatter " + what;
  if (!impl_->group) {
    if (!out.is_same(in)) out.view({-1}).copy_(in.view({-1}));
    return Start({}, nullptr, label, 0);
  }
#ifdef TRAINCTL_HAVE_NCCL
  if (impl_->native_reduce_scatter) {
    at::Tensor o = out.view({-1});
    at::Tensor i = in.view({-1});
    Handle h = Start(impl_->group->_reduce_scatter_base(o, i), nullptr, label,
                     RingBytes(in, world_size()));
    h.stream_ordered_ = in.is_cuda();
    return h;
  }
#endif
  // Gloo: all-reduce the whole buffer (in fp32 for the 16-bit floats it cannot add), keep this
  // rank's slice.
  const torch::Tensor sum =
      GlooLacks(in.scalar_type()) ? in.view({-1}).to(torch::kFloat32) : in.view({-1});
  std::vector<at::Tensor> tensors = {sum};
  auto work = impl_->group->allreduce(tensors);
  const int64_t offset = static_cast<int64_t>(rank()) * s;
  return Start(
      std::move(work), [sum, out, offset, s] { out.view({-1}).copy_(sum.narrow(0, offset, s)); },
      label, 2 * RingBytes(sum, world_size()));
}

Handle Comm::AllReduce(const torch::Tensor& t, const std::string& what) {
  const std::string label = "all_reduce " + what;
  if (!impl_->group) return Start({}, nullptr, label, 0);
  TORCH_CHECK(t.is_contiguous(), "AllReduce: tensor must be contiguous");
  if (!impl_->native_reduce_scatter && GlooLacks(t.scalar_type())) {
    std::vector<at::Tensor> tensors = {t.to(torch::kFloat32)};
    const torch::Tensor sum = tensors[0];
    return Start(
        impl_->group->allreduce(tensors), [t, sum] { t.copy_(sum); }, label,
        2 * RingBytes(sum, world_size()));
  }
  if (impl_->native_reduce_scatter && !t.is_cuda()) {
    // NCCL reduces device memory only: host tensors (token counts, losses) go through the device.
    std::vector<at::Tensor> tensors = {t.to(options_.device)};
    const torch::Tensor staged = tensors[0];
    return Start(
        impl_->group->allreduce(tensors), [t, staged] { t.copy_(staged); }, label,
        2 * RingBytes(staged, world_size()));
  }
  std::vector<at::Tensor> tensors = {t};
  Handle h =
      Start(impl_->group->allreduce(tensors), nullptr, label, 2 * RingBytes(t, world_size()));
  h.stream_ordered_ = impl_->native_reduce_scatter && t.is_cuda();
  return h;
}

Handle Comm::Broadcast(const torch::Tensor& t, int root, const std::string& what) {
  const std::string label = "broadcast " + what;
  if (!impl_->group) return Start({}, nullptr, label, 0);
  TORCH_CHECK(t.is_contiguous(), "Broadcast: tensor must be contiguous");
  // A broadcast copies bits: 16-bit floats travel as bytes on Gloo.
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
  if (impl_->native_reduce_scatter && !t.is_cuda()) {  // NCCL: host tensors via the device
    std::vector<at::Tensor> tensors = {t.to(options_.device)};
    const torch::Tensor staged = tensors[0];
    return Start(
        impl_->group->broadcast(tensors, opts), [t, staged] { t.copy_(staged); }, label, bytes);
  }
  std::vector<at::Tensor> tensors = {!impl_->native_reduce_scatter && GlooLacks(t.scalar_type())
                                         ? t.view({-1}).view(torch::kUInt8)
                                         : t};
  return Start(impl_->group->broadcast(tensors, opts), nullptr, label, bytes);
}

Handle Comm::AllToAll(const torch::Tensor& in, const torch::Tensor& out, const std::string& what) {
  const int w = world_size();
  TORCH_CHECK(in.dim() > 0 && out.dim() > 0 && in.size(0) % w == 0 && out.size(0) % w == 0 &&
                  in.numel() == out.numel() && out.is_contiguous() &&
                  in.scalar_type() == out.scalar_type() && in.device() == out.device(),
              "AllToAll: in and out must hold as many ", in.scalar_type(),
              " elements, on one device, with dim 0 a multiple of the world size ", w,
              ", out contiguous; got ", in.sizes(), " and ", out.sizes(), " ", out.scalar_type());
  const std::string label = "all_to_all " + what;
  if (!impl_->group) {
    if (!out.is_same(in)) out.view({-1}).copy_(in.reshape({-1}));
    return Start({}, nullptr, label, 0);
  }
  // Flat buffers: equal splits of in's dim 0 are equal splits of its elements.
  at::Tensor send = in.contiguous().view({-1});
  at::Tensor recv = out.view({-1});
  std::function<void()> finish;
  if (impl_->native_reduce_scatter && !in.is_cuda()) {  // NCCL: host tensors via the device
    send = send.to(options_.device);
    recv = torch::empty_like(send);
    finish = [out, send, recv] { out.view({-1}).copy_(recv); };
  } else {
    // An all-to-all copies bits: 16-bit floats travel as bytes on Gloo.
    if (!impl_->native_reduce_scatter && GlooLacks(in.scalar_type())) {
      send = send.view(torch::kUInt8);
      recv = recv.view(torch::kUInt8);
    }
    finish = [send] {};  // keeps the input alive until the collective is done
  }
  std::vector<int64_t> out_splits, in_splits;  // empty: equal splits
  auto work = impl_->group->alltoall_base(recv, send, out_splits, in_splits);
  Handle h = Start(std::move(work), std::move(finish), label, RingBytes(in, w));
  h.stream_ordered_ = impl_->native_reduce_scatter && in.is_cuda();
  return h;
}

void Comm::Barrier(const std::string& what) {
  if (!impl_->group) return;
  // An all-reduce of one element: Gloo's barrier has no timeout of its own on 1.13.
  torch::Tensor one = torch::ones({1}, torch::TensorOptions().device(options_.device));
  AllReduce(one, "barrier " + what).Wait();
}

}  // namespace trainctl::zero
