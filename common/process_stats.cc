#include "common/process_stats.h"

#include <cstdlib>
#include <fstream>
#include <string>

namespace trainctl {

int64_t PeakRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;  // kB
  }
  return 0;
}

}  // namespace trainctl
