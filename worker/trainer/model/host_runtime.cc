#include "worker/trainer/model/host_runtime.h"

#include <c10/core/CPUAllocator.h>
#include <dlfcn.h>
#include <malloc.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace trainctl::model {
namespace {

// LibTorch's gAlignment: what its vectorised kernels expect.
constexpr std::uintptr_t kAlignment = 64;

// The block's start, as malloc returned it, is kept in the word just before the aligned data, so
// the data pointer is also the deleter's context (a "simple" DataPtr, as LibTorch's own).
void FreeAligned(void* data) {
  if (data != nullptr) std::free(static_cast<void**>(data)[-1]);
}

c10::DataPtr AllocateAligned(size_t bytes) {
  const c10::Device cpu(c10::DeviceType::CPU);
  if (bytes == 0) return c10::DataPtr(nullptr, nullptr, &FreeAligned, cpu);
  void* raw = std::malloc(bytes + kAlignment);
  // Named as LibTorch names its own, so the trainer reports an out-of-memory with its size.
  TORCH_CHECK(raw != nullptr, "HeapCpuAllocator: can't allocate memory: you tried to allocate ",
              bytes, " bytes.");
  // malloc aligns to 16, so the aligned start lies 16 to 64 bytes in: room for the word before it.
  auto* data = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(raw) + kAlignment) &
                                       ~(kAlignment - 1));
  static_cast<void**>(data)[-1] = raw;
  return c10::DataPtr(data, data, &FreeAligned, cpu);
}

// LibTorch 1.13 to 2.2 declare allocate() const; 2.3 and later declare it non-const and add the
// pure copy_data(). Both forms are defined here without `override`, so whichever the installed
// LibTorch declares is the one overridden, and the other is an unused overload.
class HeapCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) const { return AllocateAligned(bytes); }
  c10::DataPtr allocate(size_t bytes) { return AllocateAligned(bytes); }
  void copy_data(void* dest, const void* src, size_t count) const { std::memcpy(dest, src, count); }
  c10::DeleterFnPtr raw_deleter() const { return &FreeAligned; }
};

}  // namespace

void KeepTensorMemoryInTheHeap() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);  // never trim (man mallopt); INT_MAX would still trim at 2 GB
  mallopt(M_TOP_PAD, 256 << 20);
  static HeapCpuAllocator allocator;
  // Priority above LibTorch's own registration (0), so a later default registration cannot undo it.
  c10::SetCPUAllocator(&allocator, /*priority=*/1);
}

void SetCpuThreads(int threads) {
  torch::set_num_threads(threads);
  // Looked up rather than linked: LibTorch may use another BLAS (MKL on other builds follows
  // set_num_threads itself), and the symbol is OpenBLAS's, present only where it is loaded.
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(threads);
  }
}

}  // namespace trainctl::model
