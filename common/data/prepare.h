// `trainctl prepare`: JSONL training data (record_parser.h's formats) turned once into a shard
// directory the trainer memory-maps — tokens, labels, image patches and grids, so training reads
// no JSON and decodes no image.
//
// For each record: parse, find each image (an absolute path; else under image_root, then beside
// the JSONL file; "file://" is stripped, http(s) refused), preprocess it (image_processor.h),
// expand its <|image_pad|>s to its merged patch count, render the Qwen2-VL chat template and
// tokenize it with the assistant-only label mask (tokenizer/chat_template.h). Records are
// processed on several threads; the output order is the input order, whatever the threads.
//
// Over max_seq_len, a sample is dropped (Overflow::kDrop, the default) or cut (kTruncate) at
// max_seq_len — moved back to the <|vision_start|> of an image it would split, so an image is
// kept whole or not at all — and dropped if no trained-on token is left. Both are counted.
//
// The directory is built under a temporary sibling name and renamed into place when complete.
#ifndef TRAINCTL_COMMON_DATA_PREPARE_H_
#define TRAINCTL_COMMON_DATA_PREPARE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data/batch.h"
#include "common/data/image_processor.h"
#include "common/data/manifest.h"
#include "common/data/record_parser.h"
#include "common/tokenizer/bpe_tokenizer.h"

namespace trainctl::data {

enum class Overflow { kDrop, kTruncate };

struct PrepareOptions {
  std::vector<std::string> inputs;  // JSONL files, read in this order
  std::string out_dir;
  std::string tokenizer_path;  // a tokenizer.json or a directory holding one
  std::string image_root;      // where relative image paths are looked for first
  bool skip_bad = false;       // leave bad records out (counted, listed) instead of failing
  int64_t max_seq_len = 0;     // 0: no limit
  Overflow overflow = Overflow::kDrop;
  ImageProcessorOptions image;
  PatchDtype patch_dtype = PatchDtype::kFloat32;
  int64_t shard_size_bytes = int64_t{256} << 20;
  bool overwrite = false;   // replace an existing out_dir
  int32_t num_threads = 0;  // 0: one per core
};

// Prepares the dataset and returns the manifest it wrote. INVALID_ARGUMENT for bad options;
// FAILED_PRECONDITION when out_dir exists (without overwrite); NOT_FOUND for an input or the
// tokenizer that cannot be read; for a bad record (unless skip_bad) its error prefixed with
// "FILE:LINE: ". Nothing is left at out_dir on error.
absl::StatusOr<DatasetManifest> PrepareDataset(const PrepareOptions& options);

// As above with a tokenizer already loaded (options.tokenizer_path is then only recorded).
absl::StatusOr<DatasetManifest> PrepareDataset(const PrepareOptions& options,
                                               const tokenizer::BpeTokenizer& tokenizer);

// Where image `path` of a record is: itself when absolute, else under `image_root` (when not
// empty), then beside the JSONL file (`jsonl_dir`); "file://" is stripped. INVALID_ARGUMENT for
// an http(s) URL or an empty path, NOT_FOUND listing the places tried.
absl::StatusOr<std::string> ResolveImagePath(std::string path, const std::string& jsonl_dir,
                                             const std::string& image_root);

// One parsed record made into a sample, as PrepareDataset does (before the max_seq_len rule).
// `jsonl_dir` is where relative image paths are looked for after options.image_root.
absl::StatusOr<Sample> BuildSample(const ParsedRecord& record, const std::string& jsonl_dir,
                                   const PrepareOptions& options,
                                   const tokenizer::BpeTokenizer& tokenizer);

// The kTruncate rule on a built sample (see above). Returns false when nothing is left to train
// on. FAILED_PRECONDITION when the tokenizer lacks <|vision_start|> or <|image_pad|>.
absl::StatusOr<bool> TruncateSample(int64_t max_seq_len, const tokenizer::BpeTokenizer& tokenizer,
                                    Sample* sample);

}  // namespace trainctl::data

#endif  // TRAINCTL_COMMON_DATA_PREPARE_H_
