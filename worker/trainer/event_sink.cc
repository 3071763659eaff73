#include "worker/trainer/event_sink.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace trainctl::trainer {

absl::StatusOr<std::unique_ptr<JsonLinesEventSink>> JsonLinesEventSink::Open(
    int event_fd, const std::string& fallback_path) {
  if (event_fd >= 0) {
    return std::unique_ptr<JsonLinesEventSink>(new JsonLinesEventSink(event_fd, /*owned=*/false));
  }
  if (fallback_path.empty()) {
    return std::unique_ptr<JsonLinesEventSink>(new JsonLinesEventSink(STDERR_FILENO, false));
  }
  const int fd = open(fallback_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open event file ", fallback_path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<JsonLinesEventSink>(new JsonLinesEventSink(fd, /*owned=*/true));
}

JsonLinesEventSink::~JsonLinesEventSink() {
  if (owned_) close(fd_);
}

void JsonLinesEventSink::Emit(const std::string& type, nlohmann::json fields) {
  fields["type"] = type;
  fields["time"] = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  const std::string line =
      fields.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  absl::MutexLock lock(&mu_);
  size_t written = 0;
  while (written < line.size()) {
    const ssize_t n = write(fd_, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the reader is gone; see the header
    written += static_cast<size_t>(n);
  }
}

std::string ConsoleEchoEventSink::Format(const std::string& type, const nlohmann::json& fields) {
  auto number = [&](const nlohmann::json& j, const char* key) {
    return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
  };
  if (type == "metric" && fields.contains("values") && fields["values"].is_object()) {
    const nlohmann::json& v = fields["values"];
    if (v.contains("prompts_done")) {  // trace distillation
      return absl::StrFormat(
          "distill: %d/%d prompts, %d completions, pass rate %.3f, %d kept, %.0f tokens/s",
          static_cast<int64_t>(number(v, "prompts_done")),
          static_cast<int64_t>(number(v, "prompts_total")),
          static_cast<int64_t>(number(v, "completions")), number(v, "pass_rate"),
          static_cast<int64_t>(number(v, "kept")), number(v, "tokens_per_second"));
    }
    // A stage that only measures (eval) prints its own table.
    if (!v.contains("loss")) return "";
    return absl::StrFormat(
        "step %d/%d: loss %.4f, lr %.3e, grad_norm %.3f, epoch %.2f, %.0f tokens/s, %.2f s/step",
        static_cast<int64_t>(number(fields, "step")),
        static_cast<int64_t>(number(v, "total_steps")), number(v, "loss"),
        number(v, "learning_rate"), number(v, "grad_norm"), number(v, "epoch"),
        number(v, "tokens_per_second"), number(v, "step_time"));
  }
  if (type == "checkpoint") {
    return absl::StrCat("checkpoint of step ", static_cast<int64_t>(number(fields, "step")),
                        " saved: ", fields.value("path", std::string()));
  }
  if (type == "warning") return absl::StrCat("warning: ", fields.value("message", std::string()));
  if (type == "status") {
    const std::string state = fields.value("state", std::string());
    if (state == "running") {
      return absl::StrCat(fields.value("kind", std::string()), " job '",
                          fields.value("name", std::string()), "' starting");
    }
    if (state == "distilled") {
      return absl::StrCat("traces: ", static_cast<int64_t>(number(fields, "kept")), " kept in ",
                          fields.value("traces", std::string()), ", dataset ",
                          fields.value("dataset", std::string()));
    }
    if (state == "succeeded") {
      if (number(fields, "steps") == 0) return "finished";  // a stage that does not train
      return absl::StrFormat("finished: %d steps, last loss %.4f, checkpoint %s",
                             static_cast<int64_t>(number(fields, "steps")), number(fields, "loss"),
                             fields.value("checkpoint", std::string()));
    }
  }
  return "";
}

void ConsoleEchoEventSink::Emit(const std::string& type, nlohmann::json fields) {
  const std::string line = Format(type, fields);
  inner_->Emit(type, std::move(fields));
  if (line.empty()) return;
  absl::MutexLock lock(&mu_);
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace trainctl::trainer
