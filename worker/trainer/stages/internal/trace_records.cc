#include "worker/trainer/stages/internal/trace_records.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/data/prepare.h"
#include "common/data/record_parser.h"
#include "worker/trainer/rewards/rule_rewards.h"

namespace trainctl::trainer::internal {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tokenizer::ChatMessage;
using tokenizer::ChatPart;

absl::StatusOr<std::vector<std::string>> JsonlFiles(const std::string& data_path) {
  std::error_code ec;
  if (fs::is_regular_file(data_path, ec)) return std::vector<std::string>{data_path};
  std::vector<std::string> files;
  if (fs::is_directory(data_path, ec)) {
    for (const fs::directory_entry& entry : fs::directory_iterator(data_path, ec)) {
      if (entry.is_regular_file() && entry.path().extension() == ".jsonl") {
        files.push_back(entry.path().string());
      }
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "spec.data_path: ", data_path,
        " is neither a JSONL file nor a directory holding *.jsonl files (trace distillation reads "
        "the raw records: the teacher needs their images and solutions)"));
  }
  return files;
}

// The record's turns without the assistant's (and, under a system prompt, its own system turns),
// the images of the parts kept resolved.
absl::StatusOr<TeacherPrompt> PromptOf(const data::ParsedRecord& record, const std::string& dir,
                                       const std::string& system_prompt) {
  TeacherPrompt prompt;
  if (!system_prompt.empty()) {
    prompt.messages.push_back(ChatMessage{"system", {ChatPart::Text(system_prompt)}});
  }
  size_t k = 0;
  for (const ChatMessage& m : record.messages) {
    const bool keep = m.role == "user" || (m.role == "system" && system_prompt.empty());
    for (const ChatPart& part : m.content) {
      if (part.kind != ChatPart::Kind::kImage) continue;
      if (k >= record.images.size())
        return absl::InvalidArgumentError("more image parts than images");
      if (keep) {
        absl::StatusOr<std::string> path = data::ResolveImagePath(record.images[k], dir, "");
        if (!path.ok()) return path.status();
        prompt.images.push_back(fs::absolute(*path).lexically_normal().string());
      }
      ++k;
    }
    if (keep) prompt.messages.push_back(m);
  }
  return prompt;
}

CompletionVerdict VerdictFromJson(const json& j) {
  CompletionVerdict v;
  v.text = j.at("text").get<std::string>();
  v.finish_reason = j.value("finish_reason", "");
  v.tokens = j.value("tokens", int64_t{0});
  v.passed = j.at("passed").get<bool>();
  const json& rewards = j.at("rewards");
  v.accuracy = rewards.at("accuracy").get<double>();
  v.format = rewards.at("format").get<double>();
  return v;
}

PromptOutcome OutcomeFromJson(const json& j) {
  PromptOutcome o;
  o.index = j.at("index").get<int64_t>();
  o.prompt_tokens = j.value("prompt_tokens", int64_t{0});
  for (const json& c : j.at("completions")) o.completions.push_back(VerdictFromJson(c));
  o.kept = j.at("kept").get<std::vector<int64_t>>();
  for (const int64_t k : o.kept) {
    if (k < 0 || k >= static_cast<int64_t>(o.completions.size())) {
      throw json::out_of_range::create(401, "kept names no completion", nullptr);
    }
  }
  return o;
}

json PartsJson(const std::vector<ChatPart>& parts) {
  json out = json::array();
  for (const ChatPart& part : parts) {
    if (part.kind == ChatPart::Kind::kImage) {
      out.push_back({{"type", "image"}});
    } else {
      out.push_back({{"type", "text"}, {"text", part.text}});
    }
  }
  return out;
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << bytes;
    if (!out.flush()) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<TracePrompt>> LoadTracePrompts(const std::string& data_path,
                                                          const std::string& system_prompt) {
  absl::StatusOr<std::vector<std::string>> files = JsonlFiles(data_path);
  if (!files.ok()) return files.status();
  std::vector<TracePrompt> prompts;
  for (const std::string& file : *files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", file));
    const std::string dir = fs::path(file).parent_path().string();
    std::string line;
    for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
      if (absl::StripAsciiWhitespace(line).empty()) continue;
      auto fail = [&](const absl::Status& s) {
        return absl::Status(s.code(), absl::StrCat(file, ":", line_no, ": ", s.message()));
      };
      absl::StatusOr<data::ParsedRecord> record = data::ParseRecord(line);
      if (!record.ok()) return fail(record.status());
      absl::StatusOr<TeacherPrompt> prompt = PromptOf(*record, dir, system_prompt);
      if (!prompt.ok()) return fail(prompt.status());
      prompt->index = static_cast<int64_t>(prompts.size());
      prompts.push_back(TracePrompt{*std::move(prompt), record->solution});
    }
  }
  return prompts;
}

