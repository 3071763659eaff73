// Job specs: reading them from YAML/JSON files, filling the HF Trainer's defaults, and validating
// them (DeepSpeed config included). Every error names the field path:
// "spec.resources.slots_per_node: must be >= 1, got 0". Errors are returned all at once, one per
// line of the status message.
#ifndef TRAINCTL_COMMON_JOB_SPEC_H_
#define TRAINCTL_COMMON_JOB_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/deepspeed_config.h"
#include "nlohmann/json.hpp"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

using trainctl::v1::JobSpec;

// Limits on a job spec (docs/limits.md, "Limits: jobs and the coordinator"), so that every job the
// coordinator stores, lists and sends to its workers has a bounded size. ValidateJobSpec enforces
// them (trainctl validate, submit and the coordinator alike); reading a spec file enforces the
// document's own.
inline constexpr size_t kMaxSpecDocumentBytes = 1 << 20;      // a spec file as written
inline constexpr size_t kMaxSpecBytes = 256 << 10;            // the JobSpec message, serialized
inline constexpr size_t kMaxDeepSpeedConfigBytes = 64 << 10;  // deepspeed_config_json
inline constexpr size_t kMaxSpecStringBytes = 4096;           // every other string and map value
inline constexpr size_t kMaxMapKeyBytes = 128;                // env, labels, node_selector keys
inline constexpr int kMaxEnvEntries = 128;
inline constexpr int kMaxLabelEntries = 64;  // labels and node_selector, each
inline constexpr int kMaxStages = 16;

enum class SpecFormat { kYaml, kJson };

// Parses a spec document (YAML is a superset of the JSON we accept, but JSON errors read better
// when parsed as JSON). `deepspeed` may be a path or an inline mapping; an inline mapping is stored
// in deepspeed_config_json. A document that cannot be read as a whole (syntax, size, alias
// expansion past kMaxYamlNodes) is INVALID_ARGUMENT naming `source`. Problems with single fields
// (unknown names, wrong types) are INVALID_ARGUMENT listing every one, or, with `field_errors`,
// appended there while the spec keeps every field that decoded, so that ValidateJobSpec can report
// them together with its own findings.
absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view text, SpecFormat format,
                                     absl::string_view source,
                                     std::vector<std::string>* field_errors = nullptr);

// Reads a spec file (format from the extension: .json, else YAML) and embeds the DeepSpeed config
// it names, resolving relative paths against the spec file's directory. NOT_FOUND if the file is
// missing. `field_errors` as for ParseJobSpec (a DeepSpeed file that cannot be read is one).
absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path,
                                        std::vector<std::string>* field_errors = nullptr);

// Reads the DeepSpeed document named by spec->deepspeed (relative to `base_dir` unless absolute)
// into spec->deepspeed_config_json. Does nothing when no path is set or the document is already
// embedded. The error names the field and the file: "spec.deepspeed: cannot read ./ds.json: No such
// file".
absl::Status EmbedDeepSpeedConfig(absl::string_view base_dir, JobSpec* spec);

// Fills every unset field with its default (the HF Trainer's, where it has one). Pipeline stages
// inherit the job's training arguments for the fields they leave unset. Idempotent.
void ApplyJobSpecDefaults(JobSpec* spec);

struct ValidatedJobSpec {
  JobSpec spec;  // defaults applied
  // The DeepSpeed config the ranks will run with, every "auto" the control plane can know resolved.
  // For a pipeline, a JSON object of stage name -> resolved config. Empty without a DeepSpeed
  // config.
  std::string resolved_deepspeed_config_json;
  nlohmann::json resolved_deepspeed_config;  // the same document, parsed (null without one)
  std::vector<std::string> warnings;  // ignored DeepSpeed keys, values deferred to the trainer
};

// The DeepSpeed resolver's inputs from a job's resources and training arguments (hidden size left
// unknown).
DeepSpeedInputs DeepSpeedInputsFor(const JobSpec& spec, const trainctl::v1::TrainingArguments& t);

// Applies defaults and checks the whole spec, a pipeline's stages each as the job it runs as
// (common/pipeline_spec.h). INVALID_ARGUMENT lists every error, one per line:
// first `decode_errors` (what ParseJobSpec or the flags could not set), then the spec's own
// problems, leaving out those on a path a decode error already names.
absl::StatusOr<ValidatedJobSpec> ValidateJobSpec(
    const JobSpec& spec, const std::vector<std::string>& decode_errors = {});

// "sft", "grpo", ... for messages and tables.
std::string JobKindName(trainctl::v1::JobKind kind);

// The rule rewards a GRPO job may name in reward_funcs, in the order the rewards library documents
// them: "accuracy", "format", "iou". The one list the validator and the rewards registry share.
const std::vector<std::string>& RewardFuncNames();

// The reward_funcs a grpo job (or a pipeline with a grpo stage) gets when it names none, as
// open-r1-multimodal: accuracy, format.
const std::vector<std::string>& DefaultRewardFuncs();

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_JOB_SPEC_H_
