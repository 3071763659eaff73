#include "common/build_info.h"

// Defined by common/CMakeLists.txt for this file only, so that a new revision recompiles one file.
#ifndef TRAINCTL_VERSION
#error "TRAINCTL_VERSION must be defined by the build"
#endif
#ifndef TRAINCTL_REVISION
#error "TRAINCTL_REVISION must be defined by the build"
#endif

namespace trainctl {

const char* BuildVersion() { return TRAINCTL_VERSION; }
const char* BuildRevision() { return TRAINCTL_REVISION; }

std::string VersionText(const std::string& program) {
  return program + " " + TRAINCTL_VERSION + " (git " + TRAINCTL_REVISION + ")\n";
}

}  // namespace trainctl
