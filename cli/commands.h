// trainctl's verbs. RunTrainctl is main() without the process: tests call it with string streams.
#ifndef TRAINCTL_CLI_COMMANDS_H_
#define TRAINCTL_CLI_COMMANDS_H_

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "cli/connection.h"
#include "cli/exit_codes.h"

namespace trainctl::cli {

// Where `out` goes: a terminal gets watch's live line, redrawn in place.
struct Terminal {
  bool is_tty = false;
  std::function<int()> columns;  // its width now (it may be resized); unset: 80
};

// `args` excludes the program name; `env` is what main() read of the environment
// (cli/connection.h says how it and the flags make the connection).
int RunTrainctl(const std::vector<std::string>& args, const ClientEnvironment& env,
                std::ostream& out, std::ostream& err, const Terminal& terminal = Terminal());
// The same with only $TRAINCTL_COORDINATOR (may be empty) of the environment: no HOME, so no
// config or token file.
int RunTrainctl(const std::vector<std::string>& args, const std::string& env_coordinator,
                std::ostream& out, std::ostream& err, const Terminal& terminal = Terminal());

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_COMMANDS_H_
