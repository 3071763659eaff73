// `trainctl validate` and `trainctl submit`: a job spec from a file and/or the seed's launch flags,
// checked offline or sent to the coordinator, with the job's memory plan (common/memory_plan.h).
#ifndef TRAINCTL_CLI_SPEC_COMMANDS_H_
#define TRAINCTL_CLI_SPEC_COMMANDS_H_

#include <ostream>

#include "cli/connection.h"
#include "common/verb_args.h"

namespace trainctl::cli {

// Offline. Table output: the resolved DeepSpeed config as JSON on `out` (as before), the memory
// plan's table on `err`; JSON output: {"resolved_deepspeed_config": ..., "memory_plan": ...}.
// 0, or 1 with every error of the spec.
int ValidateSpec(const ParsedArgs& args, bool json, std::ostream& out, std::ostream& err);

// Submits; `--force` accepts a job whose plan does not fit the cluster's GPUs. Table output: the
// job's id and state, then the plan the coordinator stored; JSON: the job (with memory_plan).
int SubmitSpec(const ParsedArgs& args, bool json, const Connection& connection, std::ostream& out,
               std::ostream& err);

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_SPEC_COMMANDS_H_
