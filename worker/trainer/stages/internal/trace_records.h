// Trace distillation's files and bookkeeping, apart from any teacher or tensor (no LibTorch):
//
//   prompts    data_path's JSONL records (data/record_parser.h formats; a file or a directory of
//              *.jsonl read in name order) as teacher prompts, indexed 0..N-1 across the files;
//   verdicts   each completion scored with the rule rewards against the record's solution; it
//              passes when accuracy == 1 and format == 1, and the first keep_per_prompt that pass
//              are kept;
//   progress   output_dir/progress/rank-<k>.jsonl, one line per finished prompt, appended and
//              fsynced by rank k; read back from every rank's file, a torn last line ignored, so a
//              restart on any world size skips the done prompts;
//   outputs    traces.jsonl (one `messages` record per kept trace) and the dataset manifest.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_TRACE_RECORDS_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_TRACE_RECORDS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/trainer/stages/internal/teacher.h"

namespace trainctl::trainer::internal {

struct TracePrompt {
  TeacherPrompt prompt;  // the record without its assistant turns, the system prompt first
  std::string solution;  // the record's reference answer
};

// Every record of `data_path` as a prompt under `system_prompt` (the record's own system turns
// are replaced; kept when `system_prompt` is empty). Image paths resolve as `trainctl prepare`
// resolves them (absolute, or beside the JSONL file). INVALID_ARGUMENT / NOT_FOUND prefixed
// "FILE:LINE: " for a bad record or image; NOT_FOUND when data_path holds no JSONL file.
absl::StatusOr<std::vector<TracePrompt>> LoadTracePrompts(const std::string& data_path,
                                                          const std::string& system_prompt);

struct CompletionVerdict {
  std::string text;
  std::string finish_reason;
  int64_t tokens = 0;
  double accuracy = 0;
  double format = 0;
  bool passed = false;  // accuracy == 1 and format == 1
};

// One finished prompt: a line of a progress file.
struct PromptOutcome {
  int64_t index = 0;
  int64_t prompt_tokens = 0;
  std::vector<CompletionVerdict> completions;
  std::vector<int64_t> kept;  // indices into completions: the first keep_per_prompt that passed
};

// Scores `answer` against `solution` (rewards/rule_rewards.h).
PromptOutcome Verify(const TeacherAnswer& answer, const std::string& solution,
                     int64_t keep_per_prompt);

nlohmann::json OutcomeToJson(const PromptOutcome& outcome);

// Rank `rank`'s progress file under `dir` (output_dir/progress), opened for appending. Not
// thread-safe.
class ProgressLog {
 public:
  // Creates `dir` and the file; cuts a torn last line (a killed run's) so appends start on a
  // line of their own. UNAVAILABLE when the file cannot be opened or cut.
  static absl::StatusOr<ProgressLog> Open(const std::string& dir, int rank);
  ProgressLog(ProgressLog&& other) noexcept;
  ProgressLog& operator=(ProgressLog&&) = delete;
  ~ProgressLog();

  // Appends one line per outcome in one write and fsyncs. UNAVAILABLE naming the file on error.
  absl::Status Append(const std::vector<PromptOutcome>& outcomes);

 private:
  ProgressLog(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
};

// The outcomes in every rank-*.jsonl under `dir` by prompt index (the first line of an index
// wins), ignoring each file's torn last line. DATA_LOSS naming FILE:LINE for a malformed line
// before the last; an empty map when `dir` does not exist.
absl::StatusOr<std::map<int64_t, PromptOutcome>> ReadProgress(const std::string& dir);

// Writes `path` (through a temporary file and a rename): per prompt in index order, per kept
// completion in order, a `messages` record — the prompt's turns, the completion as the
// assistant's, "images" (absolute paths) and "solution". Returns the records written.
absl::StatusOr<int64_t> WriteTraces(const std::string& path,
                                    const std::vector<TracePrompt>& prompts,
                                    const std::map<int64_t, PromptOutcome>& outcomes);

// Writes `doc` as pretty JSON to `path` through a temporary file and a rename.
absl::Status WriteJsonFile(const std::string& path, const nlohmann::json& doc);

}  // namespace trainctl::trainer::internal

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_TRACE_RECORDS_H_
