// Command-line parsing for the verbs of trainctl's programs — `trainctl [global options] VERB
// [options] [args]`, `trainctl prepare ...`, `trainctl-trainer VERB ...` — each verb with its own
// options (absl flags are process-wide, so the daemons use them and verbs use this). Options may
// come anywhere after the verb, as `--name value`, `--name=value` or a short alias (`-o json`,
// `-f`); a switch is `--name` (or `--name=true`, `--name=false`); an option given twice keeps its
// last value in `options` and all of them in `values`. Global options (--coordinator, -o) may
// also come before the verb, as with kubectl. Unrecognised `--flags` are kept, in order, for verbs
// that pass them on (submit's seed flags).
#ifndef TRAINCTL_COMMON_VERB_ARGS_H_
#define TRAINCTL_COMMON_VERB_ARGS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainctl {

struct OptionSpec {
  std::string name;   // long name without dashes: "coordinator"
  std::string alias;  // short form with its dash, or empty: "-o"
  bool takes_value = true;
};

struct ParsedArgs {
  std::map<std::string, std::string> options;  // by long name, the last value; "true" for switches
  std::map<std::string, std::vector<std::string>> values;  // every value given, in order
  std::vector<std::string> positional;
  std::vector<std::string> passthrough;  // unknown --flags (with their values) when allowed
  bool Has(const std::string& name) const { return options.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const {
    auto it = options.find(name);
    return it == options.end() ? fallback : it->second;
  }
  // Every value of a repeatable option (`prepare --input a --input b`), in order; empty if none.
  const std::vector<std::string>& GetAll(const std::string& name) const;
};

// INVALID_ARGUMENT naming the option when an option lacks its value, or when an unknown --flag
// appears and `allow_passthrough` is false.
absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                     const std::vector<OptionSpec>& specs, bool allow_passthrough);

// The options before the verb, and where the verb is.
struct LeadingArgs {
  std::map<std::string, std::string> options;  // by long name, as ParsedArgs::options
  size_t verb_index = 0;                       // args.size() when only options were given
};

// Reads options from the start of `args` up to the first argument that is not one (the verb).
// Only `globals` may come there: INVALID_ARGUMENT naming any other option, or one without its
// value.
absl::StatusOr<LeadingArgs> ParseLeadingOptions(const std::vector<std::string>& args,
                                                const std::vector<OptionSpec>& globals);

// Adds the leading options to the verb's own, which win where both name one ("trainctl
// --coordinator a ls --coordinator b" talks to b). INVALID_ARGUMENT naming a leading option that
// is not among the verb's `specs`.
absl::Status MergeLeadingOptions(const LeadingArgs& leading, const std::vector<OptionSpec>& specs,
                                 ParsedArgs* parsed);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_VERB_ARGS_H_
