#include "common/json_proto.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/unknown_field_set.h"
#include "google/protobuf/util/json_util.h"
#include "yaml-cpp/yaml.h"

namespace trainctl {
namespace {

using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using nlohmann::json;

std::string JoinPath(absl::string_view path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

std::string UnknownFieldMessage(const google::protobuf::Descriptor* desc, absl::string_view key) {
  std::vector<std::string> names;
  for (int i = 0; i < desc->field_count(); ++i) names.push_back(desc->field(i)->name());
  const std::string best = ClosestName(key, names);
  if (!best.empty()) return absl::StrCat("unknown field (did you mean '", best, "'?)");
  return "unknown field";
}

std::string EnumChoices(const EnumDescriptor* desc) {
  std::vector<std::string> names;
  for (int i = 0; i < desc->value_count(); ++i) {
    if (desc->value(i)->number() == 0) continue;  // *_UNSPECIFIED is never a user choice
    names.push_back(EnumShortName(desc->value(i)));
  }
  return absl::StrJoin(names, "|");
}

const google::protobuf::EnumValueDescriptor* FindEnumValue(const EnumDescriptor* desc,
                                                           absl::string_view text) {
  for (int i = 0; i < desc->value_count(); ++i) {
    const auto* value = desc->value(i);
    if (value->number() == 0) continue;
    if (absl::EqualsIgnoreCase(EnumShortName(value), text) ||
        absl::EqualsIgnoreCase(value->name(), text)) {
      return value;
    }
  }
  return nullptr;
}

// Reads an integer out of a JSON number, accepting integral floats such as 1e9.
bool JsonToInt64(const json& value, int64_t* out) {
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() &&
        value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return false;
    }
    *out = value.get<int64_t>();
    return true;
  }
  if (value.is_string()) {  // proto3 JSON writes 64-bit integers as strings
    const std::string& text = value.get_ref<const std::string&>();
    return !text.empty() && text.find_first_not_of("-0123456789") == std::string::npos &&
           absl::SimpleAtoi(text, out);
  }
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) > 9.007199254740992e15)
      return false;
    *out = static_cast<int64_t>(d);
    return true;
  }
  return false;
}

// SetScalar for a bool field: true/false, or a string ParseHfBool reads.
std::string SetBoolScalar(const json& value, const FieldDescriptor* field, Message* msg) {
  const Reflection* r = msg->GetReflection();
  bool b;
  if (value.is_boolean()) {
    b = value.get<bool>();
  } else if (value.is_string()) {
    auto parsed = ParseHfBool(value.get<std::string>());
    if (!parsed.ok()) return absl::StrCat("must be true or false, got ", Describe(value));
    b = *parsed;
  } else {
    return absl::StrCat("must be true or false, got ", Describe(value));
  }
  field->is_repeated() ? r->AddBool(msg, field, b) : r->SetBool(msg, field, b);
  return "";
}

// SetScalar for a (u)int32/(u)int64 field: an integer (JsonToInt64) in the field's range.
std::string SetIntegerScalar(const json& value, const FieldDescriptor* field, Message* msg) {
  const Reflection* r = msg->GetReflection();
  const bool rep = field->is_repeated();
  int64_t v;
  if (!JsonToInt64(value, &v)) return absl::StrCat("must be an integer, got ", Describe(value));
  const auto type = field->cpp_type();
  const bool is32 =
      type == FieldDescriptor::CPPTYPE_INT32 || type == FieldDescriptor::CPPTYPE_UINT32;
  const bool is_unsigned =
      type == FieldDescriptor::CPPTYPE_UINT32 || type == FieldDescriptor::CPPTYPE_UINT64;
  if (is_unsigned && v < 0) return absl::StrCat("must be >= 0, got ", v);
  if (is32 &&
      (v > std::numeric_limits<int32_t>::max() || v < std::numeric_limits<int32_t>::min())) {
    return absl::StrCat("out of range for a 32-bit integer, got ", v);
  }
  switch (type) {
    case FieldDescriptor::CPPTYPE_INT32:
      rep ? r->AddInt32(msg, field, v) : r->SetInt32(msg, field, v);
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      rep ? r->AddInt64(msg, field, v) : r->SetInt64(msg, field, v);
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      rep ? r->AddUInt32(msg, field, v) : r->SetUInt32(msg, field, v);
      break;
    default:
      rep ? r->AddUInt64(msg, field, v) : r->SetUInt64(msg, field, v);
      break;
  }
  return "";
}

