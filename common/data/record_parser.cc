#include "common/data/record_parser.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainctl::data {
namespace {

using json = nlohmann::json;
using tokenizer::ChatMessage;
using tokenizer::ChatPart;

constexpr absl::string_view kImageMark = "<image>";

absl::Status Invalid(absl::string_view what) { return absl::InvalidArgumentError(what); }

// A string, or a number written as JSON (VLM-R1 allows numeric answers).
absl::StatusOr<std::string> TextOf(const json& value, absl::string_view field) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number()) return value.dump();
  return Invalid(absl::StrCat("'", field, "' must be a string"));
}

// "image" / "images" as a list of paths (a single string is a list of one).
absl::StatusOr<std::vector<std::string>> PathList(const json& record, const char* field) {
  std::vector<std::string> paths;
  if (!record.contains(field) || record[field].is_null()) return paths;
  const json& value = record[field];
  if (value.is_string()) {
    paths.push_back(value.get<std::string>());
    return paths;
  }
  if (!value.is_array()) return Invalid(absl::StrCat("'", field, "' must be a path or a list"));
  for (size_t i = 0; i < value.size(); ++i) {
    if (!value[i].is_string()) {
      return Invalid(absl::StrCat("'", field, "[", i, "]' must be a path string"));
    }
    paths.push_back(value[i].get<std::string>());
  }
  return paths;
}

// Text with "<image>" marks cut into text and image parts; counts the marks into `marks`.
std::vector<ChatPart> SplitImageMarks(absl::string_view text, size_t* marks) {
  std::vector<ChatPart> parts;
  while (true) {
    const size_t at = text.find(kImageMark);
    const absl::string_view before = text.substr(0, at);
    if (!before.empty()) parts.push_back(ChatPart::Text(std::string(before)));
    if (at == absl::string_view::npos) break;
    parts.push_back(ChatPart::Image(0));
    ++*marks;
    text.remove_prefix(at + kImageMark.size());
  }
  return parts;
}

// Puts `images` images first in the first user turn, when the text marked none.
absl::Status PlaceUnmarkedImages(size_t marks, size_t images, std::vector<ChatMessage>* messages) {
  if (marks == images) return absl::OkStatus();
  if (marks != 0) {
    return Invalid(absl::StrCat("the text has ", marks, " <image> mark(s) but the record lists ",
                                images, " image(s)"));
  }
  for (ChatMessage& m : *messages) {
    if (m.role != "user") continue;
    m.content.insert(m.content.begin(), images, ChatPart::Image(0));
    return absl::OkStatus();
  }
  return Invalid("the record has images but no user turn to put them in");
}

absl::Status CheckTurns(const std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return Invalid(
          absl::StrCat("message ", i, ": role '", role, "' is not system, user or assistant"));
    }
  }
  for (const ChatMessage& m : messages) {
    if (m.role == "assistant") return absl::OkStatus();
  }
  return Invalid("the record has no assistant turn to train on");
}

absl::StatusOr<ParsedRecord> ParseOpenR1(const json& record) {
  ParsedRecord out;
  out.format = RecordFormat::kOpenR1;
  auto images = PathList(record, record.contains("image") ? "image" : "images");
  if (!images.ok()) return images.status();
  out.images = std::move(*images);
  auto problem = TextOf(record["problem"], "problem");
  if (!problem.ok()) return problem.status();
  auto solution = TextOf(record["solution"], "solution");
  if (!solution.ok()) return solution.status();
  ChatMessage user{"user", {}};
  user.content.insert(user.content.end(), out.images.size(), ChatPart::Image(0));
  user.content.push_back(ChatPart::Text(std::move(*problem)));
  out.messages = {std::move(user), ChatMessage{"assistant", {ChatPart::Text(*solution)}}};
  return out;
}

std::string RoleOfSpeaker(const std::string& from) {
  if (from == "human" || from == "user") return "user";
  if (from == "gpt" || from == "assistant") return "assistant";
  return from;
}

absl::StatusOr<ParsedRecord> ParseVlmR1(const json& record) {
  ParsedRecord out;
  out.format = RecordFormat::kVlmR1;
  auto images = PathList(record, record.contains("image") ? "image" : "images");
  if (!images.ok()) return images.status();
  out.images = std::move(*images);
  const json& turns = record["conversations"];
  if (!turns.is_array()) return Invalid("'conversations' must be a list");
  size_t marks = 0;
  for (size_t i = 0; i < turns.size(); ++i) {
    const json& turn = turns[i];
    if (!turn.is_object() || !turn.contains("from") || !turn["from"].is_string() ||
        !turn.contains("value")) {
      return Invalid(absl::StrCat("conversations[", i, "] needs 'from' and 'value'"));
    }
    auto value = TextOf(turn["value"], absl::StrCat("conversations[", i, "].value"));
    if (!value.ok()) return value.status();
    out.messages.push_back(
        {RoleOfSpeaker(turn["from"].get<std::string>()), SplitImageMarks(*value, &marks)});
  }
  if (absl::Status s = PlaceUnmarkedImages(marks, out.images.size(), &out.messages); !s.ok()) {
    return s;
  }
  return out;
}

