// Comm's collectives on real Gloo process groups: each test forks its ranks (before this process
// runs any LibTorch op), which rendezvous on loopback, check their results and report through
// their exit status. Also its sub-groups and all-to-all, and the sequence all-to-all built on them.
#include "worker/trainer/zero/comm.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/testing/subprocess.h"
#include "worker/trainer/zero/sequence_all_to_all.h"

namespace trainctl::zero {
namespace {

// Runs `body(comm)` on `world` forked ranks; true when every rank returned true. Tests that fork
// stay in one suite, ahead of those that run LibTorch in this process.
bool OnRanks(int world, const std::function<bool(Comm&)>& body) {
  const int port = testing::FreeLoopbackPort();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      CommOptions options;
      options.rank = r;
      options.world_size = world;
      options.master_port = port;
      options.timeout = std::chrono::seconds(20);
      auto comm = Comm::Create(options);
      if (!comm.ok()) {
        std::cerr << comm.status() << "\n";
        _exit(2);
      }
      bool ok = false;
      try {
        ok = body(**comm);
      } catch (const std::exception& e) {
        std::cerr << "rank " << r << ": " << e.what() << "\n";
      }
      _exit(ok ? 0 : 1);
    }
    pids.push_back(pid);
  }
  bool all = true;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    all = all && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return all;
}

bool Check(bool condition, const char* what, const torch::Tensor& got) {
  if (!condition) std::cerr << what << ": got " << got << "\n";
  return condition;
}

TEST(CommTest, AllGatherAndReduceScatterMatchTheirDefinitionsInEveryDtype) {
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
    EXPECT_TRUE(OnRanks(3, [dtype](Comm& comm) {
      const int w = comm.world_size(), r = comm.rank();
      const auto opts = torch::TensorOptions().dtype(dtype);
      // All-gather: rank r's shard is [r*10, r*10 + 1, r*10 + 2].
      torch::Tensor shard = torch::arange(3, opts) + r * 10;
      torch::Tensor out = torch::empty({3 * w}, opts);
      comm.AllGather(shard, out, "test").Wait();
      std::vector<torch::Tensor> parts;
      for (int q = 0; q < w; ++q) parts.push_back(torch::arange(3, opts) + q * 10);
      if (!Check(torch::equal(out, torch::cat(parts)), "all_gather", out)) return false;
      // Reduce-scatter: every rank contributes (q + 1) * [0, 1, ..., 3w); rank r keeps its slice
      // of the sum, (1 + 2 + ... + w) * [3r, 3r + 1, 3r + 2].
      torch::Tensor in = torch::arange(3 * w, opts) * (r + 1);
      torch::Tensor mine = torch::empty({3}, opts);
      comm.ReduceScatter(in, mine, "test").Wait();
      const torch::Tensor want = torch::arange(3 * r, 3 * r + 3, opts) * (w * (w + 1) / 2);
      if (!Check(torch::equal(mine, want), "reduce_scatter", mine)) return false;
      // All-reduce and broadcast in place.
      torch::Tensor t = torch::full({4}, static_cast<double>(r + 1), opts);
      comm.AllReduce(t, "test").Wait();
      if (!Check(torch::equal(t, torch::full({4}, w * (w + 1) / 2.0, opts)), "all_reduce", t)) {
        return false;
      }
      torch::Tensor b = torch::full({2}, static_cast<double>(r), opts);
      comm.Broadcast(b, 2, "test").Wait();
      if (!Check(torch::equal(b, torch::full({2}, 2.0, opts)), "broadcast", b)) return false;
      comm.Barrier("end");
      return comm.bytes_sent() > 0 && comm.backend() == "gloo";
    })) << torch::toString(dtype);
  }
}

TEST(CommTest, CollectivesInFlightTogetherFinishInPlace) {
  EXPECT_TRUE(OnRanks(2, [](Comm& comm) {
    std::vector<Handle> pending;
    std::vector<torch::Tensor> outs;
    for (int i = 0; i < 8; ++i) {
      outs.push_back(torch::empty({2 * 1000}));
      pending.push_back(comm.AllGather(torch::full({1000}, double(i * 2 + comm.rank())),
                                       outs.back(), "overlapped"));
    }
    for (auto& h : pending) h.Wait();
    for (int i = 0; i < 8; ++i) {
      if (outs[i][0].item<double>() != i * 2 || outs[i][1999].item<double>() != i * 2 + 1) {
        return false;
      }
    }
    return true;
  }));
}