// SetScalar for a double or float field: a finite number.
std::string SetFloatingScalar(const json& value, const FieldDescriptor* field, Message* msg) {
  const Reflection* r = msg->GetReflection();
  const bool rep = field->is_repeated();
  if (!value.is_number()) return absl::StrCat("must be a number, got ", Describe(value));
  const double d = value.get<double>();
  if (!std::isfinite(d)) return absl::StrCat("must be finite, got ", Describe(value));
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
    rep ? r->AddDouble(msg, field, d) : r->SetDouble(msg, field, d);
  } else {
    rep ? r->AddFloat(msg, field, static_cast<float>(d))
        : r->SetFloat(msg, field, static_cast<float>(d));
  }
  return "";
}

// SetScalar for a string field: a string, or a number or bool as its JSON text.
std::string SetStringScalar(const json& value, const FieldDescriptor* field, Message* msg) {
  const Reflection* r = msg->GetReflection();
  std::string s;
  if (value.is_string()) {
    s = value.get<std::string>();
  } else if (value.is_number() || value.is_boolean()) {
    s = value.dump();
  } else {
    return absl::StrCat("must be a string, got ", Describe(value));
  }
  field->is_repeated() ? r->AddString(msg, field, std::move(s))
                       : r->SetString(msg, field, std::move(s));
  return "";
}

// SetScalar for an enum field: a value's short or full name, in any case (never *_UNSPECIFIED).
std::string SetEnumScalar(const json& value, const FieldDescriptor* field, Message* msg) {
  const Reflection* r = msg->GetReflection();
  const auto* enum_value =
      value.is_string() ? FindEnumValue(field->enum_type(), value.get<std::string>()) : nullptr;
  if (enum_value == nullptr) {
    return absl::StrCat("must be one of ", EnumChoices(field->enum_type()), ", got ",
                        Describe(value));
  }
  field->is_repeated() ? r->AddEnum(msg, field, enum_value) : r->SetEnum(msg, field, enum_value);
  return "";
}

// Converts one JSON scalar to the field's type. Returns "" on success, else what is wrong.
std::string SetScalar(const json& value, const FieldDescriptor* field, Message* msg) {
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_BOOL:
      return SetBoolScalar(value, field, msg);
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      return SetIntegerScalar(value, field, msg);
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      return SetFloatingScalar(value, field, msg);
    case FieldDescriptor::CPPTYPE_STRING:
      return SetStringScalar(value, field, msg);
    case FieldDescriptor::CPPTYPE_ENUM:
      return SetEnumScalar(value, field, msg);
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return "unsupported field type";
}

void DecodeMapField(const json& value, const std::string& path, const FieldDescriptor* field,
                    Message* msg, std::vector<std::string>* errors) {
  if (!value.is_object()) {
    errors->push_back(absl::StrCat(path, ": must be a mapping, got ", Describe(value)));
    return;
  }
  const FieldDescriptor* key_field = field->message_type()->map_key();
  const FieldDescriptor* value_field = field->message_type()->map_value();
  for (const auto& [key, item] : value.items()) {
    const std::string item_path = JoinPath(path, key);
    if (key.empty()) {
      errors->push_back(absl::StrCat(path, ": keys must not be empty"));
      continue;
    }
    Message* entry = msg->GetReflection()->AddMessage(msg, field);
    entry->GetReflection()->SetString(entry, key_field, key);
    if (value_field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      DecodeJsonIntoMessage(item, item_path,
                            entry->GetReflection()->MutableMessage(entry, value_field), errors);
    } else if (std::string problem = SetScalar(item, value_field, entry); !problem.empty()) {
      errors->push_back(absl::StrCat(item_path, ": ", problem));
    }
  }
}