// A message's content: a string with <image> marks, or a list of typed parts. Inline image paths
// ({"type": "image", "image": "path"}) are inserted into `inline_paths` by position.
absl::Status ParseContent(const json& content, size_t index, ChatMessage* message, size_t* marks,
                          std::vector<std::pair<size_t, std::string>>* inline_paths,
                          size_t* image_parts) {
  if (content.is_string()) {
    const size_t before = *marks;
    message->content = SplitImageMarks(content.get<std::string>(), marks);
    *image_parts += *marks - before;
    return absl::OkStatus();
  }
  if (!content.is_array()) {
    return Invalid(absl::StrCat("messages[", index, "].content must be a string or a list"));
  }
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    const std::string where = absl::StrCat("messages[", index, "].content[", j, "]");
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return Invalid(absl::StrCat(where, " needs a 'type'"));
    }
    const std::string type = part["type"].get<std::string>();
    if (type == "text") {
      auto text = TextOf(part.value("text", json()), where + ".text");
      if (!text.ok()) return text.status();
      message->content.push_back(ChatPart::Text(std::move(*text)));
    } else if (type == "image") {
      for (const char* key : {"image", "path", "image_url"}) {
        if (part.contains(key) && part[key].is_string()) {
          inline_paths->emplace_back(*image_parts, part[key].get<std::string>());
          break;
        }
      }
      message->content.push_back(ChatPart::Image(0));
      ++*image_parts;
    } else {
      return Invalid(absl::StrCat(where, ": type '", type, "' is not text or image"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ParsedRecord> ParseMessages(const json& record) {
  ParsedRecord out;
  out.format = RecordFormat::kMessages;
  auto images = PathList(record, record.contains("images") ? "images" : "image");
  if (!images.ok()) return images.status();
  const json& messages = record["messages"];
  if (!messages.is_array()) return Invalid("'messages' must be a list");
  size_t marks = 0, image_parts = 0;
  std::vector<std::pair<size_t, std::string>> inline_paths;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content")) {
      return Invalid(absl::StrCat("messages[", i, "] needs 'role' and 'content'"));
    }
    ChatMessage message{m["role"].get<std::string>(), {}};
    if (absl::Status s =
            ParseContent(m["content"], i, &message, &marks, &inline_paths, &image_parts);
        !s.ok()) {
      return s;
    }
    out.messages.push_back(std::move(message));
  }
  // Parts without an inline path take the record's "images" in order.
  const size_t listed = image_parts - inline_paths.size();
  if (image_parts == 0 && !images->empty()) {
    out.images = std::move(*images);
    if (absl::Status s = PlaceUnmarkedImages(0, out.images.size(), &out.messages); !s.ok()) {
      return s;
    }
    return out;
  }
  if (listed != images->size()) {
    return Invalid(absl::StrCat("the messages have ", listed,
                                " image part(s) without a path but 'images' lists ",
                                images->size()));
  }
  size_t next_listed = 0, next_inline = 0;
  for (size_t k = 0; k < image_parts; ++k) {
    if (next_inline < inline_paths.size() && inline_paths[next_inline].first == k) {
      out.images.push_back(inline_paths[next_inline++].second);
    } else {
      out.images.push_back((*images)[next_listed++]);
    }
  }
  return out;
}

// The "solution" field as text, else the last assistant turn's text (CheckTurns ensured one).
std::string SolutionOf(const json& record, const std::vector<ChatMessage>& messages) {
  if (record.contains("solution") && !record["solution"].is_null()) {
    const json& solution = record["solution"];
    return solution.is_string() ? solution.get<std::string>() : solution.dump();
  }
  std::string text;
  for (auto m = messages.rbegin(); m != messages.rend(); ++m) {
    if (m->role != "assistant") continue;
    for (const ChatPart& part : m->content) {
      if (part.kind == ChatPart::Kind::kText) text += part.text;
    }
    break;
  }
  return text;
}

}  // namespace

const char* RecordFormatName(RecordFormat format) {
  switch (format) {
    case RecordFormat::kOpenR1:
      return "open-r1";
    case RecordFormat::kVlmR1:
      return "vlm-r1";
    case RecordFormat::kMessages:
      return "messages";
  }
  return "unknown";
}

absl::StatusOr<ParsedRecord> ParseRecord(absl::string_view line) {
  json record = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (record.is_discarded()) return Invalid("not valid JSON");
  if (!record.is_object()) return Invalid("a record must be a JSON object");
  absl::StatusOr<ParsedRecord> parsed;
  if (record.contains("messages")) {
    parsed = ParseMessages(record);
  } else if (record.contains("conversations")) {
    parsed = ParseVlmR1(record);
  } else if (record.contains("problem") && record.contains("solution")) {
    parsed = ParseOpenR1(record);
  } else {
    return Invalid(
        "unrecognised record: expected 'messages', 'conversations' or 'problem' + 'solution'");
  }
  if (!parsed.ok()) return parsed.status();
  if (absl::Status s = CheckTurns(parsed->messages); !s.ok()) return s;
  parsed->solution = SolutionOf(record, parsed->messages);
  return parsed;
}

}  // namespace trainctl::data
