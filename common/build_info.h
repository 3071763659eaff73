// What build this binary is, for trainctl_build_info / trainctl_worker_info and --version: the
// CMake project version and the git revision the build was configured from ("unknown" outside a
// git checkout). The revision is taken when CMake configures, so a commit made after the last
// configure is not reflected until the next one.
#ifndef TRAINCTL_COMMON_BUILD_INFO_H_
#define TRAINCTL_COMMON_BUILD_INFO_H_

#include <string>

namespace trainctl {

// E.g. "0.1.0".
const char* BuildVersion();
// E.g. "f1326e7a9c2b", or "unknown".
const char* BuildRevision();
// What every binary's --version prints: "<program> <version> (git <revision>)\n", e.g.
// "trainctl-worker 0.1.0 (git f1326e7a9c2b)\n".
std::string VersionText(const std::string& program);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_BUILD_INFO_H_
