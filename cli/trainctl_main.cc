// trainctl: the user's command line for trainctl (see `trainctl help`).
#include <cstdlib>
#include <iostream>

#include "cli/commands.h"

int main(int argc, char** argv) {
  const char* env = std::getenv("TRAINCTL_COORDINATOR");
  return trainctl::cli::RunTrainctl({argv + 1, argv + argc}, env == nullptr ? "" : env, std::cout,
                                    std::cerr);
}
