// How trainctl shows a pipeline job's stages: the kind column of `ls`, the stages table of
// `describe`, and the stage events of `describe` and `watch`.
#ifndef TRAINCTL_CLI_PIPELINE_VIEW_H_
#define TRAINCTL_CLI_PIPELINE_VIEW_H_

#include <map>
#include <ostream>
#include <string>

#include "absl/time/time.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::cli {

// "sft" for a job of one kind; "pipeline 2/4 sft" for a pipeline (its current stage).
std::string KindColumn(const trainctl::v1::Job& job);

// "loss=0.52 reward=1.25": at most `max` of a stage's figures, the telling ones first (loss,
// reward, accuracy, ...), then others but for rates and counters; "-" when there are none.
std::string HeadlineFigures(const google::protobuf::Map<std::string, double>& figures, int max = 4);

// The stages table: index, name, kind, state, model ← the stage it came from, data, output,
// headline figures, duration (up to `now` for the running stage).
void PrintStages(const trainctl::v1::Job& job, absl::Time now, std::ostream& out);

// "stage      sft (1/2) succeeded  (every rank exited 0)  loss=0.52" for a stage_change event.
std::string DescribeStageChange(const trainctl::v1::StageChange& change);

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_PIPELINE_VIEW_H_
