#include "worker/daemon/gpu_metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "worker/daemon/run_program.h"

namespace trainctl::worker {
namespace {

constexpr int kColumns = 10;
constexpr double kMiB = 1024.0 * 1024.0;

// A field the driver cannot report: "[N/A]", "[Not Supported]", "[Unknown Error]", "N/A", ...
bool IsUnavailable(absl::string_view value) {
  return value.empty() || value == "N/A" ||
         (absl::StartsWith(value, "[") && absl::EndsWith(value, "]"));
}

}  // namespace

std::vector<GpuReading> ParseGpuMetricsCsv(absl::string_view csv,
                                           std::vector<std::string>* warnings) {
  std::vector<GpuReading> gpus;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(csv, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    auto warn = [&](absl::string_view what) {
      if (warnings != nullptr) {
        warnings->push_back(absl::StrCat("nvidia-smi line ", line_no, " (", line, "): ", what));
      }
    };
    std::vector<absl::string_view> cols = absl::StrSplit(line, ',');
    if (cols.size() != kColumns) {
      warn(absl::StrCat("expected ", kColumns, " comma-separated columns, got ", cols.size(),
                        "; row skipped"));
      continue;
    }
    for (absl::string_view& c : cols) c = absl::StripAsciiWhitespace(c);
    GpuReading gpu;
    if (!absl::SimpleAtoi(cols[0], &gpu.index) || gpu.index < 0) {
      warn("index is not a number; row skipped");
      continue;
    }
    if (IsUnavailable(cols[1])) {
      warn("no uuid; row skipped");
      continue;
    }
    gpu.uuid = std::string(cols[1]);
    gpu.name = IsUnavailable(cols[2]) ? "" : std::string(cols[2]);
    // value * multiply / divide, in base units (dividing by 100 gives 0.97, not
    // 0.9700000000000001).
    struct Field {
      const char* name;
      double multiply, divide;
      std::optional<double>* out;
    };
    const Field fields[] = {
        {"utilization.gpu", 1, 100, &gpu.utilization_ratio},
        {"memory.used", kMiB, 1, &gpu.memory_used_bytes},
        {"memory.total", kMiB, 1, &gpu.memory_total_bytes},
        {"power.draw", 1, 1, &gpu.power_watts},
        {"temperature.gpu", 1, 1, &gpu.temperature_celsius},
        {"clocks.sm", 1e6, 1, &gpu.sm_clock_hertz},
        {"ecc.errors.uncorrected.volatile.total", 1, 1, &gpu.ecc_uncorrected_errors},
    };
    for (size_t i = 0; i < std::size(fields); ++i) {
      const absl::string_view value = cols[3 + i];
      if (IsUnavailable(value)) continue;
      double v = 0;
      // Temperatures may be negative in principle; nothing else here can.
      if (!absl::SimpleAtod(value, &v) || !std::isfinite(v) ||
          (v < 0 && fields[i].out != &gpu.temperature_celsius)) {
        warn(absl::StrCat(fields[i].name, " is '", value, "'; field skipped"));
        continue;
      }
      *fields[i].out = v * fields[i].multiply / fields[i].divide;
    }
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

absl::StatusOr<std::vector<GpuReading>> QueryGpuMetrics(const std::string& nvidia_smi,
                                                        absl::Duration timeout,
                                                        std::vector<std::string>* warnings) {
  absl::StatusOr<std::string> out = RunToCompletion(
      {nvidia_smi, absl::StrCat("--query-gpu=", kGpuMetricsQuery), "--format=csv,noheader,nounits"},
      timeout);
  if (!out.ok()) return out.status();
  return ParseGpuMetricsCsv(*out, warnings);
}

std::optional<int> ParseXidLine(absl::string_view line) {
  constexpr absl::string_view kMarker = "NVRM: Xid (";
  const size_t at = line.find(kMarker);
  if (at == absl::string_view::npos) return std::nullopt;
  absl::string_view rest = line.substr(at + kMarker.size());
  const size_t close = rest.find(')');
  if (close == absl::string_view::npos) return std::nullopt;
  rest = rest.substr(close + 1);
  if (!absl::ConsumePrefix(&rest, ":")) return std::nullopt;
  rest = absl::StripLeadingAsciiWhitespace(rest);
  size_t digits = 0;
  while (digits < rest.size() && digits < 6 && absl::ascii_isdigit(rest[digits])) ++digits;
  if (digits == 0 || (digits < rest.size() && rest[digits] != ',' && rest[digits] != ' ')) {
    return std::nullopt;
  }
  int xid = 0;
  if (!absl::SimpleAtoi(rest.substr(0, digits), &xid)) return std::nullopt;
  return xid;
}

KernelLogReader::KernelLogReader(std::string path) : path_(std::move(path)) {}

KernelLogReader::~KernelLogReader() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<std::vector<int>> KernelLogReader::ReadNewXids(size_t max_bytes) {
  if (!error_.ok()) return error_;
  auto fail = [&](int err, absl::string_view what) {
    error_ = absl::ErrnoToStatus(err, absl::StrCat("kernel log ", path_, ": ", what));
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    return error_;
  };
  if (fd_ < 0) {
    fd_ = open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) return fail(errno, "cannot open");
  }
  std::vector<int> xids;
  // /dev/kmsg hands out one whole record per read and refuses a buffer shorter than it (records
  // are at most ~8 KiB).
  char buf[16384];
  size_t total = 0;
  while (total < max_bytes) {
    const ssize_t n = read(fd_, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE) continue;  // kmsg: records overwritten before we read them; go on
      if (errno == EAGAIN) break;    // kmsg: nothing new
      return fail(errno, "read failed");
    }
    if (n == 0) break;  // a plain file's end, for now
    total += static_cast<size_t>(n);
    partial_.append(buf, static_cast<size_t>(n));
    size_t start = 0, nl;
    while ((nl = partial_.find('\n', start)) != std::string::npos) {
      if (auto xid = ParseXidLine(absl::string_view(partial_).substr(start, nl - start))) {
        xids.push_back(*xid);
      }
      start = nl + 1;
    }
    partial_.erase(0, start);
    if (partial_.size() > sizeof(buf)) partial_.clear();  // no newline in sight: not a log
  }
  return xids;
}

}  // namespace trainctl::worker