void DecodeField(const json& value, const std::string& path, const FieldDescriptor* field,
                 Message* msg, std::vector<std::string>* errors) {
  const Reflection* r = msg->GetReflection();
  if (field->is_map()) return DecodeMapField(value, path, field, msg, errors);
  if (field->is_repeated()) {
    if (!value.is_array()) {
      errors->push_back(absl::StrCat(path, ": must be a list, got ", Describe(value)));
      return;
    }
    for (size_t i = 0; i < value.size(); ++i) {
      const std::string item_path = absl::StrCat(path, "[", i, "]");
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        DecodeJsonIntoMessage(value[i], item_path, r->AddMessage(msg, field), errors);
      } else if (std::string problem = SetScalar(value[i], field, msg); !problem.empty()) {
        errors->push_back(absl::StrCat(item_path, ": ", problem));
      }
    }
    return;
  }
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    DecodeJsonIntoMessage(value, path, r->MutableMessage(msg, field), errors);
    return;
  }
  if (std::string problem = SetScalar(value, field, msg); !problem.empty()) {
    errors->push_back(absl::StrCat(path, ": ", problem));
  }
}

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
// JSON text and proto string fields must be; yaml-cpp passes stray bytes through unchecked.
bool IsValidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    size_t extra;
    uint32_t cp;
    if (lead < 0x80) {
      ++i;
      continue;
    } else if ((lead & 0xE0) == 0xC0) {
      extra = 1;
      cp = lead & 0x1F;
    } else if ((lead & 0xF0) == 0xE0) {
      extra = 2;
      cp = lead & 0x0F;
    } else if ((lead & 0xF8) == 0xF0) {
      extra = 3;
      cp = lead & 0x07;
    } else {
      return false;
    }
    if (text.size() - i <= extra) return false;
    for (size_t k = 1; k <= extra; ++k) {
      const auto cont = static_cast<unsigned char>(text[i + k]);
      if ((cont & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cont & 0x3F);
    }
    constexpr uint32_t kMinForLength[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += extra + 1;
  }
  return true;
}

// What is left of a document's node budget, and how deep the current node is.
struct YamlBudget {
  size_t nodes_left = kMaxYamlNodes;
  int depth = 0;
};

json YamlNodeToJson(const YAML::Node& node, YamlBudget& budget) {
  if (budget.nodes_left == 0) {
    throw YAML::ParserException(node.Mark(),
                                absl::StrCat("the document has more than ", kMaxYamlNodes,
                                             " nodes with its aliases expanded (the limit)"));
  }
  --budget.nodes_left;
  if (budget.depth >= kMaxYamlDepth) {
    throw YAML::ParserException(
        node.Mark(), absl::StrCat("nested deeper than ", kMaxYamlDepth, " levels (the limit)"));
  }
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Sequence: {
      ++budget.depth;
      json out = json::array();
      for (const auto& item : node) out.push_back(YamlNodeToJson(item, budget));
      --budget.depth;
      return out;
    }
    case YAML::NodeType::Map: {
      ++budget.depth;
      json out = json::object();
      for (const auto& item : node) {
        const std::string key = item.first.as<std::string>();
        if (!IsValidUtf8(key)) throw YAML::ParserException(item.first.Mark(), "invalid UTF-8");
        if (out.contains(key)) {
          throw YAML::ParserException(item.first.Mark(), "duplicate key '" + key + "'");
        }
        out[key] = YamlNodeToJson(item.second, budget);
      }
      --budget.depth;
      return out;
    }
    case YAML::NodeType::Scalar:
      break;
  }
  const std::string& text = node.Scalar();
  if (!IsValidUtf8(text)) throw YAML::ParserException(node.Mark(), "invalid UTF-8");
  if (node.Tag() == "!") return text;  // quoted: always a string
  if (text == "~" || text == "null" || text == "Null" || text == "NULL") return nullptr;
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  int64_t i;
  if (absl::SimpleAtoi(text, &i) && text.find_first_of("xX") == std::string::npos) return i;
  double d;
  const bool looks_numeric =
      !text.empty() && text.find_first_not_of("0123456789+-.eE") == std::string::npos;
  if (looks_numeric && absl::SimpleAtod(text, &d)) return d;
  return text;
}

}  // namespace

