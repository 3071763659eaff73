// One JSONL record of a training set, in any of the formats people keep Qwen2-VL data in, turned
// into chat messages plus the image paths they refer to:
//
//   open-r1-multimodal  {"image": "a.png" | [...], "problem": "...", "solution": "..."}
//                       -> user: the image(s), then the problem; assistant: the solution.
//   VLM-R1 / LLaVA      {"image": "a.png" | [...], "conversations": [{"from": "human"|"gpt"|
//                       "system", "value": "<image>..."}]}  ("user"/"assistant" also accepted)
//   messages            {"messages": [{"role": ..., "content": "..." | [{"type": "text",
//                       "text": ...}, {"type": "image"[, "image": "path"]}]}], "images": [...]}
//
// In string content each "<image>" marks where the next image goes; when a record has images but
// no "<image>" at all, they go first in the first user turn (as VLM-R1 and open-r1 put them).
// Other fields ("id", "shapes", ...) are ignored, but for "solution", kept as the record's
// reference answer whatever its format.
#ifndef TRAINCTL_COMMON_DATA_RECORD_PARSER_H_
#define TRAINCTL_COMMON_DATA_RECORD_PARSER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/chat_template.h"

namespace trainctl::data {

enum class RecordFormat { kOpenR1, kVlmR1, kMessages };

// "open-r1", "vlm-r1" or "messages".
const char* RecordFormatName(RecordFormat format);

struct ParsedRecord {
  RecordFormat format = RecordFormat::kMessages;
  // Image parts have image_tokens == 0: the count is known only once the image is processed. The
  // k-th image part across all messages is images[k].
  std::vector<tokenizer::ChatMessage> messages;
  std::vector<std::string> images;  // paths as the record writes them
  // The reference answer for rewards: the record's "solution" field in any format (a string as
  // is, a number or other JSON value as compact JSON, e.g. a box "[1,2,3,4]"), else the text parts
  // of its last assistant turn, concatenated.
  std::string solution;
};

// Parses one JSONL line. INVALID_ARGUMENT saying what is wrong (which field, which message) when
// it is not JSON, matches no format, has a role other than system/user/assistant (after mapping
// human/gpt), has no assistant turn, or its "<image>" marks and image parts do not match its
// image list. The caller adds the file and line.
absl::StatusOr<ParsedRecord> ParseRecord(absl::string_view line);

}  // namespace trainctl::data

#endif  // TRAINCTL_COMMON_DATA_RECORD_PARSER_H_
