#include "coordinator/coordinator_metrics.h"

#include <filesystem>
#include <map>
#include <string>
#include <utility>

#include "common/build_info.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "coordinator/job_state.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

void AddJobCounts(metrics::Registry* registry, JobStore* store) {
  auto& jobs = registry->AddGauge("trainctl_jobs", "Jobs in each state and of each kind.");
  registry->AddCollector([&jobs, store] {
    auto counts = store->CountJobs();
    if (!counts.ok()) {
      TRAINCTL_LOG(WARNING) << "metrics: counting jobs: " << counts.status().message();
      return;
    }
    std::map<std::pair<int, int>, int64_t> by_key;
    for (const JobCount& c : *counts) by_key[{c.state, c.kind}] = c.count;
    for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
      if (s == v1::JOB_STATE_UNSPECIFIED || !v1::JobState_IsValid(s)) continue;
      for (int k = v1::JobKind_MIN; k <= v1::JobKind_MAX; ++k) {
        if (k == v1::JOB_KIND_UNSPECIFIED || !v1::JobKind_IsValid(k)) continue;
        auto it = by_key.find({s, k});
        jobs.Add({{"state", JobStateName(static_cast<v1::JobState>(s))},
                  {"kind", JobKindName(static_cast<v1::JobKind>(k))}})
            .Set(it == by_key.end() ? 0 : static_cast<double>(it->second));
      }
    }
  });
}

void AddNodes(metrics::Registry* registry, NodeSnapshot list_nodes) {
  auto& nodes = registry->AddGauge(
      "trainctl_nodes", "Worker nodes by state: live (heard from within the lease) or lost.");
  auto& slots =
      registry->AddGauge("trainctl_cluster_slots", "Slots (GPUs, or CPU slots) on live nodes.")
          .Add({});
  auto& free_slots =
      registry->AddGauge("trainctl_cluster_free_slots", "Slots on live nodes that no task uses.")
          .Add({});
  registry->AddCollector([&nodes, &slots, &free_slots, list_nodes = std::move(list_nodes)] {
    int live = 0, lost = 0;
    int64_t total = 0, free = 0;
    for (const v1::Node& node : list_nodes()) {
      // "disconnected" is within its lease: its worker may reconnect and keep its tasks.
      if (node.state() == "lost") {
        ++lost;
        continue;
      }
      ++live;
      total += node.total_slots();
      free += node.free_slots();
    }
    nodes.Add({{"state", "live"}}).Set(live);
    nodes.Add({{"state", "lost"}}).Set(lost);
    slots.Set(static_cast<double>(total));
    free_slots.Set(static_cast<double>(free));
  });
}

void AddStoreSize(metrics::Registry* registry, const std::string& db_path) {
  auto& size = registry
                   ->AddGauge("trainctl_store_bytes",
                              "Bytes of the coordinator's SQLite database (file and WAL).")
                   .Add({});
  auto& free =
      registry
          ->AddGauge(
              "trainctl_store_disk_free_bytes",
              "Bytes free (to unprivileged users) on the filesystem of the coordinator's database.")
          .Add({});
  registry->AddCollector([&size, &free, db_path] {
    std::error_code error;
    int64_t bytes = 0;
    for (const std::string& path : {db_path, db_path + "-wal"}) {
      const auto n = std::filesystem::file_size(path, error);
      if (!error) bytes += static_cast<int64_t>(n);
    }
    size.Set(static_cast<double>(bytes));
    const auto space = std::filesystem::space(std::filesystem::path(db_path).parent_path().empty()
                                                  ? std::filesystem::path(".")
                                                  : std::filesystem::path(db_path).parent_path(),
                                              error);
    if (!error) free.Set(static_cast<double>(space.available));
  });
}

}  // namespace

void AddCoordinatorCollectors(metrics::Registry* registry, JobStore* store, NodeSnapshot nodes,
                              const std::string& db_path) {
  registry->AddGauge("trainctl_build_info", "The running build (always 1).")
      .Add({{"version", BuildVersion()}, {"revision", BuildRevision()}})
      .Set(1);
  AddJobCounts(registry, store);
  if (nodes) AddNodes(registry, std::move(nodes));
  if (!db_path.empty()) AddStoreSize(registry, db_path);
}

}  // namespace trainctl
