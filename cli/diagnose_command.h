// `trainctl diagnose`: a job's interconnect diagnosis (DiagnoseJob), or with --probe a bandwidth
// probe job (kind probe) over a set of nodes, waited for, then its diagnosis.
//   trainctl diagnose JOB [-o json]
//   trainctl diagnose --probe [--nodes N] [--slots_per_node S] [--node_selector k=v[,k=v]]
//                     [--sizes BYTES[,BYTES]] [--timeout SECONDS] [-o json]
#ifndef TRAINCTL_CLI_DIAGNOSE_COMMAND_H_
#define TRAINCTL_CLI_DIAGNOSE_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "cli/connection.h"
#include "common/verb_args.h"

namespace trainctl::cli {

// The verb's options (besides --coordinator and -o).
std::vector<OptionSpec> DiagnoseOptions();

// Exit codes as RunTrainctl's (cli/commands.h); `format` is "table" or "json".
int RunDiagnose(const ParsedArgs& args, const Connection& connection, const std::string& format,
                std::ostream& out, std::ostream& err);

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_DIAGNOSE_COMMAND_H_