std::string ClosestName(absl::string_view name, const std::vector<std::string>& candidates) {
  // Levenshtein distance, one row at a time.
  auto distance = [](absl::string_view a, absl::string_view b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diag = up;
      }
    }
    return row[b.size()];
  };
  std::string best;
  size_t best_distance = 3;  // at most two edits away
  for (const std::string& candidate : candidates) {
    if (const size_t d = distance(name, candidate); d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

std::string EnumShortName(const google::protobuf::EnumValueDescriptor* value) {
  // JobKind -> JOB_KIND_, the prefix every value of the enum carries.
  std::string prefix;
  for (char c : value->type()->name()) {
    if (absl::ascii_isupper(c) && !prefix.empty()) prefix += '_';
    prefix += absl::ascii_toupper(c);
  }
  prefix += '_';
  absl::string_view name = value->name();
  if (absl::StartsWith(name, prefix)) name.remove_prefix(prefix.size());
  return absl::AsciiStrToLower(name);
}

std::string EnumNumberName(const EnumDescriptor* type, int number) {
  const auto* value = type->FindValueByNumber(number);
  return value == nullptr ? absl::StrCat("unknown(", number, ")") : EnumShortName(value);
}

void CheckKnownFieldsAndValues(const Message& msg, absl::string_view path,
                               std::vector<std::string>* errors) {
  const Reflection* r = msg.GetReflection();
  const google::protobuf::UnknownFieldSet& unknown = r->GetUnknownFields(msg);
  for (int i = 0; i < unknown.field_count(); ++i) {
    errors->push_back(absl::StrCat(path, ": unknown field number ", unknown.field(i).number(), " (",
                                   msg.GetTypeName(), " has no such field)"));
  }
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(msg, &fields);
  for (const FieldDescriptor* field : fields) {
    const std::string field_path = JoinPath(path, field->name());
    if (field->is_map()) {
      const FieldDescriptor* key_field = field->message_type()->map_key();
      for (int i = 0; i < r->FieldSize(msg, field); ++i) {
        const Message& entry = r->GetRepeatedMessage(msg, field, i);
        const std::string key = key_field->cpp_type() == FieldDescriptor::CPPTYPE_STRING
                                    ? entry.GetReflection()->GetString(entry, key_field)
                                    : absl::StrCat("[", i, "]");
        const FieldDescriptor* value_field = field->message_type()->map_value();
        const Reflection* er = entry.GetReflection();
        if (value_field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
          CheckKnownFieldsAndValues(er->GetMessage(entry, value_field), JoinPath(field_path, key),
                                    errors);
        } else if (value_field->cpp_type() == FieldDescriptor::CPPTYPE_ENUM &&
                   value_field->enum_type()->FindValueByNumber(
                       er->GetEnumValue(entry, value_field)) == nullptr) {
          errors->push_back(absl::StrCat(JoinPath(field_path, key), ": must be one of ",
                                         EnumChoices(value_field->enum_type()), ", got ",
                                         er->GetEnumValue(entry, value_field)));
        }
      }
      continue;
    }
    const int count = field->is_repeated() ? r->FieldSize(msg, field) : 1;
    for (int i = 0; i < count; ++i) {
      const std::string item_path =
          field->is_repeated() ? absl::StrCat(field_path, "[", i, "]") : field_path;
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        CheckKnownFieldsAndValues(
            field->is_repeated() ? r->GetRepeatedMessage(msg, field, i) : r->GetMessage(msg, field),
            item_path, errors);
      } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
        const int number = field->is_repeated() ? r->GetRepeatedEnumValue(msg, field, i)
                                                : r->GetEnumValue(msg, field);
        if (field->enum_type()->FindValueByNumber(number) == nullptr) {
          errors->push_back(absl::StrCat(item_path, ": must be one of ",
                                         EnumChoices(field->enum_type()), ", got ", number));
        }
      }
    }
  }
}