// The 4-rank world split in two: {0, 1} and {2, 3}.
std::unique_ptr<Comm> HalfOf(Comm& world) {
  const int first = world.rank() < 2 ? 0 : 2;
  auto sub = world.Subgroup({first, first + 1}, "half");
  if (!sub.ok()) {
    std::cerr << sub.status() << "\n";
    return nullptr;
  }
  return *std::move(sub);
}

TEST(CommTest, SubgroupAllReduceStaysWithinEachGroup) {
  EXPECT_TRUE(OnRanks(4, [](Comm& world) {
    std::unique_ptr<Comm> half = HalfOf(world);
    if (!half || half->world_size() != 2 || half->rank() != world.rank() % 2 ||
        half->backend() != "gloo") {
      return false;
    }
    torch::Tensor t = torch::full({3}, static_cast<double>(world.rank() + 1));
    half->AllReduce(t, "test").Wait();
    // {0, 1}: 1 + 2; {2, 3}: 3 + 4.
    const double want = world.rank() < 2 ? 3 : 7;
    if (!Check(torch::equal(t, torch::full({3}, want)), "group all_reduce", t)) return false;
    // The world still works beside its groups.
    torch::Tensor all = torch::ones({1});
    world.AllReduce(all, "test").Wait();
    return Check(all.item<double>() == 4, "world all_reduce", all) && half->bytes_sent() > 0 &&
           !half->failed();
  }));
}

// Every rank's all-to-all input among `w` ranks, c rows of 3 per chunk: sender, chunk, row and
// column numbered together (at most 95 for 4 ranks, exact in bf16).
torch::Tensor AllToAllInputs(int w, int c, torch::ScalarType dtype) {
  return torch::arange(w * w * c * 3, torch::TensorOptions().dtype(dtype)).view({w, w * c, 3});
}

bool AllToAllMovesChunks(Comm& comm, torch::ScalarType dtype) {
  const int w = comm.world_size(), r = comm.rank(), c = 2;
  const torch::Tensor all = AllToAllInputs(w, c, dtype);
  torch::Tensor out = torch::empty({w * c, 3}, all.options());
  const uint64_t before = comm.bytes_sent();
  comm.AllToAll(all[r], out, "test").Wait();
  // Chunk i of out is chunk r of rank i's input.
  const torch::Tensor want = all.view({w, w, c, 3}).select(1, r).reshape({w * c, 3});
  const uint64_t bytes = static_cast<uint64_t>(out.numel()) * out.element_size() * (w - 1) / w;
  return Check(torch::equal(out, want), "all_to_all", out) && comm.bytes_sent() - before == bytes;
}

TEST(CommTest, AllToAllMovesChunkJToRankJOnTwoAndFourRanks) {
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    EXPECT_TRUE(OnRanks(4, [dtype](Comm& world) {
      std::unique_ptr<Comm> half = HalfOf(world);
      return half && AllToAllMovesChunks(world, dtype) && AllToAllMovesChunks(*half, dtype);
    })) << torch::toString(dtype);
  }
}

// SequenceAllToAll on [B, H, s, D] = [2, 4, 3, 5] per rank, heads scattered and sequence gathered,
// against the same computed from every rank's input on one rank: forward, gradient of
// sum(out * w), and the exchange back.
bool SequenceExchangeMatchesOneRank(Comm& comm, torch::ScalarType dtype) {
  const int w = comm.world_size(), r = comm.rank();
  const int64_t heads = 4 / w;
  torch::manual_seed(7);
  const torch::Tensor inputs = torch::randn({w, 2, 4, 3, 5}).to(dtype);
  const torch::Tensor weights = torch::randn({w, 2, heads, 3 * w, 5}).to(dtype);
  // One rank: the whole sequence, rank q holding heads [q*H/W, (q+1)*H/W).
  const torch::Tensor leaf = inputs.clone().set_requires_grad(true);
  const torch::Tensor whole = torch::cat(leaf.unbind(0), 2);
  torch::Tensor loss = torch::zeros({}, leaf.options());
  for (int q = 0; q < w; ++q) loss = loss + (whole.narrow(1, q * heads, heads) * weights[q]).sum();
  loss.backward();
  const torch::Tensor want = whole.narrow(1, r * heads, heads).detach();

  const torch::Tensor x = inputs[r].clone().set_requires_grad(true);
  const torch::Tensor out = SequenceAllToAll(comm, x, 1, 2);
  if (!Check(torch::equal(out, want), "sequence all_to_all", out)) return false;
  (out * weights[r]).sum().backward();
  if (!Check(torch::equal(x.grad(), leaf.grad()[r]), "its gradient", x.grad())) return false;
  const torch::Tensor back = SequenceAllToAll(comm, out.detach(), -2, -3);
  return Check(torch::equal(back, inputs[r]), "the exchange back", back);
}

