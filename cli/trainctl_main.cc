// trainctl: the user's command line for trainctl (see `trainctl help`).
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>

#include "cli/commands.h"
#include "common/build_info.h"

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--version") == 0) {
    std::cout << trainctl::VersionText("trainctl");
    return 0;
  }
  trainctl::cli::Terminal terminal;
  terminal.is_tty = isatty(STDOUT_FILENO) == 1;
  terminal.columns = [] {
    winsize size{};
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return int{size.ws_col};
    const char* columns = std::getenv("COLUMNS");
    const int n = columns == nullptr ? 0 : std::atoi(columns);
    return n > 0 ? n : 80;
  };
  // The one place trainctl reads its environment (cli/connection.h).
  return trainctl::cli::RunTrainctl({argv + 1, argv + argc},
                                    trainctl::cli::ClientEnvironment::FromProcess(), std::cout,
                                    std::cerr, terminal);
}
