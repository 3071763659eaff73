#include "common/heap_tuning.h"

#include <malloc.h>

#include <limits>

namespace trainctl {

void KeepFreedMemoryInTheHeap() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  mallopt(M_TOP_PAD, 256 << 20);
}

}  // namespace trainctl