void DecodeJsonIntoMessage(const json& value, absl::string_view path, Message* msg,
                           std::vector<std::string>* errors) {
  if (value.is_null()) return;
  if (!value.is_object()) {
    errors->push_back(absl::StrCat(path, ": must be a mapping, got ", Describe(value)));
    return;
  }
  const auto* desc = msg->GetDescriptor();
  for (const auto& [key, item] : value.items()) {
    const std::string field_path = JoinPath(path, key);
    const FieldDescriptor* field = desc->FindFieldByName(key);
    if (field == nullptr) {
      errors->push_back(absl::StrCat(field_path, ": ", UnknownFieldMessage(desc, key)));
      continue;
    }
    if (item.is_null()) continue;  // explicit null: leave the default
    DecodeField(item, field_path, field, msg, errors);
  }
}

absl::StatusOr<bool> ParseHfBool(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "true" || lower == "t" || lower == "yes" || lower == "y" || lower == "1")
    return true;
  if (lower == "false" || lower == "f" || lower == "no" || lower == "n" || lower == "0")
    return false;
  return absl::InvalidArgumentError(
      absl::StrCat("must be True or False (or yes/no, 1/0), got '", text, "'"));
}

absl::Status SetFieldFromText(absl::string_view text, const FieldDescriptor* field, Message* msg) {
  if (!IsValidUtf8(text)) return absl::InvalidArgumentError("must be valid UTF-8 text");
  json value;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
    case FieldDescriptor::CPPTYPE_ENUM:
    case FieldDescriptor::CPPTYPE_BOOL:
      value = std::string(text);
      break;
    default: {
      int64_t i;
      double d;
      if (absl::SimpleAtoi(text, &i)) {
        value = i;
      } else if (absl::SimpleAtod(text, &d) && !text.empty() &&
                 text.find_first_not_of("0123456789+-.eE") == absl::string_view::npos) {
        value = d;
      } else {
        value = std::string(text);  // SetScalar reports the type error
      }
    }
  }
  if (std::string problem = SetScalar(value, field, msg); !problem.empty()) {
    return absl::InvalidArgumentError(problem);
  }
  return absl::OkStatus();
}

absl::StatusOr<json> YamlToJson(absl::string_view text, absl::string_view source) {
  try {
    const YAML::Node root = YAML::Load(std::string(text));
    YamlBudget budget;
    return YamlNodeToJson(root, budget);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", e.mark.line + 1, ":",
                                                   e.mark.column + 1, ": invalid YAML: ", e.msg));
  }
}

absl::StatusOr<json> ParseJsonText(absl::string_view text, absl::string_view source) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    // Convert the byte offset to line:column, which is what an editor jumps to.
    size_t line = 1, column = 1;
    for (size_t i = 0; i + 1 < e.byte && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    std::string what = e.what();
    if (auto pos = what.find("syntax error"); pos != std::string::npos) what = what.substr(pos);
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", line, ":", column, ": invalid JSON: ", what));
  } catch (const json::exception& e) {
    // Not a syntax error but a value the parser cannot hold: out_of_range 406, a number that
    // overflows a double ("number overflow parsing '1e999'"); the message quotes it.
    const std::string what = e.what();
    const size_t tag_end = what.find("] ");  // "[json.exception.out_of_range.406] "
    return absl::InvalidArgumentError(absl::StrCat(
        source,
        ": invalid JSON: ", tag_end == std::string::npos ? what : what.substr(tag_end + 2)));
  }
}

std::string Describe(const json& value) {
  if (value.is_object()) return "a mapping";
  if (value.is_array()) return "a list";
  if (value.is_null()) return "null";
  // dump() writes a non-finite double as null; a YAML 1e999 or .inf reaches here as one.
  if (value.is_number_float() && !std::isfinite(value.get<double>())) {
    const double d = value.get<double>();
    return std::isnan(d) ? "NaN" : (d > 0 ? "infinity" : "-infinity");
  }
  // Never throws: invalid UTF-8 (which has no place in a message anyway) is shown as U+FFFD.
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

std::string MessageToJsonText(const Message& msg, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.add_whitespace = pretty;
  std::string out;
  // Serialising an in-memory message only fails for invalid UTF-8, which the decoders never store.
  (void)google::protobuf::util::MessageToJsonString(msg, &out, options);
  return out;
}

}  // namespace trainctl
