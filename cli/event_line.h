// One line per job event, as `trainctl describe` lists them and `trainctl watch` prints them:
// a fixed-width kind, then what happened ("state      running -> failed  (rank 1 exited 1)").
#ifndef TRAINCTL_CLI_EVENT_LINE_H_
#define TRAINCTL_CLI_EVENT_LINE_H_

#include <string>

#include "trainctl/v1/job.pb.h"

namespace trainctl::cli {

std::string EventLine(const trainctl::v1::JobEvent& event);

// A state's name in lower case; a newer coordinator may send states this binary does not know:
// shown as "unknown(N)".
std::string StateName(trainctl::v1::JobState state);

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_EVENT_LINE_H_
