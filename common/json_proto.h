// Decoding user documents (JSON, YAML, command-line strings) into protobuf messages by field name,
// with errors that name the field path. Protobuf's own JSON parser stops at the first problem and
// names fields poorly; users of spec files need every problem at once, each on its own line.
#ifndef TRAINCTL_COMMON_JSON_PROTO_H_
#define TRAINCTL_COMMON_JSON_PROTO_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "nlohmann/json.hpp"

namespace trainctl {

// Decodes the JSON object `value` into `msg`, field by field (proto field names). Every problem is
// appended to `errors` as "<path>.<field>: <what is wrong>"; fields without problems are still set.
// Enum fields take the short lower-case name ("sft" for JOB_KIND_SFT) or the full one, as
// protobuf's JSON printer writes it (a worker's launch file, MessageToJsonText); string fields take
// numbers and booleans as their text (YAML `NCCL_IB_DISABLE: 0`); integer fields take integral
// floats (1e9).
void DecodeJsonIntoMessage(const nlohmann::json& value, absl::string_view path,
                           google::protobuf::Message* msg, std::vector<std::string>* errors);

// Sets a singular scalar field from command-line text. Booleans follow the HF argument parser
// (true/false, yes/no, t/f, y/n, 1/0, any case). Returns INVALID_ARGUMENT saying what was expected.
absl::Status SetFieldFromText(absl::string_view text,
                              const google::protobuf::FieldDescriptor* field,
                              google::protobuf::Message* msg);

// Parses an HF-style boolean (see SetFieldFromText).
absl::StatusOr<bool> ParseHfBool(absl::string_view text);

// The candidate at most two edits from `name` (the nearest), or "" if none: for "did you mean"
// hints.
std::string ClosestName(absl::string_view name, const std::vector<std::string>& candidates);

// The short, lower-case user-facing name of an enum value: JOB_KIND_SFT -> "sft".
std::string EnumShortName(const google::protobuf::EnumValueDescriptor* value);

// The short name of value `number` of `type`, or "unknown(<number>)" when this binary's protos do
// not know it (a message from a newer peer). Never fails.
std::string EnumNumberName(const google::protobuf::EnumDescriptor* type, int number);

// Appends "<path>.<field>: ..." to `errors` for every enum field of `msg` (nested messages, lists
// and maps included) holding a value this binary does not know, and for every field number it does
// not know: what a client built from other protos may send, and what DecodeJsonIntoMessage can
// never produce. Paths are named as DecodeJsonIntoMessage names them.
void CheckKnownFieldsAndValues(const google::protobuf::Message& msg, absl::string_view path,
                               std::vector<std::string>* errors);

// The most nodes YamlToJson builds, aliases expanded (a few hundred bytes of nested aliases, the
// "billion laughs", would otherwise expand to gigabytes), and the deepest nesting it follows.
inline constexpr size_t kMaxYamlNodes = 100000;
inline constexpr int kMaxYamlDepth = 64;

// Converts YAML text to JSON. Plain scalars become numbers, booleans or null when they read as such
// (YAML 1.2 core schema); quoted scalars stay strings. Errors name `source`, line and column; a
// document past kMaxYamlNodes or kMaxYamlDepth is an error naming the limit.
absl::StatusOr<nlohmann::json> YamlToJson(absl::string_view text, absl::string_view source);

// Parses JSON text; errors name `source` and the byte offset.
absl::StatusOr<nlohmann::json> ParseJsonText(absl::string_view text, absl::string_view source);

// A short rendering of a JSON value for error messages ("got ...").
std::string Describe(const nlohmann::json& value);

// Serialises a message as JSON with proto field names (the names users write in spec files).
std::string MessageToJsonText(const google::protobuf::Message& msg, bool pretty);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_JSON_PROTO_H_
