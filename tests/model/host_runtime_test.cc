// The training process's host resources (model/host_runtime.h): CPU tensors from the heap
// allocator, 64-byte aligned, a freed large buffer reused in place, a heap past 2 GB kept, not
// trimmed; and the CPU thread count reaching OpenBLAS's pool as well as LibTorch's.
#include "worker/trainer/model/host_runtime.h"

#include <c10/core/CPUAllocator.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace trainctl::model {
namespace {

long MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

class HostRuntimeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    torch::set_num_threads(1);  // page faults counted for this thread's writes only
    KeepTensorMemoryInTheHeap();
  }
};

TEST_F(HostRuntimeTest, TensorsAreAlignedAndTheirOwnContext) {
  for (int64_t n : {1, 3, 17, 1000, 1 << 20, 3 << 20}) {
    torch::Tensor t = torch::ones({n}, torch::kFloat32);
    const c10::DataPtr& data = t.storage().data_ptr();
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(data.get()) % 64, 0u) << n << " floats";
    EXPECT_EQ(data.get(), data.get_context()) << n << " floats";
    EXPECT_EQ(t.sum().item<float>(), static_cast<float>(n));
    EXPECT_EQ(t.storage().allocator(), c10::GetCPUAllocator());
    EXPECT_NE(t.storage().allocator(), c10::GetDefaultCPUAllocator()) << "LibTorch's own allocator";
  }
  EXPECT_EQ(torch::empty({0}).numel(), 0);
}

TEST_F(HostRuntimeTest, FreedLargeBufferIsReusedWithoutPageFaults) {
  // A step's pattern: a large buffer allocated, written and freed, with small allocations between.
  // posix_memalign (LibTorch's own allocator) placed every second one in fresh heap here.
  constexpr int64_t kFloats = 16 << 20;  // 64 MB: 16,384 pages if they were fresh
  void* first = nullptr;
  std::vector<torch::Tensor> smalls;
  for (int step = 0; step < 6; ++step) {
    const long before = MinorFaults();
    torch::Tensor t = torch::empty({kFloats});
    t.fill_(step);
    const long faults = MinorFaults() - before;
    smalls.push_back(torch::ones({100 + step}));
    if (step == 0) {
      first = t.data_ptr();
      continue;
    }
    EXPECT_EQ(t.data_ptr(), first) << "step " << step;
    EXPECT_LT(faults, 1000) << "step " << step << ": the freed 64 MB came back as fresh memory";
  }
}

TEST_F(HostRuntimeTest, HeapPastTwoGigabytesIsNotTrimmed) {
  // Never written, so it costs address space, not memory. With glibc's trim threshold at INT_MAX
  // (the most mallopt takes as a positive int) the free would hand it back to the system.
  constexpr int64_t kBytes = int64_t{2300} << 20;
  { torch::Tensor big = torch::empty({kBytes}, torch::kUInt8); }
  EXPECT_GE(mallinfo2().arena, static_cast<size_t>(kBytes));
}

TEST_F(HostRuntimeTest, CpuThreadsSetLibTorchAndOpenBlas) {
  using GetThreads = int (*)();
  auto openblas = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  for (int threads : {2, 1}) {
    SetCpuThreads(threads);
    EXPECT_EQ(torch::get_num_threads(), threads);
    if (openblas != nullptr) {
      EXPECT_EQ(openblas(), threads) << "OpenBLAS's own pool";
    }
  }
}

}  // namespace
}  // namespace trainctl::model
