// Comm's collectives on real Gloo process groups: each test forks its ranks (before this process
// runs any LibTorch op), which rendezvous on loopback, check their results and report through
// their exit status.
#include "worker/trainer/zero/comm.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <functional>
#include <iostream>
#include <vector>

#include "tests/testing/subprocess.h"

namespace trainctl::zero {
namespace {

// Runs `body(comm)` on `world` forked ranks; true when every rank returned true.
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
