// Command-line parsing for trainctl's verbs: `trainctl VERB [options] [args]`. Options may come
// anywhere after the verb, as `--name value`, `--name=value` or a short alias (`-o json`, `-f`).
// Unrecognised `--flags` are kept, in order, for verbs that pass them on (submit's seed flags).
#ifndef TRAINCTL_CLI_CLI_ARGS_H_
#define TRAINCTL_CLI_CLI_ARGS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainctl::cli {

struct OptionSpec {
  std::string name;   // long name without dashes: "coordinator"
  std::string alias;  // short form with its dash, or empty: "-o"
  bool takes_value = true;
};

struct ParsedArgs {
  std::map<std::string, std::string> options;  // by long name; "true" for switches
  std::vector<std::string> positional;
  std::vector<std::string> passthrough;  // unknown --flags (with their values) when allowed
  bool Has(const std::string& name) const { return options.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const {
    auto it = options.find(name);
    return it == options.end() ? fallback : it->second;
  }
};

// INVALID_ARGUMENT naming the option when an option lacks its value, or when an unknown --flag
// appears and `allow_passthrough` is false.
absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                     const std::vector<OptionSpec>& specs, bool allow_passthrough);

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_CLI_ARGS_H_
