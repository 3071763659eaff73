#include "worker/daemon/gpu_discovery.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace trainctl::worker {

namespace v1 = trainctl::v1;

absl::StatusOr<std::vector<v1::GpuInfo>> ParseNvidiaSmiCsv(absl::string_view csv) {
  std::vector<v1::GpuInfo> gpus;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(csv, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "index")) continue;  // header
    std::vector<absl::string_view> cols = absl::StrSplit(line, ',');
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("nvidia-smi output line ", line_no, " (", line, "): ", what));
    };
    if (cols.size() != 4) return bad("expected 4 comma-separated columns");
    for (auto& c : cols) c = absl::StripAsciiWhitespace(c);
    v1::GpuInfo gpu;
    int index = 0;
    if (!absl::SimpleAtoi(cols[0], &index) || index < 0) return bad("index is not a number");
    gpu.set_index(index);
    gpu.set_uuid(std::string(cols[1]));
    gpu.set_name(std::string(cols[2]));
    absl::string_view mem = cols[3];
    int64_t mib = 0;
    if (!absl::ConsumeSuffix(&mem, "MiB") ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(mem), &mib)) {
      return bad("memory.total is not '<n> MiB'");
    }
    gpu.set_memory_total_bytes(mib * 1024 * 1024);
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

namespace {

std::string FindInPath(const std::string& name) {
  if (name.find('/') != std::string::npos) return std::filesystem::exists(name) ? name : "";
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace

absl::StatusOr<std::vector<v1::GpuInfo>> DiscoverGpus(const std::string& nvidia_smi) {
  const std::string path = FindInPath(nvidia_smi);
  if (path.empty()) return std::vector<v1::GpuInfo>();
  const std::string command =
      absl::StrCat("'", path, "' --query-gpu=index,uuid,name,memory.total --format=csv 2>&1");
  std::FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::UnavailableError(absl::StrCat("cannot run ", path));
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  if (status != 0) {
    return absl::UnavailableError(absl::StrCat(path, " failed (status ", status, "): ", out));
  }
  return ParseNvidiaSmiCsv(out);
}

}  // namespace trainctl::worker
