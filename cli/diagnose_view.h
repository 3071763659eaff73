// `trainctl diagnose`'s human output: a job's nodes (topology summary), what NCCL did on each rank
// (transports, NICs, GDR), the bandwidth probe's table and the findings, most severe first.
#ifndef TRAINCTL_CLI_DIAGNOSE_VIEW_H_
#define TRAINCTL_CLI_DIAGNOSE_VIEW_H_

#include <string>

#include "trainctl/v1/diagnostics.pb.h"

namespace trainctl::cli {

// Plain text, one section per kind of fact; a section with nothing known says so in one line.
std::string DiagnosisText(const trainctl::v1::DiagnoseJobResponse& diagnosis);

// "1 KiB", "64 MiB", "3 B".
std::string ByteSize(int64_t bytes);

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_DIAGNOSE_VIEW_H_
