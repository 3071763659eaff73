// `trainctl tokenize`: offline, each UTF-8 line on stdin to a JSON array of token ids, or back
// with --decode (the tokenizer.json in --tokenizer DIR).
#ifndef TRAINCTL_CLI_TOKENIZE_COMMAND_H_
#define TRAINCTL_CLI_TOKENIZE_COMMAND_H_

#include <ostream>

#include "common/verb_args.h"

namespace trainctl::cli {

// Exit codes as RunTrainctl's (cli/commands.h); reads std::cin.
int RunTokenize(const ParsedArgs& args, std::ostream& out, std::ostream& err);

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_TOKENIZE_COMMAND_H_
