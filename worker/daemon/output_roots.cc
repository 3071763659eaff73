#include "worker/daemon/output_roots.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainctl::worker {
namespace {

namespace v1 = trainctl::v1;
namespace fs = std::filesystem;

// `path` made absolute (against this process's working directory, the ranks' too), its symlinks
// and ".." resolved as far as it exists.
fs::path Resolve(const std::string& path) {
  std::error_code ec;
  fs::path resolved = fs::weakly_canonical(fs::absolute(path), ec);
  return ec ? fs::absolute(path).lexically_normal() : resolved;
}

// `path` is `root` or lies below it (both canonical).
bool IsUnder(const fs::path& path, const fs::path& root) {
  auto p = path.begin();
  for (auto r = root.begin(); r != root.end(); ++r, ++p) {
    if (r->empty()) continue;  // a trailing separator
    if (p == path.end() || *p != *r) return false;
  }
  return true;
}

}  // namespace

OutputRoots::OutputRoots(const std::vector<std::string>& roots, const std::string& fallback) {
  for (const std::string& root : roots) roots_.push_back(Resolve(root));
  if (roots_.empty()) roots_.push_back(Resolve(fallback));
}

absl::Status OutputRoots::Check(const v1::JobSpec& spec) const {
  auto check = [&](const std::string& field, const std::string& path) -> absl::Status {
    if (path.empty()) return absl::OkStatus();
    const fs::path resolved = Resolve(path);
    for (const fs::path& root : roots_) {
      if (IsUnder(resolved, root)) return absl::OkStatus();
    }
    std::vector<std::string> roots;
    for (const fs::path& root : roots_) roots.push_back(root.string());
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", path, " is outside this worker's output roots (", absl::StrJoin(roots, ", "),
        ")", resolved.string() == path ? "" : absl::StrCat(" once resolved to ", resolved.string()),
        "; see its --output_roots"));
  };
  if (absl::Status s = check("spec.output_dir", spec.output_dir()); !s.ok()) return s;
  for (int i = 0; i < spec.stages_size(); ++i) {
    const v1::PipelineStage& stage = spec.stages(i);
    // A stage without its own output_dir writes to <output_dir>/<stage name>.
    const std::string path = !stage.output_dir().empty()
                                 ? stage.output_dir()
                                 : (fs::path(spec.output_dir()) / stage.name()).string();
    if (absl::Status s = check(absl::StrCat("spec.stages[", i, "].output_dir"), path); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace trainctl::worker
