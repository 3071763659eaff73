// A training process's host resources: memory for CPU tensors (the glibc heap keeps what is freed,
// and LibTorch's CPU allocator is replaced by one that reuses those freed blocks) and the number of
// threads its CPU kernels use.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_HOST_RUNTIME_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_HOST_RUNTIME_H_

namespace trainctl::model {

// Two settings, both against the page faults of memory the kernel hands out afresh (a 130 MB buffer
// is 31,700 faults and 0.3 s to write on a 2-core VM, against 0.01 s to rewrite mapped memory), as
// PyTorch's caching allocator avoids them on GPUs:
// - glibc keeps freed memory in the heap: no buffer is mmap'ed, the heap is never trimmed, and it
//   grows 256 MB at a time. Otherwise each large buffer is mmap'ed and unmapped every step.
// - CPU tensors are allocated with malloc instead of LibTorch 1.13's posix_memalign. glibc's
//   memalign over-allocates and splits each block, so a large buffer freed and allocated again
//   every step (a gradient, an optimizer temporary, an activation) mostly lands in fresh heap
//   rather than in the block just freed. The data stays 64-byte aligned, as LibTorch aligns it.
// Called first thing in main() by the trainer and by the benchmarks that time its steps; it affects
// CPU tensors only (CUDA tensors keep LibTorch's caching allocator).
void KeepTensorMemoryInTheHeap();

// CPU kernels on `threads` threads: LibTorch's intra-op pool and, where LibTorch's BLAS is
// OpenBLAS (Debian's LibTorch), OpenBLAS's own pool, which torch::set_num_threads leaves at one
// thread per core. Otherwise two ranks on two cores, each told one thread, run four threads for
// every matrix product, and the idle ones spin in sched_yield. (The worker's launcher sets
// OMP_NUM_THREADS, which both read at start-up; this is for `--threads` and the benchmarks.)
void SetCpuThreads(int threads);

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_HOST_RUNTIME_H_