PromptOutcome Verify(const TeacherAnswer& answer, const std::string& solution,
                     int64_t keep_per_prompt) {
  PromptOutcome out;
  out.index = answer.index;
  out.prompt_tokens = answer.prompt_tokens;
  for (const TeacherCompletion& c : answer.completions) {
    CompletionVerdict v;
    v.text = c.text;
    v.finish_reason = c.finish_reason;
    v.tokens = c.completion_tokens;
    v.accuracy = rewards::AccuracyReward(c.text, solution);
    v.format = rewards::FormatReward(c.text, solution);
    v.passed = v.accuracy == 1.0 && v.format == 1.0;
    if (v.passed && static_cast<int64_t>(out.kept.size()) < keep_per_prompt) {
      out.kept.push_back(static_cast<int64_t>(out.completions.size()));
    }
    out.completions.push_back(std::move(v));
  }
  return out;
}

json OutcomeToJson(const PromptOutcome& outcome) {
  json completions = json::array();
  for (const CompletionVerdict& v : outcome.completions) {
    completions.push_back({{"text", v.text},
                           {"finish_reason", v.finish_reason},
                           {"tokens", v.tokens},
                           {"passed", v.passed},
                           {"rewards", {{"accuracy", v.accuracy}, {"format", v.format}}}});
  }
  return {{"index", outcome.index},
          {"prompt_tokens", outcome.prompt_tokens},
          {"completions", std::move(completions)},
          {"kept", outcome.kept}};
}

absl::StatusOr<ProgressLog> ProgressLog::Open(const std::string& dir, int rank) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string path = (fs::path(dir) / absl::StrCat("rank-", rank, ".jsonl")).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  ProgressLog log(path, fd);
  // A torn last line (no newline after it) is cut, so the next append starts a line of its own.
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t keep = bytes.empty() || bytes.back() == '\n' ? bytes.size() : bytes.rfind('\n') + 1;
  if (keep < bytes.size() && ::ftruncate(fd, static_cast<off_t>(keep)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot cut the torn last line of ", path, ": ", std::strerror(errno)));
  }
  return log;
}

ProgressLog::ProgressLog(ProgressLog&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

ProgressLog::~ProgressLog() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status ProgressLog::Append(const std::vector<PromptOutcome>& outcomes) {
  std::string bytes;
  for (const PromptOutcome& o : outcomes) absl::StrAppend(&bytes, OutcomeToJson(o).dump(), "\n");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot append to ", path_, ": ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd_) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot fsync ", path_, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<int64_t, PromptOutcome>> ReadProgress(const std::string& dir) {
  std::map<int64_t, PromptOutcome> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  std::vector<std::string> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, "rank-") && absl::EndsWith(name, ".jsonl")) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t begin = 0;
    for (int64_t line_no = 1; begin < bytes.size(); ++line_no) {
      const size_t end = bytes.find('\n', begin);
      if (end == std::string::npos) break;  // torn: the writer died mid-line
      const std::string line = bytes.substr(begin, end - begin);
      begin = end + 1;
      try {
        PromptOutcome o = OutcomeFromJson(json::parse(line));
        out.emplace(o.index, std::move(o));
      } catch (const json::exception& e) {
        return absl::DataLossError(absl::StrCat(file, ":", line_no, ": malformed progress line (",
                                                e.what(), "); remove it to redo that prompt"));
      }
    }
  }
  return out;
}

absl::StatusOr<int64_t> WriteTraces(const std::string& path,
                                    const std::vector<TracePrompt>& prompts,
                                    const std::map<int64_t, PromptOutcome>& outcomes) {
  std::string bytes;
  int64_t written = 0;
  for (const auto& [index, outcome] : outcomes) {
    if (index < 0 || index >= static_cast<int64_t>(prompts.size())) continue;
    const TracePrompt& p = prompts[static_cast<size_t>(index)];
    for (const int64_t k : outcome.kept) {
      json messages = json::array();
      for (const ChatMessage& m : p.prompt.messages) {
        messages.push_back({{"role", m.role}, {"content", PartsJson(m.content)}});
      }
      messages.push_back(
          {{"role", "assistant"},
           {"content",
            json::array({{{"type", "text"},
                          {"text", outcome.completions[static_cast<size_t>(k)].text}}})}});
      const json record = {{"messages", std::move(messages)},
                           {"images", p.prompt.images},
                           {"solution", p.solution},
                           {"index", index}};
      absl::StrAppend(&bytes, record.dump(), "\n");
      ++written;
    }
  }
  if (absl::Status s = WriteFileAtomically(path, bytes); !s.ok()) return s;
  return written;
}

absl::Status WriteJsonFile(const std::string& path, const json& doc) {
  return WriteFileAtomically(path, doc.dump(2) + "\n");
}

}  // namespace trainctl::trainer::internal