TEST(CommTest, SequenceAllToAllMatchesOneRankForwardAndBackward) {
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    EXPECT_TRUE(OnRanks(4, [dtype](Comm& world) {
      std::unique_ptr<Comm> half = HalfOf(world);
      return half && SequenceExchangeMatchesOneRank(world, dtype) &&
             SequenceExchangeMatchesOneRank(*half, dtype);
    })) << torch::toString(dtype);
  }
}

TEST(CommTest, OneRankSubgroupIsLocal) {
  EXPECT_TRUE(OnRanks(2, [](Comm& world) {
    if (world.Subgroup({0, 0}, "bad").status().code() != absl::StatusCode::kInvalidArgument ||
        world.Subgroup({1 - world.rank()}, "bad").status().code() !=
            absl::StatusCode::kInvalidArgument) {
      return false;
    }
    auto alone = world.Subgroup({world.rank()}, "alone");
    if (!alone.ok() || (*alone)->world_size() != 1 || (*alone)->rank() != 0 ||
        (*alone)->backend() != "local") {
      return false;
    }
    torch::Tensor t = torch::full({2}, 5.0);
    (*alone)->AllReduce(t, "test").Wait();
    torch::Tensor out = torch::empty({4, 2});
    (*alone)->AllToAll(torch::arange(8.0).view({4, 2}), out, "test").Wait();
    const torch::Tensor x = torch::randn({2, 4, 3});
    // Divisibility is checked before anything is sent.
    bool refused = false;
    try {
      SequenceAllToAll(world, torch::zeros({3, 2}), 0, 1);
    } catch (const c10::Error&) {
      refused = true;
    }
    return refused && torch::equal(t, torch::full({2}, 5.0)) &&
           torch::equal(out, torch::arange(8.0).view({4, 2})) &&
           torch::equal(SequenceAllToAll(**alone, x, 1, 2), x) && (*alone)->bytes_sent() == 0;
  }));
}

TEST(CommTest, DeadPeerInASubgroupIsNamedByWorldRank) {
  const std::string done = ::testing::TempDir() + "comm_subgroup_done_" + std::to_string(getpid());
  std::filesystem::remove(done);
  EXPECT_TRUE(OnRanks(4, [&done](Comm& world) {
    std::unique_ptr<Comm> half = HalfOf(world);
    if (!half) return false;
    // One collective proves the group formed on both of its ranks before rank 3 goes.
    half->AllReduce(torch::ones({4}), "formed").Wait();
    if (world.rank() == 3) _exit(0);
    if (world.rank() != 2) {
      // Rank 0 holds the store that rank 2's diagnosis reads: stay until it is done.
      return testing::WaitFor([&] { return std::filesystem::exists(done); }, absl::Seconds(20));
    }
    std::string message;
    try {
      half->AllReduce(torch::ones({4}), "probe").Wait();
    } catch (const CollectiveError& e) {
      message = e.what();
    }
    std::ofstream(done) << "done";
    const bool named =
        message.find("all_reduce probe") != std::string::npos &&
        message.find("rank 0 of 2 of group half (world rank 2)") != std::string::npos &&
        message.find("peer world rank 3 is gone") != std::string::npos;
    if (!named) std::cerr << "message: " << message << "\n";
    return named && half->failed() && world.failed();
  }));
  std::filesystem::remove(done);
}

TEST(CommTest, OneRankNeedsNoPeers) {
  auto comm = Comm::Create(CommOptions{});
  ASSERT_TRUE(comm.ok());
  torch::Tensor out = torch::empty({4});
  (*comm)->AllGather(torch::ones({4}), out, "alone").Wait();
  EXPECT_TRUE(torch::equal(out, torch::ones({4})));
  EXPECT_EQ((*comm)->bytes_sent(), 0u);
}

TEST(CommTest, RendezvousWithoutPeersTimesOutNamingTheAddress) {
  CommOptions options;
  options.rank = 1;
  options.world_size = 2;
  options.master_port = testing::FreeLoopbackPort();  // nobody listens
  options.timeout = std::chrono::seconds(2);
  auto comm = Comm::Create(options);
  ASSERT_FALSE(comm.ok());
  EXPECT_NE(comm.status().message().find("127.0.0.1:" + std::to_string(options.master_port)),
            std::string::npos)
      << comm.status();
}

}  // namespace
}  // namespace trainctl::zero
