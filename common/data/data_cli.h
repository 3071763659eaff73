// The data verbs of the `trainctl` command line, as functions the CLI dispatches to:
//
//   trainctl prepare --input FILE.jsonl [--input ...] --out DIR --tokenizer DIR_OR_JSON
//                    [--image_root DIR] [--skip_bad] [--max_seq_len N] [--truncate]
//                    [--min_pixels N] [--max_pixels N] [--shard_size_mb N] [--bf16_patches]
//                    [--overwrite] [--threads N]
//   trainctl datagen shapes --out DIR --n N [--seed S]
//
// Flags are `--name value` or `--name=value`. Exit codes: 0 done, 1 failed, 2 usage. Errors are
// one line on `err`: "trainctl prepare: ...".
#ifndef TRAINCTL_COMMON_DATA_DATA_CLI_H_
#define TRAINCTL_COMMON_DATA_DATA_CLI_H_

#include <ostream>
#include <string>
#include <vector>

namespace trainctl::data {

// `args`: what follows "prepare" on the command line. Prints a summary line (and one warning
// line per skipped record) on success.
int RunPrepareVerb(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// `args`: what follows "datagen", starting with the generator's name ("shapes").
int RunDatagenVerb(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// The usage lines of both verbs, for the CLI's help text.
const char* DataVerbsUsage();

}  // namespace trainctl::data

#endif  // TRAINCTL_COMMON_DATA_DATA_CLI_H_
