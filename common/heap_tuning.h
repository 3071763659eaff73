// How a training process's glibc heap handles the large buffers freed and allocated again every
// step (gradients, optimizer temporaries, logits).
#ifndef TRAINCTL_COMMON_HEAP_TUNING_H_
#define TRAINCTL_COMMON_HEAP_TUNING_H_

namespace trainctl {

// Keeps freed memory in the heap instead of returning it to the system: no buffer is mmap'ed,
// the heap is never trimmed, and it grows 256 MB at a time. Otherwise glibc would mmap and unmap
// each large buffer, and the page faults of re-zeroed memory cost more than the arithmetic (7x
// on the tiny model on a 2-core VM), as PyTorch's caching allocator avoids on GPUs. Called first
// thing in main() by the trainer and by the benchmarks that time its steps.
void KeepFreedMemoryInTheHeap();

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_HEAP_TUNING_H_
